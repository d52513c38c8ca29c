package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/nettest"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/pki"
)

// netEnv is kibotos-ctrl --dev --dev-no-node and a kibotos-node, both
// allow-listing nettest.Range, with a DNS server in a peer of their own
// that both resolve names with: the node through --resolver, ctrl through
// /etc/resolv.conf replaced by a bind mount in a mount namespace of its
// own (nothing changes on the host). Workspaces are created through the
// API and driven through the public ProcessService, with netprobe copied
// into each.
type netEnv struct {
	t                 *testing.T
	work              string
	dataDir, nodeRoot string
	addr, url         string
	ctrl, node        *faultProc
	dnsPeer           *nettest.Peer
	dns               *nettest.DNSServer
	ws                ctrlv1connect.WorkspaceServiceClient
	eg                ctrlv1connect.EgressServiceClient
	rs                ctrlv1connect.ResolverServiceClient
	sessions          ctrlv1connect.SessionServiceClient
	proc              ctrlv1connect.ProcessServiceClient
	probe             string // netprobe, built static

	mu      sync.Mutex
	n       int      // command IDs
	secrets []string // Egress passwords no log may hold
}

// netCommandWait bounds how long ctrl waits for the node (stop, delete and
// policy updates); netNodeGrace is how long a silent node stays trusted.
const (
	netCommandWait = 10 * time.Second
	netNodeGrace   = 12 * time.Second
)

// newNetEnv starts ctrl and the node and waits until the node registered
// and the network policy capability is advertised.
func newNetEnv(t *testing.T) *netEnv {
	t.Helper()
	requireRoot(t)
	nettest.RequireTools(t, "ip", "danted", "socat", "unshare", "mount")
	e := &netEnv{t: t, work: t.TempDir()}
	e.dataDir, e.nodeRoot = filepath.Join(e.work, "d"), filepath.Join(e.work, "n")
	for _, d := range []string{e.dataDir, e.nodeRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Runs last: executions outlive the node.
	t.Cleanup(func() {
		if err := sandbox.Cleanup(e.nodeRoot); err != nil {
			t.Logf("sandbox.Cleanup: %v", err)
		}
	})
	removeBackstop(t, e.nodeRoot)
	e.dnsPeer = nettest.NewPeer(t)
	var err error
	if e.dns, err = e.dnsPeer.DNS(); err != nil {
		t.Fatal(err)
	}
	resolvConf := filepath.Join(e.work, "resolv.conf")
	if err := os.WriteFile(resolvConf, fmt.Appendf(nil, "nameserver %s\noptions ndots:1 timeout:2 attempts:2\n", e.dns.Addr.Addr()), 0o644); err != nil {
		t.Fatal(err)
	}
	e.probe = buildStatic(t, "../../internal/nettest/netprobe", "netprobe")

	e.addr = freePort(t)
	e.url = "https://" + e.addr
	ctrlLog, err := os.Create(filepath.Join(e.work, "ctrl.log"))
	if err != nil {
		t.Fatal(err)
	}
	nodeLog, err := os.Create(filepath.Join(e.work, "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	e.ctrl = &faultProc{name: "kibotos-ctrl", path: "unshare", logf: ctrlLog, ready: "kibotos-ctrl is serving on ",
		args: []string{"--mount", "--propagation", "private", "sh", "-c", `mount --bind "$0" /etc/resolv.conf && exec "$@"`, resolvConf,
			filepath.Join(binDir, "kibotos-ctrl"), "--dev", "--dev-no-node", "--data-dir", e.dataDir, "--listen", e.addr,
			"--command-wait", netCommandWait.String(), "--node-grace", netNodeGrace.String(),
			"--allow-endpoint-ranges", nettest.Range.String(), "--log-level", "debug"}}
	t.Cleanup(e.ctrl.kill)
	if err := e.ctrl.start(); err != nil {
		t.Fatal(err)
	}
	paths := pki.DevPathsIn(e.dataDir)
	nodeCert, nodeKey := filepath.Join(e.work, "node.pem"), filepath.Join(e.work, "node-key.pem")
	if err := pki.IssueClient(paths.CA, paths.CAKey, "net-node", pki.RoleNode, time.Hour, nodeCert, nodeKey); err != nil {
		t.Fatal(err)
	}
	e.node = &faultProc{name: "kibotos-node", path: nodeBinary(t), logf: nodeLog, args: []string{
		"--ctrl", e.url, "--ca", paths.CA, "--cert", nodeCert, "--key", nodeKey,
		"--state-dir", e.nodeRoot, "--guest-binary", filepath.Join(binDir, "kibotos-guest"),
		"--allow-endpoint-ranges", nettest.Range.String(), "--resolver", e.dns.Addr.String(), "--log-level", "debug"}}
	t.Cleanup(e.node.kill)
	if err := e.node.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{ctrlLog.Name(), nodeLog.Name()} {
				b, _ := os.ReadFile(f)
				if len(b) > 16000 {
					b = b[len(b)-16000:]
				}
				t.Logf("tail of %s:\n%s", filepath.Base(f), b)
			}
		}
	})

	tlsc, err := pki.ClientConfig(paths.CA, paths.Operator, paths.OperatorKey)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc, ReadIdleTimeout: 5 * time.Second, PingTimeout: 5 * time.Second}}
	e.ws = ctrlv1connect.NewWorkspaceServiceClient(hc, e.url)
	e.eg = ctrlv1connect.NewEgressServiceClient(hc, e.url)
	e.rs = ctrlv1connect.NewResolverServiceClient(hc, e.url)
	e.sessions = ctrlv1connect.NewSessionServiceClient(hc, e.url)
	ptls, err := pki.ClientConfig(paths.CA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	e.proc = ctrlv1connect.NewProcessServiceClient(&http.Client{Transport: &http2.Transport{TLSClientConfig: ptls}}, e.url)

	info := ctrlv1connect.NewServerInfoServiceClient(hc, e.url)
	var caps []string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		res, err := info.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err == nil {
			caps = res.Msg.GetCapabilities()
			if slices.Contains(caps, "workspace.exec") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node never registered (last error %v, capabilities %v)", err, caps)
		}
	}
	for _, c := range []string{"workspace.network_policy", "egress.socks5", "egress.socks5.tls", "egress.udp", "resolver.udp", "resolver.tcp"} {
		if !slices.Contains(caps, c) {
			t.Fatalf("capability %s is not advertised with the node registered: %v", c, caps)
		}
	}
	return e
}

// cmdID returns a fresh command ID.
func (e *netEnv) cmdID(what string) *ctrlv1.CommandMetadata {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	return md(fmt.Sprintf("net-%s-%d", what, e.n))
}

// logs returns ctrl's and the node's logs so far.
func (e *netEnv) logs() (ctrlLog, nodeLog string) {
	c, _ := os.ReadFile(e.ctrl.logf.Name())
	n, _ := os.ReadFile(e.node.logf.Name())
	return string(c), string(n)
}

// netWS is a workspace of a netEnv with an EXEC token and netprobe at
// /tmp/netprobe.
type netWS struct {
	*dpEnv
	env *netEnv
	tok string
}

// workspace creates a workspace with policy p (nil: none, mode NONE) and
// waits until it is AVAILABLE and READY with netprobe installed.
func (e *netEnv) workspace(p *ctrlv1.NetworkPolicy) *netWS {
	e.t.Helper()
	cr, err := e.ws.CreateWorkspace(e.t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: e.cmdID("create"), Resources: &ctrlv1.Resources{MemoryMib: 128, CpuMillis: 500}, WritableLayerCapacityBytes: 64 << 20,
		NetworkPolicy: p,
	}))
	if err != nil {
		e.t.Fatalf("CreateWorkspace: %v", err)
	}
	w := &netWS{env: e, dpEnv: &dpEnv{t: e.t, dataDir: e.dataDir, nodeRoot: e.nodeRoot, p: &ctrlProc{url: e.url, stderr: &lockedBuffer{}},
		ws: e.ws, sessions: e.sessions, proc: e.proc, id: cr.Msg.GetWorkspace().GetWorkspaceId()}}
	w.waitReady()
	w.tok = w.token()
	w.install(w.tok, e.probe, "/tmp/netprobe")
	return w
}

// waitExec waits until a process can be started in the workspace again
// (after the node restarted: its data tunnel comes back).
func (w *netWS) waitExec() {
	w.t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r, err := w.run(w.tok, "true")
		if err == nil && r.exit.GetExitCode() == 0 {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no process starts in the workspace: %v %v", r.exit, err)
		}
	}
}

// probe runs netprobe in the workspace and returns its stdout (and its exit
// code: 1 means the probe's operation failed, which some checks expect).
func (w *netWS) probe(args ...string) (string, int32) {
	w.t.Helper()
	r, err := w.run(w.tok, append([]string{"/tmp/netprobe"}, args...)...)
	if err != nil {
		w.t.Fatalf("netprobe %q: %v", args, err)
	}
	if c := r.exit.GetExitCode(); c > 1 || r.exit.GetSignal() != 0 {
		w.t.Fatalf("netprobe %q: %v; stdout %q stderr %q", args, r.exit, r.stdout, r.stderr)
	}
	return r.stdout, r.exit.GetExitCode()
}

// dial tries one TCP connect from the workspace and returns its class (ok,
// refused, timeout, unreachable, reset, error).
func (w *netWS) dial(addr string) string {
	w.t.Helper()
	out, _ := w.probe("dial", addr)
	f := strings.Fields(out)
	if len(f) != 3 || f[0] != addr {
		w.t.Fatalf("netprobe dial %s: %q", addr, out)
	}
	return f[1]
}

// get fetches url from the workspace: the body, or "error CLASS ...".
func (w *netWS) get(url string) string {
	w.t.Helper()
	out, _ := w.probe("get", url)
	return out
}

// bgProc is a process running in a workspace whose output is watched.
type bgProc struct {
	mu      sync.Mutex
	out     string
	changed chan struct{}
	done    chan struct{}
	exit    *ctrlv1.ProcessExited
	err     error
}

// start starts argv in the workspace and follows its output.
func (w *netWS) start(argv ...string) *bgProc {
	w.t.Helper()
	ctx := w.t.Context()
	st, err := w.proc.StartProcess(ctx, bearer(&ctrlv1.StartProcessRequest{WorkspaceId: w.id, Argv: argv}, w.tok))
	if err != nil {
		w.t.Fatalf("start %q: %v", argv, err)
	}
	b := &bgProc{changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		s, err := w.proc.ProcessEvents(ctx, bearer(&ctrlv1.ProcessEventsRequest{WorkspaceId: w.id, ProcessId: st.Msg.GetProcessId()}, w.tok))
		if err != nil {
			b.err = err
			return
		}
		defer s.Close()
		for s.Receive() {
			if o := s.Msg().GetOutput(); o != nil && o.GetStream() == ctrlv1.ProcessStream_PROCESS_STREAM_STDOUT {
				b.mu.Lock()
				b.out += string(o.GetData())
				close(b.changed)
				b.changed = make(chan struct{})
				b.mu.Unlock()
			}
			if x := s.Msg().GetExited(); x != nil {
				b.exit = x
			}
		}
		b.err = s.Err()
	}()
	return b
}

// output is the process's stdout so far.
func (b *bgProc) output() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out
}

// waitFor waits until the output contains s, and returns when it first saw it.
func (b *bgProc) waitFor(t *testing.T, s string, bound time.Duration) time.Time {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		b.mu.Lock()
		out, ch := b.out, b.changed
		b.mu.Unlock()
		if strings.Contains(out, s) {
			return time.Now()
		}
		select {
		case <-ch:
		case <-b.done:
			if strings.Contains(b.output(), s) {
				return time.Now()
			}
			t.Fatalf("the process ended (%v, %v) without printing %q: %q", b.exit, b.err, s, b.output())
		case <-timer.C:
			t.Fatalf("%q not printed within %s: %q", s, bound, b.output())
		}
	}
}

// exited reports whether the process has ended.
func (b *bgProc) exited() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// Policies.

// dest is a destination: cidr and a port range (none: all ports; one:
// that port).
func dest(cidr string, ports ...uint32) *ctrlv1.Destination {
	d := &ctrlv1.Destination{Cidr: cidr}
	switch len(ports) {
	case 0:
	case 1:
		d.PortMin, d.PortMax = ports[0], ports[0]
	default:
		d.PortMin, d.PortMax = ports[0], ports[1]
	}
	return d
}

// route is an EgressRoute.
func route(egressID string, ds ...*ctrlv1.Destination) *ctrlv1.EgressRoute {
	return &ctrlv1.EgressRoute{EgressId: egressID, Destinations: ds}
}

// publicPolicy is a PUBLIC_INTERNET policy.
func publicPolicy(allow, deny []*ctrlv1.Destination, routes ...*ctrlv1.EgressRoute) *ctrlv1.NetworkPolicy {
	return &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET, Allow: allow, Deny: deny, Egresses: routes}
}

func ptr[T any](v T) *T { return &v }

// setPolicy sends UpdateWorkspaceNetworkPolicy (expected_revision 0).
func (e *netEnv) setPolicy(wsID string, p *ctrlv1.NetworkPolicy, drain *uint32) (*ctrlv1.Workspace, error) {
	res, err := e.ws.UpdateWorkspaceNetworkPolicy(e.t.Context(), connect.NewRequest(&ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
		Metadata: e.cmdID("policy"), WorkspaceId: wsID, NetworkPolicy: p, DrainSeconds: drain}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetWorkspace(), nil
}

// mustSetPolicy is setPolicy that fails the test unless the node applied
// the policy when the call returns.
func (e *netEnv) mustSetPolicy(wsID string, p *ctrlv1.NetworkPolicy, drain *uint32) *ctrlv1.Workspace {
	e.t.Helper()
	w, err := e.setPolicy(wsID, p, drain)
	if err != nil {
		e.t.Fatalf("UpdateWorkspaceNetworkPolicy: %v", err)
	}
	st := w.GetNetworkPolicyStatus()
	if st.GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED || st.GetAppliedRevision() != w.GetNetworkPolicy().GetRevision() {
		e.t.Fatalf("UpdateWorkspaceNetworkPolicy returned before the node applied it: policy revision %d, status %v",
			w.GetNetworkPolicy().GetRevision(), st)
	}
	return w
}

// getWS reads a workspace.
func (e *netEnv) getWS(id string) *ctrlv1.Workspace {
	e.t.Helper()
	r, err := e.ws.GetWorkspace(e.t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Msg.GetWorkspace()
}

// waitWS polls a workspace until cond holds.
func (e *netEnv) waitWS(id string, bound time.Duration, what string, cond func(*ctrlv1.Workspace) bool) *ctrlv1.Workspace {
	e.t.Helper()
	deadline := time.Now().Add(bound)
	for {
		w := e.getWS(id)
		if cond(w) {
			return w
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("workspace %s: %s not reached within %s: state %v, policy revision %d, status %v", id, what, bound,
				w.GetState(), w.GetNetworkPolicy().GetRevision(), w.GetNetworkPolicyStatus())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// egressApplied reports whether the status says new connections through
// egressID use revision rev.
func egressApplied(w *ctrlv1.Workspace, egressID string, rev uint64) bool {
	for _, s := range w.GetNetworkPolicyStatus().GetEgresses() {
		if s.GetEgressId() == egressID {
			return s.GetAppliedRevision() == rev
		}
	}
	return false
}

// Egresses and Resolvers.

// socks5Spec is the spec of an Egress to d (with its credentials when it
// has them).
func socks5Spec(d *nettest.Dante, udp bool) *ctrlv1.EgressSpec {
	return &ctrlv1.EgressSpec{UdpEnabled: udp, Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{
		Address: d.Addr.String(), Username: d.User, Password: d.Password}}}
}

func (e *netEnv) createEgress(spec *ctrlv1.EgressSpec) (*ctrlv1.Egress, error) {
	r, err := e.eg.CreateEgress(e.t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: e.cmdID("egress"), Spec: spec}))
	if err != nil {
		return nil, err
	}
	return r.Msg.GetEgress(), nil
}

func (e *netEnv) mustEgress(spec *ctrlv1.EgressSpec) *ctrlv1.Egress {
	e.t.Helper()
	eg, err := e.createEgress(spec)
	if err != nil {
		e.t.Fatalf("CreateEgress: %v", err)
	}
	return eg
}

func (e *netEnv) updateEgress(eg *ctrlv1.Egress, spec *ctrlv1.EgressSpec, drain *uint32) *ctrlv1.Egress {
	e.t.Helper()
	r, err := e.eg.UpdateEgress(e.t.Context(), connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: e.cmdID("egress-update"),
		EgressId: eg.GetEgressId(), ExpectedRevision: eg.GetRevision(), Spec: spec, DrainSeconds: drain}))
	if err != nil {
		e.t.Fatalf("UpdateEgress: %v", err)
	}
	return r.Msg.GetEgress()
}

func (e *netEnv) mustResolver(spec *ctrlv1.ResolverSpec) *ctrlv1.Resolver {
	e.t.Helper()
	r, err := e.rs.CreateResolver(e.t.Context(), connect.NewRequest(&ctrlv1.CreateResolverRequest{Metadata: e.cmdID("resolver"), Spec: spec}))
	if err != nil {
		e.t.Fatalf("CreateResolver: %v", err)
	}
	return r.Msg.GetResolver()
}

// detailOf returns the ErrorDetail of a Connect error.
func detailOf(err error) *ctrlv1.ErrorDetail {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ed, ok := v.(*ctrlv1.ErrorDetail); ok {
				return ed
			}
		}
	}
	return nil
}

// withTimeout is a context bounded by d.
func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// must fails the test on err.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// runIn runs argv as a command and returns its combined output.
func runIn(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%q: %v: %s", argv, err, out)
	}
	return string(out)
}
