package e2e

import (
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
)

// pgProxy is a loopback TCP proxy in front of PostgreSQL that the test can
// cut: refuse (every connection closed, the port closed: a database down
// or restarting) or freeze (connections kept, nothing forwarded, new ones
// accepted and never answered: a network partition or a hung server).
type pgProxy struct {
	t      *testing.T
	addr   string
	target string

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
	frozen chan struct{} // closed while forwarding
}

func newPGProxy(t *testing.T, target string) *pgProxy {
	p := &pgProxy{t: t, target: target, conns: map[net.Conn]bool{}, frozen: make(chan struct{})}
	close(p.frozen)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() { p.refuse() })
	return p
}

func (p *pgProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
}

func (p *pgProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *pgProxy) forward(c net.Conn) {
	if !p.track(c) {
		c.Close()
		return
	}
	p.mu.Lock()
	gate := p.frozen
	p.mu.Unlock()
	<-gate // a frozen proxy accepts and never answers
	s, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(s) {
		c.Close()
		return
	}
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				gate := p.frozen
				p.mu.Unlock()
				<-gate
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
	}
	go pipe(s, c)
	pipe(c, s)
}

// closeAll closes every connection the proxy holds.
func (p *pgProxy) closeAll() {
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// refuse closes every connection and the listening port.
func (p *pgProxy) refuse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.closeAll()
}

// freeze stops forwarding: bytes are accepted and held, nothing answers.
func (p *pgProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = make(chan struct{})
}

// restore forwards again, on the same port; connections of before the cut
// are closed (they are the dead ones of a restarted database).
func (p *pgProxy) restore() {
	p.mu.Lock()
	p.closeAll()
	select {
	case <-p.frozen:
	default:
		close(p.frozen)
	}
	ln := p.ln
	p.mu.Unlock()
	if ln != nil {
		return
	}
	var err error
	for range 50 { // the port was ours a moment ago
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("proxy: listen again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

// TestReplicaLosesPostgres runs kibotos-ctrl on PostgreSQL through a proxy
// the test cuts: while the database is unreachable, writes (CreateEgress,
// CreateWorkspace) and reads (GetEgress, ListWorkspaces,
// GetWorkspaceCommand, ListNodes) answer unavailable, retryable, within a
// bound, naming neither the URL nor its password; once it is back, the same ctrl process serves again and each
// command ID sent during the outage executes exactly once. A database
// refusing connections and a frozen one (connections kept, nothing
// answered) are both tried.
func TestReplicaLosesPostgres(t *testing.T) {
	schemaURL := pgSchema(t)
	u, err := url.Parse(schemaURL)
	if err != nil || u.Scheme == "" {
		t.Skipf("KIBOTOS_TEST_POSTGRES_URL is not a URL (%v): the test rewrites its host", err)
	}
	proxy := newPGProxy(t, u.Host)
	u.Host = proxy.addr
	// The server trusts loopback; the password is there to prove it never
	// leaks into an answer or a log line.
	const password = "pgloss-not-a-secret-8d1f"
	u.User = url.UserPassword(u.User.Username(), password)
	e := newSoakEnv(t, 1, "--dev-no-node", "--store", u.String(), "--log-level", "info", "--allow-endpoint-ranges", "127.0.0.0/8")
	e.hc.Timeout = 30 * time.Second
	e.startFakeNode()
	e.waitCapability(0, capability.WorkspaceCreate)
	eg := ctrlv1connect.NewEgressServiceClient(e.hc, e.url(0))
	ws := e.ws(0)
	nodes := ctrlv1connect.NewNodeServiceClient(e.hc, e.url(0))
	health := grpchealth.NewClient(e.hc, e.url(0))

	egress := func(id string) (*ctrlv1.Egress, error) {
		r, err := eg.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{
			Metadata: md(id),
			Spec:     &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "127.0.0.1:11080"}}},
		}))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetEgress(), nil
	}
	workspace := func(id string) (*ctrlv1.Workspace, error) {
		r, err := ws.CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
			Metadata: md(id), TemplateId: soakTemplate,
			Resources: &ctrlv1.Resources{MemoryMib: 16, CpuMillis: 100}, WritableLayerCapacityBytes: 64 << 20}))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetWorkspace(), nil
	}
	// A Workspace AVAILABLE before the cut: the reconciler is past its
	// start (a reconciler whose first load fails stops for good: see the
	// report of issue 15).
	t.Logf("before the cut: a Workspace AVAILABLE in %v", e.createOne(0, "pgloss-before"))
	first, err := egress("pgloss-egress-0")
	if err != nil {
		t.Fatalf("CreateEgress before the cut: %v", err)
	}

	// unavailable checks that call answers unavailable, retryable, without
	// the URL or its password, within bound; it returns how long it took.
	const bound = 12 * time.Second
	unavailable := func(what string, call func() error) time.Duration {
		t.Helper()
		start := time.Now()
		err := call()
		took := time.Since(start)
		if connect.CodeOf(err) != connect.CodeUnavailable {
			t.Errorf("%s during the outage: %v (code %v), want unavailable", what, err, connect.CodeOf(err))
			return took
		}
		d, ok := kibotos.Detail(err)
		if !ok || !d.GetRetryable() || d.GetReason() == ctrlv1.FailureReason_FAILURE_REASON_INTERNAL {
			t.Errorf("%s: detail %v, want retryable with a reason", what, d)
		}
		for _, leak := range []string{password, proxy.addr, "postgres://", "user="} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("%s: %q contains %q", what, err, leak)
			}
		}
		if took > bound {
			t.Errorf("%s answered after %v, want at most %v", what, took, bound)
		}
		t.Logf("%s: %v in %v", what, d.GetMessage(), took.Round(time.Millisecond))
		return took
	}
	// untilServed resends call (the same command ID) until it succeeds.
	untilServed := func(what string, call func() error) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			err := call()
			if err == nil {
				return time.Since(start)
			}
			if connect.CodeOf(err) != connect.CodeUnavailable || time.Since(start) > time.Minute {
				t.Fatalf("%s after the database came back: %v", what, err)
			}
			t.Logf("%s %v after the restore: %v", what, time.Since(start).Round(time.Millisecond), err)
			time.Sleep(100 * time.Millisecond)
		}
	}

	var egressIDs []string
	var workspaceIDs []string
	for round, cut := range []struct {
		name string
		do   func()
	}{
		{"refused", proxy.refuse},
		{"frozen", proxy.freeze},
	} {
		t.Logf("database %s", cut.name)
		cutAt := time.Now()
		cut.do()
		if cut.name == "frozen" {
			time.Sleep(1500 * time.Millisecond) // pooled connections now idle > 1 s: pinged at their next use
		}
		// Unable to read its store for 3 s, the replica reports
		// NOT_SERVING, so that a balancer routes around it.
		notServing := waitHealth(t, health, grpchealth.StatusNotServing, cutAt, 15*time.Second)
		t.Logf("health NOT_SERVING %v after the cut", notServing.Round(time.Millisecond))
		eid, wid := "pgloss-egress-"+cut.name, "pgloss-ws-"+cut.name
		unavailable("CreateEgress", func() error { _, err := egress(eid); return err })
		unavailable("CreateWorkspace", func() error { _, err := workspace(wid); return err })
		unavailable("GetEgress", func() error {
			_, err := eg.GetEgress(t.Context(), connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: first.GetEgressId()}))
			return err
		})
		unavailable("ListWorkspaces", func() error {
			_, err := ws.ListWorkspaces(t.Context(), connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
			return err
		})
		unavailable("GetWorkspaceCommand", func() error {
			_, err := ws.GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: "failover-pgloss-before"}))
			return err
		})
		unavailable("ListNodes", func() error {
			_, err := nodes.ListNodes(t.Context(), connect.NewRequest(&ctrlv1.ListNodesRequest{}))
			return err
		})
		// The same command ID again, still during the outage.
		unavailable("CreateEgress resent", func() error { _, err := egress(eid); return err })

		restored := time.Now()
		proxy.restore()
		serving := waitHealth(t, health, grpchealth.StatusServing, restored, 10*time.Second)
		t.Logf("health SERVING %v after the restore", serving.Round(time.Millisecond))
		var got *ctrlv1.Egress
		took := untilServed("CreateEgress", func() (err error) { got, err = egress(eid); return err })
		t.Logf("database back: CreateEgress served %v after the restore", took.Round(time.Millisecond))
		var w *ctrlv1.Workspace
		untilServed("CreateWorkspace", func() (err error) { w, err = workspace(wid); return err })
		again, err := egress(eid)
		if err != nil || again.GetEgressId() != got.GetEgressId() {
			t.Fatalf("CreateEgress %s resent: %v, %v; want the replay of %s", eid, again, err, got.GetEgressId())
		}
		w2, err := workspace(wid)
		if err != nil || w2.GetWorkspaceId() != w.GetWorkspaceId() {
			t.Fatalf("CreateWorkspace %s resent: %v, %v; want the replay of %s", wid, w2, err, w.GetWorkspaceId())
		}
		egressIDs = append(egressIDs, got.GetEgressId())
		workspaceIDs = append(workspaceIDs, w.GetWorkspaceId())
		t.Logf("round %d (%s): served again %v after the restore", round, cut.name, time.Since(restored).Round(time.Millisecond))
	}

	// Exactly once: one Egress per command ID (plus the first), one
	// Workspace per command ID.
	le, err := eg.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{PageSize: 100}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(le.Msg.GetEgresses()); n != 1+len(egressIDs) {
		t.Errorf("%d Egresses, want %d: %v", n, 1+len(egressIDs), le.Msg.GetEgresses())
	}
	lw, err := ws.ListWorkspaces(t.Context(), connect.NewRequest(&ctrlv1.ListWorkspacesRequest{PageSize: 100}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(lw.Msg.GetWorkspaces()); n != 1+len(workspaceIDs) {
		t.Errorf("%d Workspaces, want %d", n, 1+len(workspaceIDs))
	}
	// The Workspaces created after the outage become AVAILABLE: the node's
	// stream and the reconciler went on.
	for _, id := range workspaceIDs {
		deadline := time.Now().Add(30 * time.Second)
		for {
			g, err := ws.GetWorkspace(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
			if err == nil && g.Msg.GetWorkspace().GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("workspace %s not AVAILABLE after the outage: %v %v", id, g.Msg.GetWorkspace().GetState(), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	logs := strings.Join(e.allLogs(), "\n")
	if strings.Contains(logs, password) {
		t.Error("a log line contains the store password")
	}
	// The lease renewals failed (the fleet-wide work stopped, by the
	// keeper's own clock) and say why.
	if !strings.Contains(logs, `"msg":"lease: acquire or renew"`) || !strings.Contains(logs, "the store is unavailable") {
		t.Errorf("no failed lease renewal in the log:\n%.4000s", logs)
	}
	if strings.Contains(logs, `"msg":"internal error"`) {
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, `"msg":"internal error"`) {
				t.Errorf("a request failed as internal: %s", l)
			}
		}
	}
}

// waitHealth polls the replica's gRPC health until it reports want and
// returns how long after since it did; it fails the test after bound.
func waitHealth(t *testing.T, c *grpchealth.Client, want grpchealth.Status, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	for {
		res, err := c.Check(t.Context(), &grpchealth.CheckRequest{})
		if err == nil && res.Status == want {
			return time.Since(since)
		}
		if time.Since(since) > bound {
			t.Fatalf("health did not become %v within %v (last %v, %v)", want, bound, res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
