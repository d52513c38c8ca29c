package reconciler

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/lease"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// TestPick chooses among connected nodes, each with its capacity, its
// templates and the memory its running Workspaces use.
func TestPick(t *testing.T) {
	node := func(id string, memMiB, cpuMillis, usedMiB uint64, templates ...string) candidate {
		c := candidate{id: id, capacity: workspace.Capacity{MemoryMiB: memMiB, CPUMillis: cpuMillis}, usedMiB: usedMiB,
			templates: map[string]string{}}
		for _, tp := range templates {
			c.templates[tp] = tp + "-v1"
		}
		return c
	}
	const (
		noTemplate = `no connected node holds template "python"`
		noFit      = "no connected node has the memory and CPU this workspace requests"
	)
	ask := func(memMiB, cpuMillis uint64) demand {
		return demand{template: "default", memoryMiB: memMiB, cpuMillis: cpuMillis}
	}
	networked := func(c candidate) candidate { c.network = true; return c }
	local := func(c candidate) candidate { c.local = true; return c }
	withNetwork := func(d demand) demand { d.network = true; return d }
	const noNetwork = `no connected node that holds template "default" serves workspace networks, which this workspace's PUBLIC_INTERNET policy needs`
	for _, tc := range []struct {
		name   string
		nodes  []candidate
		demand demand
		want   string // node ID, "" when none
		reason string
	}{
		{"no node connected", nil, ask(256, 500), "", ""},
		{"fits", []candidate{node("a", 1024, 1000, 0, "default")}, ask(256, 500), "a", ""},
		{"fits exactly", []candidate{node("a", 1024, 1000, 768, "default")}, ask(256, 1000), "a", ""},
		{"memory one MiB short", []candidate{node("a", 1024, 1000, 769, "default")}, ask(256, 500), "", noFit},
		{"memory over capacity", []candidate{node("a", 1024, 1000, 0, "default")}, ask(2048, 500), "", noFit},
		{"cpu over capacity", []candidate{node("a", 1024, 1000, 0, "default")}, ask(256, 1001), "", noFit},
		{"cpu of one workspace up to the node's", []candidate{node("a", 4096, 1000, 2048, "default")}, ask(256, 1000), "a", ""},
		{"template missing everywhere", []candidate{node("a", 1024, 1000, 0, "default"), node("b", 1024, 1000, 0)},
			demand{template: "python", memoryMiB: 256, cpuMillis: 500}, "", noTemplate},
		{"template missing wins over capacity", []candidate{node("a", 128, 100, 0, "default")},
			demand{template: "python", memoryMiB: 256, cpuMillis: 500}, "", noTemplate},
		{"only the node with the template", []candidate{node("a", 1024, 1000, 0, "default"), node("b", 8192, 4000, 0, "python")},
			demand{template: "python", memoryMiB: 256, cpuMillis: 500}, "b", ""},
		{"most free memory", []candidate{node("a", 4096, 4000, 3000, "default"), node("b", 2048, 4000, 0, "default"),
			node("c", 8192, 4000, 7000, "default")}, ask(256, 500), "b", ""},
		{"most free memory among those that fit cpu", []candidate{node("a", 8192, 500, 0, "default"), node("b", 2048, 4000, 0, "default")},
			ask(256, 1000), "b", ""},
		{"tie goes to the first", []candidate{node("a", 2048, 4000, 1024, "default"), node("b", 1024, 4000, 0, "default")},
			ask(256, 500), "a", ""},
		{"tie goes to the first, either order", []candidate{node("b", 1024, 4000, 0, "default"), node("a", 2048, 4000, 1024, "default")},
			ask(256, 500), "b", ""},
		{"none fits among several", []candidate{node("a", 1024, 4000, 1000, "default"), node("b", 512, 4000, 0, "default")},
			ask(1024, 500), "", noFit},
		// A PUBLIC_INTERNET policy needs a node that serves networks.
		{"network: only the node that serves it", []candidate{node("a", 8192, 4000, 0, "default"), networked(node("b", 1024, 4000, 0, "default"))},
			withNetwork(ask(256, 500)), "b", ""},
		{"network: none serves it", []candidate{node("a", 8192, 4000, 0, "default")}, withNetwork(ask(256, 500)), "", noNetwork},
		{"network: the template first", []candidate{networked(node("a", 8192, 4000, 0, "python"))}, withNetwork(ask(256, 500)), "",
			`no connected node holds template "default"`},
		{"network: serving nodes, none fits", []candidate{networked(node("a", 512, 4000, 0, "default")), node("b", 8192, 4000, 0, "default")},
			withNetwork(ask(1024, 500)), "", noFit},
		{"no network asked: any node", []candidate{networked(node("a", 1024, 4000, 0, "default")), node("b", 8192, 4000, 0, "default")},
			ask(256, 500), "b", ""},
		// With several replicas, a node of this replica while it has half
		// the free memory of the emptiest.
		{"local: preferred with half the free memory", []candidate{node("a", 4096, 4000, 0, "default"), local(node("b", 4096, 4000, 2048, "default"))},
			ask(256, 500), "b", ""},
		{"local: the emptiest of this replica's", []candidate{local(node("a", 4096, 4000, 1024, "default")), node("b", 4096, 4000, 0, "default"),
			local(node("c", 4096, 4000, 512, "default"))}, ask(256, 500), "c", ""},
		{"local: not below half", []candidate{node("a", 4096, 4000, 0, "default"), local(node("b", 4096, 4000, 2049, "default"))},
			ask(256, 500), "a", ""},
		{"local: only if it passes the rules", []candidate{node("a", 4096, 4000, 0, "default"), local(node("b", 8192, 4000, 0, "python"))},
			ask(256, 500), "a", ""},
		{"local: the emptiest anyway when it is local", []candidate{node("a", 4096, 4000, 1024, "default"), local(node("b", 4096, 4000, 0, "default"))},
			ask(256, 500), "b", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := pick(tc.nodes, tc.demand)
			id := ""
			if got != nil {
				id = got.id
			}
			if id != tc.want || reason != tc.reason {
				t.Errorf("pick = %q, %q; want %q, %q", id, reason, tc.want, tc.reason)
			}
		})
	}
}

// TestPlacementFailure: no node at all is a retryable unavailability; nodes
// that refuse the Workspace exhaust capacity.
func TestPlacementFailure(t *testing.T) {
	for _, tc := range []struct {
		reason string
		want   *fault.Error
	}{
		{"", &fault.Error{Kind: fault.KindUnavailable, Reason: fault.ReasonNodeUnreachable, Retryable: true, Stage: "placement",
			Message: "no node is connected to place the workspace on"}},
		{"no room", &fault.Error{Kind: fault.KindResourceExhausted, Reason: fault.ReasonCapacityExhausted, Stage: "placement",
			Message: "no room"}},
	} {
		if diff := cmp.Diff(tc.want, placementFailure(tc.reason)); diff != "" {
			t.Errorf("placementFailure(%q) (-want +got):\n%s", tc.reason, diff)
		}
	}
}

// TestChooseCountsRunningWorkspaces: the memory in use on a node is that of
// its Workspaces desired RUNNING, read from the store.
func TestChooseCountsRunningWorkspaces(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	connectNode(t, r, hello("n2", 2048, 4000, "", workspace.DefaultTemplate))
	seed(t, st, t0, row{id: "ws-run", node: "n1", power: running, generation: 1, state: wsAvail, memMiB: 3000})
	seed(t, st, t0, row{id: "ws-stop", node: "n2", power: stopped, generation: 2, state: wsStoped, memMiB: 2048})
	for _, tc := range []struct {
		memMiB uint32
		want   string
	}{
		{512, "n2"},  // n1 has 1096 MiB free, n2 all 2048 (its stopped Workspace uses none)
		{2048, "n2"}, // exactly n2
		{2049, ""},
	} {
		var got *candidate
		err := st.View(t.Context(), func(tx store.Tx) error {
			var err error
			got, _, err = r.choose(t.Context(), tx, &ctrlv1.Workspace{
				Template:  &ctrlv1.TemplateRef{TemplateId: workspace.DefaultTemplate},
				Resources: &ctrlv1.Resources{MemoryMib: tc.memMiB, CpuMillis: 100}})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		id := ""
		if got != nil {
			id = got.id
		}
		if id != tc.want {
			t.Errorf("choose(%d MiB) = %q, want %q", tc.memMiB, id, tc.want)
		}
	}
}

// TestPlace: an unplaced Workspace goes to a node (with its storage pool and
// template version), waits for one up to the placement timeout, then fails
// its command; one deleted before placement is simply deleted.
func TestPlace(t *testing.T) {
	const timeout = time.Minute
	for _, tc := range []struct {
		name      string
		node      bool   // a node with the default template is connected
		memMiB    uint32 // the Workspace's memory (the node has 1024 MiB)
		power     store.Power
		after     time.Duration // since admission
		placed    bool
		completed bool
		state     ctrlv1.WorkspaceState
		failure   ctrlv1.FailureReason
		code      string
	}{
		{name: "placed", node: true, memMiB: 256, power: running, placed: true, state: wsCreate},
		{name: "no node waits", power: running, memMiB: 256, after: timeout - time.Microsecond, state: wsCreate},
		{name: "no node fails after the timeout", power: running, memMiB: 256, after: timeout, completed: true, state: wsFailed,
			failure: ctrlv1.FailureReason_FAILURE_REASON_NODE_UNREACHABLE, code: "unavailable"},
		{name: "no room waits", node: true, memMiB: 2048, power: running, after: timeout - time.Microsecond, state: wsCreate},
		{name: "no room fails after the timeout", node: true, memMiB: 2048, power: running, after: timeout, completed: true,
			state: wsFailed, failure: ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, code: "resource_exhausted"},
		{name: "deleted before placement", power: deleted, memMiB: 256, completed: true, state: wsGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, st, clock := newTest(t, Config{PlacementTimeout: timeout})
			if tc.node {
				connectNode(t, r, hello("n1", 1024, 4000, "pool-a", workspace.DefaultTemplate))
			}
			seed(t, st, t0, row{id: "ws-1", power: tc.power, generation: 1, state: wsCreate, memMiB: tc.memMiB, command: "c-1"})
			clock.Set(t0.Add(tc.after))
			placed, completed, err := r.place(t.Context(), nil, "ws-1")
			if err != nil {
				t.Fatalf("place = %v", err)
			}
			if (placed != nil) != tc.placed || completed != tc.completed {
				t.Errorf("place = placed %v, completed %v; want %v, %v", placed != nil, completed, tc.placed, tc.completed)
			}
			w, pub := load(t, st, "ws-1")
			if pub.GetState() != tc.state {
				t.Errorf("state = %v, want %v", pub.GetState(), tc.state)
			}
			if got := pub.GetFailure().GetReason(); got != tc.failure {
				t.Errorf("failure reason = %v, want %v", got, tc.failure)
			}
			if tc.placed {
				want := &ctrlv1.Placement{NodeId: "n1", StoragePool: "pool-a"}
				if w.NodeID != "n1" || pub.GetPlacement().GetNodeId() != want.NodeId || pub.GetPlacement().GetStoragePool() != want.StoragePool {
					t.Errorf("placement = %q, %v; want n1, %v", w.NodeID, pub.GetPlacement(), want)
				}
				if v := pub.GetTemplate().GetVersion(); v != workspace.DefaultTemplate+"-v1" {
					t.Errorf("template version = %q, want the node's", v)
				}
			} else if w.NodeID != "" {
				t.Errorf("NodeID = %q, want unplaced", w.NodeID)
			}
			c := loadCommand(t, st, "c-1")
			if done := c.Status == store.CommandCompleted; done != tc.completed || c.ErrorCode != tc.code {
				t.Errorf("command: completed %v, code %q; want %v, %q", done, c.ErrorCode, tc.completed, tc.code)
			}
			if tc.completed && (w.CommandID != "" || w.ObservedGeneration != w.Generation) {
				t.Errorf("after completion: command %q, observed %d of %d", w.CommandID, w.ObservedGeneration, w.Generation)
			}
			if tc.power == deleted && w.DeletedAt.IsZero() {
				t.Errorf("DeletedAt not set")
			}
		})
	}
}

// TestPlaceBatch: one transaction places a pass's chunk, each decision
// weighing what the ones before it took (two nodes of 1100 MiB hold four
// Workspaces of 256 MiB each, the ninth and tenth wait); a Workspace past
// its placement timeout is failed alone afterwards, and a fleet lease lost
// at that moment leaves it waiting without undoing the batch's
// placements; a row that does not decode does not hold back the others
// (placeEach).
func TestPlaceBatch(t *testing.T) {
	const timeout = time.Minute
	lost := false
	r, st, clock := newTest(t, Config{PlacementTimeout: timeout, Leader: func() bool { return true },
		Fence: func(context.Context, store.Tx) error {
			if lost {
				return lease.ErrNotHeld
			}
			return nil
		}})
	connectNode(t, r, hello("n1", 1100, 4000, "pool-a", workspace.DefaultTemplate))
	connectNode(t, r, hello("n2", 1100, 4000, "pool-a", workspace.DefaultTemplate))
	var ids []string
	for i := range 10 {
		id := fmt.Sprintf("ws-%02d", i)
		seed(t, st, t0, row{id: id, power: running, generation: 1, state: wsCreate, memMiB: 256, command: "c-" + id})
		ids = append(ids, id)
	}
	ps, err := r.placeBatch(t.Context(), nil, ids, nil)
	if err != nil {
		t.Fatalf("placeBatch = %v", err)
	}
	on := map[string]int{}
	for i, p := range ps {
		w, _ := load(t, st, ids[i])
		if (p.placed != nil) != (w.NodeID != "") {
			t.Errorf("%s: placed %v, stored on %q", ids[i], p.placed != nil, w.NodeID)
		}
		on[w.NodeID]++
	}
	if on["n1"] != 4 || on["n2"] != 4 || on[""] != 2 {
		t.Errorf("placed by node = %v, want 4 on each, 2 waiting", on)
	}

	// Past the timeout with the lease lost: nothing fails, the placements
	// of the batch stay.
	clock.Set(t0.Add(timeout))
	seed(t, st, t0, row{id: "ws-fits", power: running, generation: 1, state: wsCreate, memMiB: 1, command: "c-ws-fits"})
	lost = true
	ps, err = r.placeBatch(t.Context(), nil, []string{"ws-08", "ws-fits", "ws-09"}, nil)
	if err != nil {
		t.Fatalf("placeBatch, lease lost = %v", err)
	}
	if ps[0].completed || ps[2].completed || ps[1].placed == nil {
		t.Errorf("lease lost: %+v; want the late ones waiting, ws-fits placed", ps)
	}
	if w, _ := load(t, st, "ws-fits"); w.NodeID == "" {
		t.Errorf("ws-fits not placed")
	}
	lost = false
	ps, err = r.placeBatch(t.Context(), nil, []string{"ws-08", "ws-09"}, nil)
	if err != nil || !ps[0].completed || !ps[1].completed {
		t.Fatalf("placeBatch, lease held = %+v, %v; want both failed", ps, err)
	}
	if c := loadCommand(t, st, "c-ws-08"); c.ErrorCode != "resource_exhausted" {
		t.Errorf("late command: code %q, want resource_exhausted", c.ErrorCode)
	}

	// A row that does not decode.
	seed(t, st, t0, row{id: "ws-bad", power: running, generation: 1, state: wsCreate, memMiB: 1, command: "c-ws-bad"})
	seed(t, st, t0, row{id: "ws-good", power: running, generation: 1, state: wsCreate, memMiB: 1, command: "c-ws-good"})
	corrupt(t, st, "ws-bad")
	if _, err := r.placeBatch(t.Context(), nil, []string{"ws-bad", "ws-good"}, nil); err == nil {
		t.Fatalf("placeBatch with a row that does not decode = nil, want its error")
	}
	ps, err = r.placeEach(t.Context(), nil, []string{"ws-bad", "ws-good"}, nil)
	if err != nil || ps[0].placed != nil || ps[1].placed == nil {
		t.Errorf("placeEach = %+v, %v; want ws-good placed, no error", ps, err)
	}
}

// TestPassPushesBeforeFailedBatch: when a pass's placement fails (here a
// batch of rows that do not decode), the placed Workspaces the pass had
// gathered to push are pushed to their node at once, not at the next
// pass.
func TestPassPushesBeforeFailedBatch(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	nc := connectNode(t, r, hello("n1", 1<<20, 1<<20, "", workspace.DefaultTemplate))
	for i := range 5 { // placed, not pushed yet
		seed(t, st, t0, row{id: fmt.Sprintf("ws-a%d", i), node: "n1", power: running, generation: 1, state: wsCreate, memMiB: 1, command: fmt.Sprintf("c-a%d", i)})
	}
	for i := range pushChunk { // a batch that cannot be placed
		id := fmt.Sprintf("ws-b%02d", i)
		seed(t, st, t0, row{id: id, power: running, generation: 1, state: wsCreate, memMiB: 1, command: "c-" + id})
		corrupt(t, st, id)
	}
	if err := r.pass(t.Context()); err == nil {
		t.Fatal("pass with a batch that does not decode = nil, want its error")
	}
	pushed := 0
	for len(nc.send) > 0 {
		pushed += len((<-nc.send).GetDesired().GetWorkspaces())
	}
	if pushed != 5 {
		t.Errorf("pushed %d Workspaces in the failed pass, want the 5 placed", pushed)
	}
}

// corrupt makes Workspace id's stored document one that does not decode.
func corrupt(t *testing.T, st store.Store, id string) {
	t.Helper()
	if err := st.InTx(t.Context(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(t.Context(), id)
		if err != nil {
			return err
		}
		w.Doc = []byte("not a workspace")
		return tx.UpdateWorkspace(t.Context(), w)
	}); err != nil {
		t.Fatal(err)
	}
}

// usageSpy counts where every node's sums are read (store.Tx.NodeUsages):
// in read-only views, or in placement transactions.
type usageSpy struct {
	store.Store
	inView, inTx atomic.Int64
	// hold, when set, is called in each view before its read.
	hold func()
}

type usageSpyTx struct {
	store.Tx
	n *atomic.Int64
}

func (t usageSpyTx) NodeUsages(ctx context.Context) (map[string]store.NodeUsage, error) {
	t.n.Add(1)
	return t.Tx.NodeUsages(ctx)
}

func (s *usageSpy) View(ctx context.Context, fn func(store.Tx) error) error {
	if s.hold != nil {
		s.hold()
	}
	return s.Store.View(ctx, func(tx store.Tx) error { return fn(usageSpyTx{tx, &s.inView}) })
}

func (s *usageSpy) InTx(ctx context.Context, fn func(store.Tx) error) error {
	return s.Store.InTx(ctx, func(tx store.Tx) error { return fn(usageSpyTx{tx, &s.inTx}) })
}

// TestUsageReadOutsidePlacement: the usage cache is read in a read-only
// view, never in the placement transaction: before the first placement,
// and then by reloadEvery (refreshUsage) while placement uses it, once it
// is older than usageReload; a placement reads it itself only when it is
// older than usageStale. That read of every node does not hold SQLite's
// writer, and takes no SSI read locks over the whole index in the serializable transaction. The placements are as
// the sums say: on the emptier node.
func TestUsageReadOutsidePlacement(t *testing.T) {
	_, st, clock := newTest(t, Config{})
	spy := &usageSpy{Store: st}
	r := New(Config{Store: spy, Now: clock.Now})
	connectNode(t, r, hello("n1", 4096, 4000, "pool-a", workspace.DefaultTemplate))
	connectNode(t, r, hello("n2", 4096, 4000, "pool-a", workspace.DefaultTemplate))
	seed(t, st, t0, row{id: "ws-full", node: "n1", power: running, generation: 1, observed: 1, state: wsAvail, memMiB: 2048})
	age := func(d time.Duration) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.usage.loaded = r.usage.loaded.Add(-d)
	}
	reads := func(when string, view, tx int64) {
		t.Helper()
		if v, x := spy.inView.Load(), spy.inTx.Load(); v != view || x != tx {
			t.Errorf("%s: every node's sums read %d times in views and %d in placement transactions, want %d and %d", when, v, x, view, tx)
		}
	}
	r.refreshUsage(t.Context())
	reads("before any placement, reloadEvery", 0, 0) // placement has not used the cache
	for i, id := range []string{"ws-a", "ws-b", "ws-c"} {
		seed(t, st, t0, row{id: id, power: running, generation: 1, state: wsCreate, memMiB: 256, command: "c-" + id})
		switch i {
		case 1: // old: reloadEvery reads it again
			age(usageReload)
			r.refreshUsage(t.Context())
			reads("reloadEvery, the cache older than usageReload", 2, 0)
		case 2: // stale (reloadEvery behind): the placement reads it first
			age(usageStale)
		}
		ps, err := r.placeBatch(t.Context(), nil, []string{id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ps[0].placed == nil || ps[0].placed.NodeID != "n2" {
			t.Fatalf("%s placed %+v, want on n2 (n1 has 2048 MiB taken)", id, ps[0].placed)
		}
		reads("after placing "+id, []int64{1, 2, 3}[i], 0)
	}
	r.mu.Lock()
	r.usage.used = r.usage.used.Add(-usageKeep)
	r.mu.Unlock()
	age(usageReload)
	r.refreshUsage(t.Context())
	reads("reloadEvery, placement idle for usageKeep", 3, 0)
}

// TestUsageLoadsOneAtATime: a placement needing the usage cache while
// reloadEvery reads it waits for that read and reads nothing itself.
func TestUsageLoadsOneAtATime(t *testing.T) {
	_, st, clock := newTest(t, Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	spy := &usageSpy{Store: st, hold: func() { once.Do(func() { close(entered); <-release }) }}
	r := New(Config{Store: spy, Now: clock.Now})
	done := make(chan struct{})
	go func() { r.loadUsage(t.Context(), usageReload); close(done) }() // reloadEvery's
	<-entered
	second := make(chan struct{})
	go func() { r.preloadUsage(t.Context()); close(second) }() // a placement's
	time.Sleep(50 * time.Millisecond)                          // let it wait for the first
	close(release)
	<-done
	<-second
	if n := spy.inView.Load(); n != 1 {
		t.Fatalf("two loads at once read every node's sums %d times, want 1", n)
	}
}

// TestLearntKeptOverLoad: what a decider that read every node's sums in its
// transaction placed is kept when a load of the cache that began before it
// committed ends after it (the load's view may predate the placement).
func TestLearntKeptOverLoad(t *testing.T) {
	_, st, clock := newTest(t, Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	spy := &usageSpy{Store: st, hold: func() { once.Do(func() { close(entered); <-release }) }}
	r := New(Config{Store: spy, Now: clock.Now})
	done := make(chan struct{})
	go func() { r.loadUsage(t.Context(), usageReload); close(done) }()
	<-entered
	placed := store.NodeUsage{RunningMemoryMiB: 512, RunningCPUMillis: 500}
	d := &decider{r: r, fresh: true, usage: map[string]store.NodeUsage{"n1": placed}, touched: map[string]bool{"n1": true}}
	d.learn()
	close(release)
	<-done
	r.mu.Lock()
	got := r.usage.m["n1"]
	r.mu.Unlock()
	if got != placed {
		t.Fatalf("usage of n1 after the load = %+v, want what the placement learnt, %+v", got, placed)
	}
}
