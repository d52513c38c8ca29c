package reconciler

import (
	"context"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/lease"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// Two ctrl replicas in one process: two Reconcilers on one store (its
// notifier carries the notifications between them, as PostgreSQL's does
// between processes), one fake clock.

// newReplica returns a second Reconciler on st and clock.
func newReplica(st store.Store, clock *fakeClock, cfg Config) *Reconciler {
	cfg.Store, cfg.Now = st, clock.Now
	return New(cfg)
}

func never() bool { return false }

// eventually polls cond every 5 ms for up to d.
func eventually(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestReplicaLearnsNodes: a replica started before a node registered
// through another learns the node (its capacity, templates) at once from
// the notification of the registering commit, not at its next restart or
// periodic reload; so does it an Inventory the other replica recorded.
func TestReplicaLearnsNodes(t *testing.T) {
	a, st, clock := newTest(t, Config{})
	// b is not the lease's holder: its periodic reload is the slow one
	// (nodeReload), so only the notification can teach it within the test.
	b := newReplica(st, clock, Config{Leader: never})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if !eventually(2*time.Second, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return !b.nodeCache.loaded.IsZero() }) {
		t.Fatal("b did not start")
	}
	if c := b.MaxCapacity(); c.MemoryMiB != 0 {
		t.Fatalf("b's MaxCapacity before any node = %+v", c)
	}
	nc := connectNode(t, a, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	start := time.Now()
	if !eventually(2*time.Second, func() bool { return b.MaxCapacity().MemoryMiB == 4096 }) {
		t.Fatalf("b's MaxCapacity after n1 registered through a = %+v, want 4096 MiB", b.MaxCapacity())
	}
	t.Logf("b learnt n1 %v after its registration", time.Since(start))
	if _, ok := b.Template("tpl-2"); ok {
		t.Fatal("b knows tpl-2 before any node has it")
	}
	a.inventory(t.Context(), nc, &nodev1.Inventory{Templates: []*nodev1.TemplateInfo{
		{TemplateId: workspace.DefaultTemplate, Version: "v1"}, {TemplateId: "tpl-2", Version: "v2"}}})
	if !eventually(2*time.Second, func() bool { v, ok := b.Template("tpl-2"); return ok && v == "v2" }) {
		t.Fatal("b did not learn the inventory a recorded")
	}
}

// TestNodeReloadReadsChangedDocsOnly: a reload reads every node's state
// but the documents of only the nodes whose record changed: heartbeats
// change no revision.
func TestNodeReloadReadsChangedDocsOnly(t *testing.T) {
	a, st, clock := newTest(t, Config{})
	for _, id := range []string{"n1", "n2", "n3"} {
		connectNode(t, a, hello(id, 1024, 1000, "", workspace.DefaultTemplate))
	}
	b := newReplica(st, clock, Config{})
	if err := b.loadNodes(t.Context()); err != nil {
		t.Fatal(err)
	}
	revs := func() map[string]int64 {
		b.mu.Lock()
		defer b.mu.Unlock()
		m := map[string]int64{}
		for id, k := range b.stored {
			m[id] = k.revision
		}
		return m
	}
	before := revs()
	if len(before) != 3 {
		t.Fatalf("b knows %d nodes, want 3", len(before))
	}
	clock.Set(t0.Add(5 * time.Second))
	hear(t, a, "n1")
	if err := b.loadNodes(t.Context()); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	seen := b.stored["n1"].lastSeen
	b.mu.Unlock()
	if !seen.Equal(t0.Add(5 * time.Second)) {
		t.Errorf("b's last_seen of n1 = %v, want the heartbeat's", seen)
	}
	if after := revs(); after["n1"] != before["n1"] {
		t.Errorf("a heartbeat changed n1's revision: %d → %d", before["n1"], after["n1"])
	}
}

// TestSilentNodeOfAnotherReplica: the fleet lease's holder b, without any
// stream and started before the node registered, judges the node
// connected to a by the store's last_seen: not silent while a records its
// heartbeats, its Workspaces UNKNOWN once they stop for the grace.
func TestSilentNodeOfAnotherReplica(t *testing.T) {
	a, st, clock := newTest(t, Config{Leader: never})
	b := newReplica(st, clock, Config{})
	if err := b.loadNodes(t.Context()); err != nil { // b starts: no node yet
		t.Fatal(err)
	}
	nc := connectNode(t, a, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 1, observed: 1,
		state: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE})
	for s := 5; s <= 30; s += 5 { // a heartbeat every 5 s, for 30 s
		clock.Set(t0.Add(time.Duration(s) * time.Second))
		hear(t, a, "n1")
		if err := b.pass(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, pub := load(t, st, "ws-1"); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			t.Fatalf("at +%ds, with a recording n1's heartbeats: state %v", s, pub.GetState())
		}
	}
	clock.Set(t0.Add(46 * time.Second)) // 16 s after the last heartbeat
	b.mu.Lock()
	b.nodeCache.stale = true
	b.mu.Unlock()
	if err := b.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, pub := load(t, st, "ws-1"); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
		t.Fatalf("after n1 was silent for the grace: state %v, want UNKNOWN", pub.GetState())
	}
	// n1 is heard again through a (its report turns ws-1 AVAILABLE), then
	// falls silent again: b, never kicked, marks it again.
	clock.Set(t0.Add(50 * time.Second))
	w, _ := load(t, st, "ws-1")
	a.report(t.Context(), nc, &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: w.Generation,
		State: nodev1.ExecState_EXEC_STATE_RUNNING, HoldsExecution: true, LayerExists: true})
	hear(t, a, "n1") // the report was a message of the stream
	if _, pub := load(t, st, "ws-1"); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("after n1's report: state %v, want AVAILABLE", pub.GetState())
	}
	for _, at := range []time.Duration{51 * time.Second, 67 * time.Second} {
		clock.Set(t0.Add(at))
		b.mu.Lock()
		b.nodeCache.stale = true
		b.mu.Unlock()
		if err := b.pass(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if _, pub := load(t, st, "ws-1"); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
		t.Fatalf("after n1 fell silent again: state %v, want UNKNOWN", pub.GetState())
	}
}

// TestHolderPlacesFleetWide: the fleet lease's holder b has no stream;
// n1 (1024 MiB) is connected to a, which does not hold the lease. Once
// handoff has passed (a replica that admitted them did not place them), b
// places on n1 what n1 can hold, and a's pass, woken by b's notification,
// pushes it to n1; what no node can hold fails at the timeout for
// capacity, not NODE_UNREACHABLE. Once n1's stream to b ended, b places
// nothing on it, though the store heard n1 within the grace.
func TestHolderPlacesFleetWide(t *testing.T) {
	const timeout = time.Minute
	a, st, clock := newTest(t, Config{Leader: never, PlacementTimeout: timeout})
	b := newReplica(st, clock, Config{PlacementTimeout: timeout})
	nc := connectNode(t, a, hello("n1", 1024, 4000, "", workspace.DefaultTemplate))
	seed(t, st, t0, row{id: "big", power: running, generation: 1, state: wsCreate, memMiB: 2048, command: "c-big"})
	seed(t, st, t0, row{id: "fits", power: running, generation: 1, state: wsCreate, memMiB: 256, command: "c-fits"})
	clock.Set(t0.Add(handoff))
	hear(t, a, "n1")
	if err := b.loadNodes(t.Context()); err != nil {
		t.Fatal(err)
	}
	woken, release := st.Subscribe(store.PushTopic)
	defer release()
	if err := b.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if w, _ := load(t, st, "fits"); w.NodeID != "n1" {
		t.Fatalf("fits: NodeID %q, want n1 (connected to a)", w.NodeID)
	}
	select {
	case <-woken:
	default:
		t.Fatal("b placed on a node of a without notifying store.PushTopic")
	}
	if err := a.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(nc.send) != 1 {
		t.Fatalf("a sent %d desired states to n1, want 1 (fits)", len(nc.send))
	}
	if _, pub := load(t, st, "big"); pub.GetState() != wsCreate {
		t.Fatalf("big before the timeout: state %v", pub.GetState())
	}
	clock.Set(t0.Add(timeout))
	hear(t, a, "n1")
	if err := b.loadNodes(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, pub := load(t, st, "big"); pub.GetFailure().GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED {
		t.Errorf("big at the timeout: state %v failure %v, want CAPACITY_EXHAUSTED", pub.GetState(), pub.GetFailure())
	}

	// n1 moves to b, then its stream there ends: b does not place on it.
	n2 := connectNode(t, b, hello("n1", 1024, 4000, "", workspace.DefaultTemplate))
	hear(t, b, "n1")
	b.detach(n2)
	seed(t, st, t0.Add(timeout), row{id: "later", power: running, generation: 1, state: wsCreate, memMiB: 256, command: "c-later"})
	b.Admitted("later") // b's to place, at once
	if err := b.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if w, _ := load(t, st, "later"); w.NodeID != "" {
		t.Errorf("later: placed on %q, whose stream to b ended", w.NodeID)
	}
}

// TestStaleHolderFenced: a replica whose fleet lease another replica took
// over — its own clock still says it holds it — neither fails a placement
// at its timeout, nor marks a silent node's Workspaces UNKNOWN, nor applies
// the drain rule: each unit's transaction checks the lease row
// (Config.Fence) and rolls back. The holder does all three.
func TestStaleHolderFenced(t *testing.T) {
	const timeout = time.Minute
	r, st, clock := newTest(t, Config{PlacementTimeout: timeout})
	holdClock := &fakeClock{now: t0.Add(timeout + time.Minute)}
	stale := lease.New(lease.Config{Store: st, Name: lease.Fleet, Holder: "stale", Now: holdClock.Now})
	if err := stale.Try(t.Context()); err != nil {
		t.Fatal(err)
	}
	newClock := &fakeClock{now: holdClock.now.Add(lease.DefaultTTL + time.Millisecond)}
	other := lease.New(lease.Config{Store: st, Name: lease.Fleet, Holder: "other", Now: newClock.Now})
	if err := other.Try(t.Context()); err != nil || !other.IsHeld() || !stale.IsHeld() {
		t.Fatalf("takeover: %v; other holds %v, stale thinks it holds %v", err, other.IsHeld(), stale.IsHeld())
	}
	r.leader = stale.IsHeld
	r.fence = func(ctx context.Context, tx store.Tx) error { return stale.Check(ctx, tx) }

	connectNode(t, r, hello("gone", 4096, 4000, "", workspace.DefaultTemplate))
	r.detach(r.nodes["gone"])
	seed(t, st, t0, row{id: "ws-on", node: "gone", power: running, generation: 1, observed: 1,
		state: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE})
	seed(t, st, t0, row{id: "ws-big", power: running, generation: 1, state: wsCreate, memMiB: 1 << 20, command: "c-big"})
	// A node draining with stop_workspaces, with an AVAILABLE Workspace:
	// the drain rule's stop is due.
	seed(t, st, t0, row{id: "ws-dr", node: "dr", power: running, generation: 1, observed: 1, exec: store.ExecRunning,
		state: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE})
	setRecord(t, st, "dr", func(rec *fleet.Record) {
		rec.State, rec.DrainStopsWorkspaces, rec.DrainCommandID = fleet.StateDraining, true, "drain-1"
	})
	clock.Set(t0.Add(timeout + time.Minute))
	if err := r.pass(t.Context()); err != nil {
		t.Fatalf("pass = %v", err)
	}
	if _, pub := load(t, st, "ws-big"); pub.GetState() != wsCreate {
		t.Errorf("the stale holder failed a placement: state %v", pub.GetState())
	}
	if _, pub := load(t, st, "ws-on"); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Errorf("the stale holder marked a silent node's Workspace: state %v", pub.GetState())
	}
	if w, _ := load(t, st, "ws-dr"); w.Power != running || w.Generation != 1 {
		t.Errorf("the stale holder applied the drain rule: power %v generation %d", w.Power, w.Generation)
	}
	// The holder of the lease does both.
	r.leader = other.IsHeld
	r.fence = func(ctx context.Context, tx store.Tx) error { return other.Check(ctx, tx) }
	r.Kick()
	if err := r.pass(t.Context()); err != nil {
		t.Fatalf("pass = %v", err)
	}
	if _, pub := load(t, st, "ws-big"); pub.GetState() != wsFailed {
		t.Errorf("the holder did not fail the placement: state %v", pub.GetState())
	}
	if _, pub := load(t, st, "ws-on"); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
		t.Errorf("the holder did not mark the silent node's Workspace: state %v", pub.GetState())
	}
	if w, _ := load(t, st, "ws-dr"); w.Power != store.PowerStopped {
		t.Errorf("the holder did not apply the drain rule: power %v generation %d", w.Power, w.Generation)
	}
}

// TestStaleStreamEpoch: n1 connects to a, then again to b (its stream to
// a half-dead). An Inventory, an execution report and a heartbeat arriving on a's stale stream
// write nothing over the newer record, and end that stream; a's reload of
// the node records ends it too.
func TestStaleStreamEpoch(t *testing.T) {
	a, st, clock := newTest(t, Config{})
	b := newReplica(st, clock, Config{})
	ncA := connectNode(t, a, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	clock.Set(t0.Add(time.Second))
	ncB := connectNode(t, b, hello("n1", 8192, 4000, "", workspace.DefaultTemplate, "tpl-new"))
	if ncB.epoch != ncA.epoch+1 {
		t.Fatalf("epochs: a's stream %d, b's %d; want b's the next", ncA.epoch, ncB.epoch)
	}
	stored := func() *store.Node {
		var n *store.Node
		if err := st.View(t.Context(), func(tx store.Tx) (err error) { n, err = tx.GetNode(t.Context(), "n1"); return err }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := stored()
	a.inventory(t.Context(), ncA, &nodev1.Inventory{Templates: []*nodev1.TemplateInfo{{TemplateId: "old", Version: "v0"}}})
	if after := stored(); after.Revision != before.Revision || after.Epoch != ncB.epoch {
		t.Errorf("a stale Inventory changed the record: revision %d → %d, epoch %d", before.Revision, after.Revision, after.Epoch)
	}
	select {
	case <-ncA.replaced:
	default:
		t.Error("a stale Inventory did not end the stale stream")
	}
	// An execution report still delivered on a's stale stream writes
	// nothing (the epoch is checked in its transaction) and is not lost:
	// it ends nothing else; the same report on b's stream is written.
	seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 1, command: "c-1",
		state: ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING})
	rep := &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: 1, State: nodev1.ExecState_EXEC_STATE_RUNNING,
		HoldsExecution: true, LayerExists: true}
	if err := a.report(t.Context(), ncA, rep); err != nil {
		t.Errorf("a stale stream's report = %v, want dropped without an error", err)
	}
	if w, _ := load(t, st, "ws-1"); w.ObservedGeneration != 0 {
		t.Errorf("a stale stream's report was written: observed generation %d", w.ObservedGeneration)
	}
	if err := b.report(t.Context(), ncB, rep); err != nil {
		t.Fatal(err)
	}
	if w, _ := load(t, st, "ws-1"); w.ObservedGeneration != 1 {
		t.Errorf("the current stream's report: observed generation %d, want 1", w.ObservedGeneration)
	}
	// A heartbeat on a stale stream (a second one, not ended yet).
	a2 := newReplica(st, clock, Config{})
	ncA2 := a2.attach(hello("n1", 4096, 4000, ""), nil) // registered with no epoch of its own: stale
	clock.Set(t0.Add(5 * time.Second))
	hear(t, a2, "n1")
	if n := stored(); !n.LastSeen.Equal(t0.Add(time.Second)) {
		t.Errorf("a stale heartbeat wrote last_seen %v", n.LastSeen)
	}
	select {
	case <-ncA2.replaced:
	default:
		t.Error("a stale heartbeat did not end the stale stream")
	}
	// A reload ends a stale stream too.
	a3 := newReplica(st, clock, Config{})
	ncA3 := a3.attach(hello("n1", 4096, 4000, ""), nil)
	if err := a3.loadNodes(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ncA3.replaced:
	default:
		t.Error("a reload did not end the stale stream")
	}
	if !a3.superseded(ncA3) || b.superseded(ncB) {
		t.Errorf("superseded: a's stale stream %v (want true), b's current one %v (want false)", a3.superseded(ncA3), b.superseded(ncB))
	}
	// b's stream is the current one: its heartbeat is written.
	hear(t, b, "n1")
	if n := stored(); !n.LastSeen.Equal(t0.Add(5 * time.Second)) {
		t.Errorf("the current stream's heartbeat: last_seen %v", n.LastSeen)
	}
}

// TestConnectedFleetWide: a node whose stream another replica holds is
// connected for this one too (GetNode, ListNodes) while that replica
// hears it, and no longer once it has been silent beyond the grace.
func TestConnectedFleetWide(t *testing.T) {
	a, st, clock := newTest(t, Config{})
	b := newReplica(st, clock, Config{})
	if b.Connected("n1") {
		t.Fatal("an unknown node is connected")
	}
	nc := connectNode(t, a, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	if err := b.loadNodes(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !a.Connected("n1") || !b.Connected("n1") {
		t.Fatalf("n1 on a: connected on a %v, on b %v; want both", a.Connected("n1"), b.Connected("n1"))
	}
	// Its stream to a ends: a, which saw it end, no longer counts it
	// (within the grace too); it comes back.
	a.detach(nc)
	if a.Connected("n1") {
		t.Error("n1's stream to a ended: still connected on a")
	}
	connectNode(t, a, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	clock.Set(t0.Add(16 * time.Second)) // silent beyond the 15 s grace
	if err := b.loadNodes(t.Context()); err != nil {
		t.Fatal(err)
	}
	if b.Connected("n1") {
		t.Error("n1 silent beyond the grace is connected on b")
	}
	if !a.Connected("n1") {
		t.Error("n1 holds its stream to a: not connected on a")
	}
}

// TestPeriodicReloadsOffPass: a pass reloads the node and fleet records
// only when never loaded or marked stale (a notification); their periodic
// reload is reloadEvery's, off the passes, so that a pass placing a
// Workspace never waits for one.
func TestPeriodicReloadsOffPass(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	connectNode(t, r, hello("n1", 1024, 1000, "", workspace.DefaultTemplate))
	loaded := func() (nodes, fleet time.Time) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.nodeCache.loaded, r.fleet.loaded
	}
	age := func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.nodeCache.loaded = r.nodeCache.loaded.Add(-time.Hour)
		r.fleet.loaded = r.fleet.loaded.Add(-time.Hour)
	}
	if err := r.pass(t.Context()); err != nil { // the first pass loads both
		t.Fatal(err)
	}
	if n, f := loaded(); n.IsZero() || f.IsZero() {
		t.Fatalf("after the first pass: nodes loaded %v, fleet loaded %v; want both", n, f)
	}
	age()
	n0, f0 := loaded()
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, f := loaded(); !n.Equal(n0) || !f.Equal(f0) {
		t.Fatal("a pass reloaded records that were only old: that is reloadEvery's work")
	}
	r.NodesChanged()
	r.mu.Lock()
	r.fleet.stale = true
	r.mu.Unlock()
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, f := loaded(); n.Equal(n0) || f.Equal(f0) {
		t.Fatal("a pass did not reload the records marked stale")
	}
	age()
	n0, f0 = loaded()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { r.reloadEvery(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if !eventually(5*reloadTick, func() bool { n, f := loaded(); return !n.Equal(n0) && !f.Equal(f0) }) {
		t.Fatal("reloadEvery did not reload the records older than their bounds")
	}
}
