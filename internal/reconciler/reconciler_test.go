package reconciler

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/workspace"
)

// t0 is the fake clock's start: far from the real time, so that anything
// dated by time.Now instead of the reconciler's clock shows.
var t0 = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// newTest returns a Reconciler on a fresh SQLite store with a fake clock at
// t0. Its loop does not run: tests call its steps.
func newTest(t testing.TB, cfg Config) (*Reconciler, store.Store, *fakeClock) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	clock := &fakeClock{now: t0}
	cfg.Store, cfg.Now = st, clock.Now
	return New(cfg), st, clock
}

func hello(id string, memMiB, cpuMillis uint64, pool string, templates ...string) *nodev1.Hello {
	h := &nodev1.Hello{NodeId: id, Capacity: &nodev1.Capacity{MemoryMib: memMiB, CpuMillis: cpuMillis, StoragePool: pool}}
	for _, tv := range templates {
		h.Templates = append(h.Templates, &nodev1.TemplateInfo{TemplateId: tv, Version: tv + "-v1"})
	}
	return h
}

// connectNode does what Connect does with a Hello: records the node in the
// store and makes it the connected one.
func connectNode(t testing.TB, r *Reconciler, h *nodev1.Hello) *nodeConn {
	t.Helper()
	if err := r.register(t.Context(), h, func(store.NodeTx, *store.Node) error { return nil }); err != nil {
		t.Fatalf("register(%s) = %v", h.GetNodeId(), err)
	}
	return r.attach(h, nil)
}

// row describes a Workspace to seed.
type row struct {
	id         string
	node       string
	power      store.Power
	generation uint64
	observed   uint64 // observed generation
	exec       store.ExecState
	state      ctrlv1.WorkspaceState
	memMiB     uint32
	command    string                      // the in-flight command, "" for none
	kind       ctrlv1.WorkspaceCommandKind // its kind
}

// seed writes a Workspace as admission leaves it, with its in-flight
// command PROCESSING, at the clock's time.
func seed(t testing.TB, st store.Store, now time.Time, s row) {
	t.Helper()
	if s.memMiB == 0 {
		s.memMiB = 256
	}
	pub := &ctrlv1.Workspace{
		WorkspaceId: s.id, State: s.state,
		Template:            &ctrlv1.TemplateRef{TemplateId: workspace.DefaultTemplate},
		Resources:           &ctrlv1.Resources{MemoryMib: s.memMiB, CpuMillis: 500},
		WritableLayer:       &ctrlv1.WritableLayer{CapacityBytes: 1 << 30},
		NetworkPolicy:       &ctrlv1.NetworkPolicy{Revision: 1, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE},
		NetworkPolicyStatus: &ctrlv1.NetworkPolicyStatus{State: ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING},
		Expiration:          &ctrlv1.Expiration{Revision: 1},
		CreatedAt:           timestamppb.New(now),
	}
	if s.node != "" {
		pub.Placement = &ctrlv1.Placement{NodeId: s.node}
	}
	w := &store.Workspace{ID: s.id, CreatedAt: now, NodeID: s.node, Power: s.power, Generation: s.generation,
		ObservedGeneration: s.observed, ObservedState: s.exec, CommandID: s.command}
	if err := workspace.Save(w, pub, now); err != nil {
		t.Fatal(err)
	}
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		if err := tx.InsertWorkspace(t.Context(), w); err != nil {
			return err
		}
		if s.command == "" {
			return nil
		}
		return tx.InsertCommand(t.Context(), &store.Command{ID: s.command, Method: "test", ObjectKind: workspace.ObjectKind,
			ObjectID: s.id, Kind: int(s.kind), Status: store.CommandProcessing, CreatedAt: now})
	})
	if err != nil {
		t.Fatalf("seed %s: %v", s.id, err)
	}
}

// load reads a Workspace row and its public object.
func load(t *testing.T, st store.Store, id string) (*store.Workspace, *ctrlv1.Workspace) {
	t.Helper()
	var w *store.Workspace
	if err := st.View(t.Context(), func(tx store.Tx) error {
		var err error
		w, err = tx.GetWorkspace(t.Context(), id)
		return err
	}); err != nil {
		t.Fatalf("GetWorkspace(%s) = %v", id, err)
	}
	pub, err := workspace.Decode(w)
	if err != nil {
		t.Fatal(err)
	}
	return w, pub
}

// loadCommand reads a command record.
func loadCommand(t *testing.T, st store.Store, id string) *store.Command {
	t.Helper()
	var c *store.Command
	if err := st.View(t.Context(), func(tx store.Tx) error {
		var err error
		c, err = tx.GetCommand(t.Context(), id)
		return err
	}); err != nil {
		t.Fatalf("GetCommand(%s) = %v", id, err)
	}
	return c
}

// TestNewDefaults: a zero Config gives a usable Reconciler with the
// documented defaults, and its exported methods work before Run.
func TestNewDefaults(t *testing.T) {
	r := New(Config{})
	if r.nodeGrace != 15*time.Second {
		t.Errorf("nodeGrace = %v, want 15s", r.nodeGrace)
	}
	if r.placementTimeout != time.Minute {
		t.Errorf("placementTimeout = %v, want 1m", r.placementTimeout)
	}
	if r.log == nil || r.clock == nil {
		t.Fatalf("log or clock not set")
	}
	if got := r.now(); got.Location() != time.UTC || got.Nanosecond()%1000 != 0 {
		t.Errorf("now() = %v, want UTC at microsecond precision", got)
	}
	r.Kick()
	r.Kick() // never blocks
	if c := r.MaxCapacity(); c != (workspace.Capacity{}) {
		t.Errorf("MaxCapacity() = %+v, want zero with no node", c)
	}
	if v, ok := r.Template(workspace.DefaultTemplate); v != "" || !ok {
		t.Errorf("Template(default) = %q, %v; want \"\", true before any node", v, ok)
	}
	if _, ok := r.Template("other"); ok {
		t.Errorf("Template(other) ok before any node reported it")
	}
}

// TestKnownNodes: MaxCapacity is the largest known node by memory;
// Template resolves to the version a node reported.
func TestKnownNodes(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	connectNode(t, r, hello("n1", 2048, 4000, "", workspace.DefaultTemplate))
	connectNode(t, r, hello("n2", 8192, 2000, "", "python"))
	if got, want := r.MaxCapacity(), (workspace.Capacity{MemoryMiB: 8192, CPUMillis: 2000}); got != want {
		t.Errorf("MaxCapacity() = %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		id, version string
		ok          bool
	}{
		{workspace.DefaultTemplate, workspace.DefaultTemplate + "-v1", true},
		{"python", "python-v1", true},
		{"ruby", "", false},
	} {
		if v, ok := r.Template(tc.id); v != tc.version || ok != tc.ok {
			t.Errorf("Template(%q) = %q, %v; want %q, %v", tc.id, v, ok, tc.version, tc.ok)
		}
	}
}
