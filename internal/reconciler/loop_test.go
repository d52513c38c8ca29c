package reconciler

import (
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// TestMarkSilent: the Workspaces of a node silent longer than NodeGrace
// turn UNKNOWN; not a moment before, whether the node is still connected
// (silent stream) or known only from the store (ctrl restarted, node gone).
func TestMarkSilent(t *testing.T) {
	const grace = 10 * time.Second
	for _, tc := range []struct {
		name      string
		connected bool          // the node's stream is open (else known from the store only)
		message   time.Duration // a message arrived this long after t0 (0: none)
		after     time.Duration // when the pass runs, after t0
		unknown   bool
	}{
		{name: "connected, just heard", connected: true, after: time.Second},
		{name: "connected, silent for the grace", connected: true, after: grace},
		{name: "connected, silent beyond the grace", connected: true, after: grace + time.Microsecond, unknown: true},
		{name: "connected, a message renews the grace", connected: true, message: 5 * time.Second, after: grace + time.Second},
		{name: "connected, silent beyond the grace since the message", connected: true, message: 5 * time.Second,
			after: 5*time.Second + grace + time.Microsecond, unknown: true},
		{name: "stored only, seen within the grace", after: grace},
		{name: "stored only, beyond the grace", after: grace + time.Microsecond, unknown: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, st, clock := newTest(t, Config{NodeGrace: grace})
			h := hello("n1", 4096, 4000, "", workspace.DefaultTemplate)
			if tc.connected {
				connectNode(t, r, h)
				if tc.message > 0 {
					clock.Set(t0.Add(tc.message))
					hear(t, r, "n1")
				}
			} else {
				if err := r.register(t.Context(), h, func(store.NodeTx, *store.Node) error { return nil }); err != nil {
					t.Fatal(err)
				}
				if err := r.loadNodes(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			seed(t, st, t0, row{id: "ws-run", node: "n1", power: running, generation: 1, observed: 1, exec: store.ExecRunning, state: wsAvail})
			seed(t, st, t0, row{id: "ws-stop", node: "n1", power: stopped, generation: 2, observed: 2, exec: store.ExecStopped, state: wsStoped})
			seed(t, st, t0, row{id: "ws-other", node: "n2", power: running, generation: 1, observed: 1, exec: store.ExecRunning, state: wsAvail})

			clock.Set(t0.Add(tc.after))
			n, err := r.markSilent(t.Context())
			if err != nil {
				t.Fatalf("markSilent = %v", err)
			}
			wantN := 0
			if tc.unknown {
				wantN = 2
			}
			if n != wantN {
				t.Errorf("markSilent = %d, want %d", n, wantN)
			}
			for id, was := range map[string]ctrlv1.WorkspaceState{"ws-run": wsAvail, "ws-stop": wsStoped} {
				want := was
				if tc.unknown {
					want = wsUnk
				}
				if _, pub := load(t, st, id); pub.GetState() != want {
					t.Errorf("%s state = %v, want %v", id, pub.GetState(), want)
				}
			}
			if _, pub := load(t, st, "ws-other"); pub.GetState() != wsAvail {
				t.Errorf("a Workspace of another node turned %v", pub.GetState())
			}
		})
	}
}

// TestMarkSilentQuiet: once a silent node's Workspaces are all UNKNOWN,
// later passes skip it; a reconnection makes it count again.
func TestMarkSilentQuiet(t *testing.T) {
	r, st, clock := newTest(t, Config{NodeGrace: time.Second})
	h := hello("n1", 4096, 4000, "", workspace.DefaultTemplate)
	nc := connectNode(t, r, h)
	seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 1, observed: 1, exec: store.ExecRunning, state: wsAvail})
	r.detach(nc)
	clock.Set(t0.Add(2 * time.Second))
	if n, err := r.markSilent(t.Context()); err != nil || n != 1 {
		t.Fatalf("markSilent = %d, %v; want 1", n, err)
	}
	if !r.quiet["n1"] {
		t.Fatalf("n1 not quiet after its Workspaces turned UNKNOWN")
	}
	if n, err := r.markSilent(t.Context()); err != nil || n != 0 {
		t.Fatalf("second markSilent = %d, %v; want 0", n, err)
	}
	connectNode(t, r, h)
	if r.quiet["n1"] {
		t.Errorf("n1 still quiet after it connected again")
	}
}

// TestWriteSeen: the store's last_seen is when the node was last heard,
// by the reconciler's clock, as of the last writeSeen; a writeSeen with
// nothing heard since the last writes nothing; one writes every node heard.
func TestWriteSeen(t *testing.T) {
	r, st, clock := newTest(t, Config{})
	n1 := connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	lastSeen := func(id string) time.Time {
		var n *store.Node
		if err := st.View(t.Context(), func(tx store.Tx) error {
			var err error
			n, err = tx.GetNode(t.Context(), id)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n.LastSeen
	}
	if got := lastSeen("n1"); !got.Equal(t0) {
		t.Fatalf("last_seen after the Hello = %v, want %v", got, t0)
	}
	clock.Set(t0.Add(500 * time.Millisecond))
	r.seen(n1)
	if got := lastSeen("n1"); !got.Equal(t0) {
		t.Errorf("last_seen before writeSeen = +%v, want the Hello's", got.Sub(t0))
	}
	r.writeSeen(t.Context())
	if got := lastSeen("n1"); !got.Equal(t0.Add(500 * time.Millisecond)) {
		t.Errorf("last_seen after writeSeen = +%v, want +500ms", got.Sub(t0))
	}
	clock.Set(t0.Add(2 * time.Second))
	n2 := connectNode(t, r, hello("n2", 4096, 4000, "", workspace.DefaultTemplate))
	r.writeSeen(t.Context()) // n1 not heard since, n2 just registered
	if got := lastSeen("n1"); !got.Equal(t0.Add(500 * time.Millisecond)) {
		t.Errorf("n1 not heard since: last_seen +%v, want +500ms", got.Sub(t0))
	}
	clock.Set(t0.Add(3 * time.Second))
	r.seen(n1)
	r.seen(n2)
	r.writeSeen(t.Context())
	for _, id := range []string{"n1", "n2"} {
		if got := lastSeen(id); !got.Equal(t0.Add(3 * time.Second)) {
			t.Errorf("%s heard at +3s: last_seen +%v", id, got.Sub(t0))
		}
	}
}

// hear is a message of node id's stream to r, written at once as Run's
// writeSeen does every second.
func hear(t *testing.T, r *Reconciler, id string) {
	t.Helper()
	r.mu.Lock()
	nc := r.nodes[id]
	r.mu.Unlock()
	if nc == nil {
		t.Fatalf("no stream of %s on this replica", id)
	}
	r.seen(nc)
	r.writeSeen(t.Context())
}

// TestPassPushes: a pass places a pending Workspace and sends its desired
// state down the node's stream once per generation.
func TestPassPushes(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	nc := connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	seed(t, st, t0, row{id: "ws-1", power: running, generation: 1, state: wsCreate, command: "c-1"})
	for range 2 {
		if err := r.pass(t.Context()); err != nil {
			t.Fatalf("pass = %v", err)
		}
	}
	if len(nc.send) != 1 {
		t.Fatalf("%d messages sent, want 1", len(nc.send))
	}
	d := (<-nc.send).GetDesired().GetWorkspaces()
	if len(d) != 1 || d[0].GetWorkspaceId() != "ws-1" || d[0].GetGeneration() != 1 || d[0].GetMemoryMib() != 256 {
		t.Errorf("desired = %v, want ws-1 at generation 1 with 256 MiB", d)
	}
	if w, _ := load(t, st, "ws-1"); w.NodeID != "n1" {
		t.Errorf("NodeID = %q, want n1", w.NodeID)
	}
}

// TestOfferToReplacedStream: a push that took a node's connection just
// before a newer stream replaced it sends into the old one without
// panicking (its send channel used to be closed), and the old stream is told
// it was replaced.
func TestOfferToReplacedStream(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	h := hello("n1", 4096, 4000, "", workspace.DefaultTemplate)
	old := connectNode(t, r, h)
	connectNode(t, r, h)
	select {
	case <-old.replaced:
	default:
		t.Fatal("the replaced stream was not told")
	}
	r.offer(old, "ws-1", &nodev1.ConnectResponse{})
	for range 300 { // past the buffer: the backed-up path too
		r.offer(old, "ws-1", &nodev1.ConnectResponse{})
	}
}
