//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/nettest"
	"github.com/kibotos/kibotos/internal/pki"
)

// binaries are the programs of the run, built static from the tree.
type binaries struct {
	ctrl, node, guest, probe string
}

// build builds kibotos-ctrl, kibotos-node, kibotos-guest and netprobe into
// dir (CGO_ENABLED=0).
func build(ctx context.Context, modRoot, dir string) (binaries, error) {
	pkgs := []string{"./cmd/kibotos-ctrl", "./cmd/kibotos-node", "./cmd/kibotos-guest", "./internal/nettest/netprobe"}
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-trimpath", "-o", dir + "/"}, pkgs...)...)
	cmd.Dir = modRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return binaries{}, fmt.Errorf("go build %v: %w\n%s", pkgs, err, out.String())
	}
	j := func(n string) string { return filepath.Join(dir, n) }
	return binaries{ctrl: j("kibotos-ctrl"), node: j("kibotos-node"), guest: j("kibotos-guest"), probe: j("netprobe")}, nil
}

// nodeProc is the kibotos-node of the run, in a process group of its own.
type nodeProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// startNode starts kibotos-node against srv with a node certificate the
// dev CA issues.
func startNode(srv *benchkit.DevServer, bin binaries, work string) (*nodeProc, error) {
	cert, key := filepath.Join(work, "node.pem"), filepath.Join(work, "node-key.pem")
	if err := pki.IssueClient(srv.PKI.CA, srv.PKI.CAKey, "netbench-node", pki.RoleNode, 24*time.Hour, cert, key); err != nil {
		return nil, err
	}
	n := &nodeProc{done: make(chan struct{}), log: filepath.Join(work, "node.log")}
	logf, err := os.Create(n.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	n.cmd = exec.Command(bin.node, "--ctrl", srv.URL, "--ca", srv.PKI.CA, "--cert", cert, "--key", key,
		"--state-dir", filepath.Join(work, "node"), "--guest-binary", bin.guest,
		"--allow-endpoint-ranges", nettest.Range.String())
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := n.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { n.cmd.Wait(); close(n.done) }()
	return n, nil
}

func (n *nodeProc) pid() int { return n.cmd.Process.Pid }

// stop SIGTERMs the node and waits (SIGKILL after 20 s).
func (n *nodeProc) stop() error {
	select {
	case <-n.done:
		return nil
	default:
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
		return nil
	case <-time.After(20 * time.Second):
		n.cmd.Process.Kill()
		<-n.done
		return errors.New("kibotos-node did not stop within 20 s of SIGTERM; killed")
	}
}

// procCPU is the CPU time (user and system, all threads) the process pid
// has used so far, from /proc/PID/stat (clock ticks of 1/100 s).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The fields after the command's closing parenthesis: state is the
	// 3rd of the line, utime and stime the 14th and 15th.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// procStatus reads fields of /proc/PID/status (kB values in bytes).
func procStatus(pid int) map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return out
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n <<= 10
		}
		out[k] = n
	}
	return out
}

// api is the operator and data-plane clients of the run.
type api struct {
	ws    ctrlv1connect.WorkspaceServiceClient
	eg    ctrlv1connect.EgressServiceClient
	sess  ctrlv1connect.SessionServiceClient
	info  ctrlv1connect.ServerInfoServiceClient
	proc  ctrlv1connect.ProcessServiceClient
	files ctrlv1connect.FileServiceClient
	runID string
	seq   atomic.Int64
}

func newAPI(srv *benchkit.DevServer, runID string) (*api, error) {
	hc, _, err := benchkit.NewHTTPClient(srv.PKI)
	if err != nil {
		return nil, err
	}
	tlsc, err := pki.ClientConfig(srv.PKI.CA, "", "")
	if err != nil {
		return nil, err
	}
	dp := &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}}
	return &api{
		ws: ctrlv1connect.NewWorkspaceServiceClient(hc, srv.URL), eg: ctrlv1connect.NewEgressServiceClient(hc, srv.URL),
		sess: ctrlv1connect.NewSessionServiceClient(hc, srv.URL), info: ctrlv1connect.NewServerInfoServiceClient(hc, srv.URL),
		proc: ctrlv1connect.NewProcessServiceClient(dp, srv.URL), files: ctrlv1connect.NewFileServiceClient(dp, srv.URL),
		runID: runID,
	}, nil
}

func (a *api) md(kind string) *ctrlv1.CommandMetadata {
	return &ctrlv1.CommandMetadata{CommandId: fmt.Sprintf("netbench-%s-%s-%d", a.runID, kind, a.seq.Add(1))}
}

// waitCapabilities waits until every capability is advertised.
func (a *api) waitCapabilities(ctx context.Context, timeout time.Duration, caps ...string) error {
	deadline := time.Now().Add(timeout)
	for {
		res, err := a.info.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		missing := caps
		if err == nil {
			missing = slices.DeleteFunc(slices.Clone(caps), func(c string) bool { return slices.Contains(res.Msg.GetCapabilities(), c) })
			if len(missing) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("capabilities %v not advertised within %v (last error %v)", missing, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// workspace is the benchmark's workspace, with a token and netprobe.
type workspace struct {
	a   *api
	id  string
	tok string
}

// createWorkspace creates a workspace with policy p, waits until it is
// AVAILABLE and READY, and copies netprobe to /tmp/netprobe with the
// FileService.
func (a *api) createWorkspace(ctx context.Context, memMiB, cpuMillis uint32, p *ctrlv1.NetworkPolicy, probe string) (*workspace, error) {
	cr, err := a.ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Metadata: a.md("create"),
		Resources: &ctrlv1.Resources{MemoryMib: memMiB, CpuMillis: cpuMillis}, WritableLayerCapacityBytes: 64 << 20, NetworkPolicy: p}))
	if err != nil {
		return nil, fmt.Errorf("CreateWorkspace: %w", err)
	}
	w := &workspace{a: a, id: cr.Msg.GetWorkspace().GetWorkspaceId()}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		g, err := a.ws.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: w.id}))
		if err != nil {
			return w, err
		}
		ws := g.Msg.GetWorkspace()
		if ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE && ws.GetGuestObservation().GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_READY {
			break
		}
		if ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED || time.Now().After(deadline) {
			return w, fmt.Errorf("workspace %s: %v (failure %v)", w.id, ws.GetState(), ws.GetFailure())
		}
	}
	s, err := a.sess.CreateDataPlaneSession(ctx, connect.NewRequest(&ctrlv1.CreateDataPlaneSessionRequest{Metadata: a.md("session"), WorkspaceId: w.id,
		Scopes: []ctrlv1.DataPlaneScope{ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC, ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM}}))
	if err != nil {
		return w, fmt.Errorf("CreateDataPlaneSession: %w", err)
	}
	w.tok = s.Msg.GetSession().GetToken()
	data, err := os.ReadFile(probe)
	if err != nil {
		return w, err
	}
	up := a.files.WriteFile(ctx)
	up.RequestHeader().Set("Authorization", "Bearer "+w.tok)
	if err := up.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Header{Header: &ctrlv1.WriteFileHeader{WorkspaceId: w.id, Path: "/tmp/netprobe", Mode: 0o755}}}); err != nil && !errors.Is(err, io.EOF) {
		return w, err
	}
	for off := 0; off < len(data); off += 256 << 10 {
		if err := up.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Data{Data: data[off:min(len(data), off+256<<10)]}}); err != nil {
			break // the answer says why
		}
	}
	if _, err := up.CloseAndReceive(); err != nil {
		return w, fmt.Errorf("WriteFile netprobe: %w", err)
	}
	return w, nil
}

// deleteWorkspace deletes the workspace (retrying while the server says
// unavailable).
func (a *api) deleteWorkspace(ctx context.Context, id string) error {
	var last error
	for range 5 {
		g, err := a.ws.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			return err
		}
		if g.Msg.GetWorkspace().GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			return nil
		}
		_, last = a.ws.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: a.md("delete"), WorkspaceId: id,
			ExpectedExpirationRevision: g.Msg.GetWorkspace().GetExpiration().GetRevision()}))
		if last == nil {
			return nil
		}
		time.Sleep(300 * time.Millisecond)
	}
	return last
}

// setPolicy updates the workspace's policy (drain 0) and returns when the
// call returned.
func (a *api) setPolicy(ctx context.Context, id string, p *ctrlv1.NetworkPolicy) (*ctrlv1.Workspace, error) {
	r, err := a.ws.UpdateWorkspaceNetworkPolicy(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
		Metadata: a.md("policy"), WorkspaceId: id, NetworkPolicy: p, DrainSeconds: new(uint32)}))
	if err != nil {
		return nil, fmt.Errorf("UpdateWorkspaceNetworkPolicy: %w", err)
	}
	st := r.Msg.GetWorkspace().GetNetworkPolicyStatus()
	if st.GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED {
		return nil, fmt.Errorf("UpdateWorkspaceNetworkPolicy returned with the policy %v", st)
	}
	return r.Msg.GetWorkspace(), nil
}

// proc is a process in the workspace whose stdout is followed.
type proc struct {
	w       *workspace
	id      string
	mu      sync.Mutex
	out     bytes.Buffer
	changed chan struct{}
	done    chan struct{}
	exit    *ctrlv1.ProcessExited
	err     error
}

// start starts argv in the workspace and follows its output.
func (w *workspace) start(ctx context.Context, argv ...string) (*proc, error) {
	req := connect.NewRequest(&ctrlv1.StartProcessRequest{WorkspaceId: w.id, Argv: argv})
	req.Header().Set("Authorization", "Bearer "+w.tok)
	st, err := w.a.proc.StartProcess(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("StartProcess %q: %w", argv, err)
	}
	ev := connect.NewRequest(&ctrlv1.ProcessEventsRequest{WorkspaceId: w.id, ProcessId: st.Msg.GetProcessId()})
	ev.Header().Set("Authorization", "Bearer "+w.tok)
	s, err := w.a.proc.ProcessEvents(ctx, ev)
	if err != nil {
		return nil, fmt.Errorf("ProcessEvents: %w", err)
	}
	p := &proc{w: w, id: st.Msg.GetProcessId(), changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer s.Close()
		for s.Receive() {
			if o := s.Msg().GetOutput(); o != nil && o.GetStream() == ctrlv1.ProcessStream_PROCESS_STREAM_STDOUT {
				p.mu.Lock()
				p.out.Write(o.GetData())
				close(p.changed)
				p.changed = make(chan struct{})
				p.mu.Unlock()
			}
			if x := s.Msg().GetExited(); x != nil {
				p.exit = x
			}
		}
		p.err = s.Err()
	}()
	return p, nil
}

// signal sends sig to the process.
func (p *proc) signal(ctx context.Context, sig syscall.Signal) error {
	req := connect.NewRequest(&ctrlv1.SignalProcessRequest{WorkspaceId: p.w.id, ProcessId: p.id, Signal: int32(sig)})
	req.Header().Set("Authorization", "Bearer "+p.w.tok)
	_, err := p.w.a.proc.SignalProcess(ctx, req)
	return err
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// waitFor waits until the output contains s.
func (p *proc) waitFor(ctx context.Context, s string) error {
	for {
		p.mu.Lock()
		out, ch := p.out.String(), p.changed
		p.mu.Unlock()
		if strings.Contains(out, s) {
			return nil
		}
		select {
		case <-ch:
		case <-p.done:
			if strings.Contains(p.output(), s) {
				return nil
			}
			return fmt.Errorf("the process ended (%v, %v) without printing %q: %q", p.exit, p.err, s, p.output())
		case <-ctx.Done():
			return fmt.Errorf("%q not printed: %w (output %q)", s, ctx.Err(), p.output())
		}
	}
}

// wait waits for the exit and returns stdout; a non-zero exit is an error.
func (p *proc) wait(ctx context.Context) (string, error) {
	select {
	case <-p.done:
	case <-ctx.Done():
		return p.output(), ctx.Err()
	}
	if p.err != nil {
		return p.output(), p.err
	}
	if p.exit.GetExitCode() != 0 || p.exit.GetSignal() != 0 {
		return p.output(), fmt.Errorf("exited %v: %q", p.exit, p.output())
	}
	return p.output(), nil
}

// run runs argv in the workspace to its end (bounded by timeout).
func (w *workspace) run(ctx context.Context, timeout time.Duration, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p, err := w.start(ctx, argv...)
	if err != nil {
		return "", err
	}
	return p.wait(ctx)
}
