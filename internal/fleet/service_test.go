package fleet_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
)

func newService(t *testing.T) (*fleet.Service, store.Store) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key := make([]byte, 32)
	return &fleet.Service{Engine: &command.Engine{Store: st}, Store: st, Pages: paging.NewCodec(key)}, st
}

func addNode(t *testing.T, st store.Store, id string, key []byte) {
	t.Helper()
	if err := st.InTx(t.Context(), func(tx store.Tx) error {
		return tx.UpsertNode(t.Context(), &store.Node{ID: id, CreatedAt: time.Now().UTC().Truncate(time.Microsecond), CertKeyHash: key})
	}); err != nil {
		t.Fatal(err)
	}
}

// TestDrainStopsWorkspaces: without StopWorkspaces, stop_workspaces is
// unimplemented and records nothing; with it, it runs in the drain's
// transaction with the drain's command ID, once, when the option is newly
// set; its failure rolls the drain back.
func TestDrainStopsWorkspaces(t *testing.T) {
	s, st := newService(t)
	ctx := t.Context()
	addNode(t, st, "n1", nil)
	drain := func(id string, stop bool) (*ctrlv1.DrainNodeResponse, error) {
		return s.Drain(ctx, &ctrlv1.DrainNodeRequest{CommandId: id, NodeId: "n1", ExpectedRegistrationVersion: 1, StopWorkspaces: stop})
	}
	_, err := drain("d0", true)
	if fe, ok := fault.As(err); !ok || fe.Kind != fault.KindUnimplemented || fe.Reason != fault.ReasonCapabilityUnavailable {
		t.Fatalf("drain with stop_workspaces and no StopWorkspaces = %v", err)
	}
	var calls []string
	fail := false
	s.StopWorkspaces = func(ctx context.Context, tx store.Tx, nodeID, cmdID string) error {
		calls = append(calls, nodeID+" "+cmdID)
		if fail {
			return fault.Precondition(fault.ReasonStateConflict, "cannot stop")
		}
		return nil
	}
	// d0 recorded nothing: it can be sent again now.
	fail = true
	if _, err := drain("d0", true); fault.KindOf(err) != fault.KindFailedPrecondition {
		t.Fatalf("failing stop = %v", err)
	}
	n, err := s.Get(ctx, "n1")
	if err != nil || n.GetState() != ctrlv1.NodeState_NODE_STATE_ACTIVE {
		t.Fatalf("a failed stop left the node %v, %v", n, err)
	}
	fail, calls = false, nil
	res, err := drain("d1", true)
	if err != nil || !res.GetNode().GetDrainStopsWorkspaces() || res.GetNode().GetState() != ctrlv1.NodeState_NODE_STATE_DRAINING {
		t.Fatalf("drain = %v, %v", res, err)
	}
	if _, err := drain("d2", true); err != nil {
		t.Fatal(err)
	}
	if _, err := drain("d3", false); err != nil {
		t.Fatal(err)
	}
	if _, err := drain("d4", true); err != nil {
		t.Fatal(err)
	}
	if want := []string{"n1 d1", "n1 d4"}; len(calls) != 2 || calls[0] != want[0] || calls[1] != want[1] {
		t.Errorf("StopWorkspaces calls = %v, want %v", calls, want)
	}
}

// TestDrainCommandID: the record keeps the command ID of the DrainNode that
// set stop_workspaces (the standing rule's stops derive theirs from it)
// while the node stays DRAINING with the option; a DrainNode without it,
// CancelNodeDrain and IsolateNode clear it.
func TestDrainCommandID(t *testing.T) {
	s, st := newService(t)
	ctx := t.Context()
	addNode(t, st, "n1", nil)
	s.StopWorkspaces = func(context.Context, store.Tx, string, string) error { return nil }
	rec := func() *fleet.Record {
		t.Helper()
		var r *fleet.Record
		if err := st.View(ctx, func(tx store.Tx) error {
			var err error
			_, r, err = fleet.GetRecord(ctx, tx, "n1")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, step := range []struct {
		name    string
		do      func(id string) error
		id      string
		state   fleet.State
		stop    bool
		drainID string
	}{
		{"drain without the option", func(id string) error {
			_, err := s.Drain(ctx, &ctrlv1.DrainNodeRequest{CommandId: id, NodeId: "n1", ExpectedRegistrationVersion: 1})
			return err
		}, "d1", fleet.StateDraining, false, ""},
		{"the option set", func(id string) error {
			_, err := s.Drain(ctx, &ctrlv1.DrainNodeRequest{CommandId: id, NodeId: "n1", ExpectedRegistrationVersion: 1, StopWorkspaces: true})
			return err
		}, "d2", fleet.StateDraining, true, "d2"},
		{"set again: the first drain's ID stays", func(id string) error {
			_, err := s.Drain(ctx, &ctrlv1.DrainNodeRequest{CommandId: id, NodeId: "n1", ExpectedRegistrationVersion: 1, StopWorkspaces: true})
			return err
		}, "d3", fleet.StateDraining, true, "d2"},
		{"cancelled", func(id string) error {
			_, err := s.CancelDrain(ctx, &ctrlv1.CancelNodeDrainRequest{CommandId: id, NodeId: "n1", ExpectedRegistrationVersion: 1})
			return err
		}, "c1", fleet.StateActive, false, ""},
		{"drained again with the option", func(id string) error {
			_, err := s.Drain(ctx, &ctrlv1.DrainNodeRequest{CommandId: id, NodeId: "n1", ExpectedRegistrationVersion: 1, StopWorkspaces: true})
			return err
		}, "d4", fleet.StateDraining, true, "d4"},
		{"option unset", func(id string) error {
			_, err := s.Drain(ctx, &ctrlv1.DrainNodeRequest{CommandId: id, NodeId: "n1", ExpectedRegistrationVersion: 1})
			return err
		}, "d5", fleet.StateDraining, false, ""},
		{"set once more", func(id string) error {
			_, err := s.Drain(ctx, &ctrlv1.DrainNodeRequest{CommandId: id, NodeId: "n1", ExpectedRegistrationVersion: 1, StopWorkspaces: true})
			return err
		}, "d6", fleet.StateDraining, true, "d6"},
		{"isolated", func(id string) error {
			_, err := s.Isolate(ctx, &ctrlv1.IsolateNodeRequest{CommandId: id, NodeId: "n1", ExpectedRegistrationVersion: 1})
			return err
		}, "i1", fleet.StateIsolated, false, ""},
	} {
		if err := step.do(step.id); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if r := rec(); r.State != step.state || r.DrainStopsWorkspaces != step.stop || r.DrainCommandID != step.drainID {
			t.Errorf("%s: state %s, stop_workspaces %v, drain command %q; want %s, %v, %q", step.name,
				r.State, r.DrainStopsWorkspaces, r.DrainCommandID, step.state, step.stop, step.drainID)
		}
	}
}

// TestHooks: Changed after every committed write, EndDataPlane after an
// isolation, EndKey with each denied key after a retirement; none after a
// refusal.
func TestHooks(t *testing.T) {
	s, st := newService(t)
	ctx := t.Context()
	cert, registered := sha256.Sum256([]byte("cert")), sha256.Sum256([]byte("registered"))
	addNode(t, st, "n1", cert[:])
	if err := st.InTx(ctx, func(tx store.Tx) error {
		_, err := fleet.Register(ctx, tx, "n1", registered[:], false, time.Now().UTC())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var changed int
	var ended [][]byte
	var isolated []string
	s.Changed = func() { changed++ }
	s.EndKey = func(k []byte) { ended = append(ended, k) }
	s.EndDataPlane = func(n string) { isolated = append(isolated, n) }
	s.Connected = func(n string) bool { return n == "n1" }

	if _, err := s.Isolate(ctx, &ctrlv1.IsolateNodeRequest{CommandId: "i0", NodeId: "n1", ExpectedRegistrationVersion: 9}); fault.KindOf(err) != fault.KindAborted {
		t.Fatalf("isolate at version 9 = %v", err)
	}
	if changed != 0 || len(isolated) != 0 {
		t.Errorf("a refusal ran hooks: changed %d, isolated %v", changed, isolated)
	}
	res, err := s.Isolate(ctx, &ctrlv1.IsolateNodeRequest{CommandId: "i1", NodeId: "n1", ExpectedRegistrationVersion: 1})
	if err != nil || !res.GetNode().GetConnected() {
		t.Fatalf("isolate = %v, %v", res, err)
	}
	if changed != 1 || len(isolated) != 1 || isolated[0] != "n1" {
		t.Errorf("after isolate: changed %d, isolated %v", changed, isolated)
	}
	if _, err := s.Retire(ctx, &ctrlv1.RetireNodeRequest{CommandId: "r1", NodeId: "n1", ExpectedRegistrationVersion: 1}); err != nil {
		t.Fatal(err)
	}
	if changed != 2 || len(ended) != 2 || string(ended[0]) != string(cert[:]) || string(ended[1]) != string(registered[:]) {
		t.Errorf("after retire: changed %d, ended %x", changed, ended)
	}
	for _, k := range [][]byte{cert[:], registered[:]} {
		if err := st.View(ctx, func(tx store.Tx) error { _, err := tx.GetDeniedNodeKey(ctx, k); return err }); err != nil {
			t.Errorf("key %x not denied: %v", k, err)
		}
	}
	if _, err := s.SetDefaults(ctx, &ctrlv1.SetOvercommitDefaultsRequest{CommandId: "o1", Overcommit: &ctrlv1.Overcommit{MemoryRatio: 1, CpuRatio: 2}}); err != nil {
		t.Fatal(err)
	}
	if changed != 3 {
		t.Errorf("after SetOvercommitDefaults: changed %d", changed)
	}
	// The defaults reach the View placement reads.
	if err := st.View(ctx, func(tx store.Tx) error {
		v, err := fleet.Load(ctx, tx)
		if err == nil && (v.Defaults.CPU != 2 || v.DefaultsVersion != 1 || v.State("n1") != fleet.StateRetired) {
			err = errors.New("view does not show the writes")
		}
		return err
	}); err != nil {
		t.Error(err)
	}
}

// BenchmarkListNodes1000 is ListNodes of 1,000 hollow nodes in one page
// (SQLite).
func BenchmarkListNodes1000(b *testing.B) {
	st, err := sqlite.Open(context.Background(), b.TempDir()+"/ctrl.db")
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	s := &fleet.Service{Engine: &command.Engine{Store: st}, Store: st, Pages: paging.NewCodec(make([]byte, 32))}
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := st.InTx(ctx, func(tx store.Tx) error {
		for i := range 1000 {
			if err := tx.UpsertNode(ctx, &store.Node{ID: fmt.Sprintf("node-%04d", i), CreatedAt: now, MemoryMiB: 8192, CPUMillis: 4000}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		res, err := s.List(ctx, &ctrlv1.ListNodesRequest{PageSize: 1000})
		if err != nil || len(res.GetNodes()) != 1000 {
			b.Fatalf("List = %d nodes, %v", len(res.GetNodes()), err)
		}
	}
}
