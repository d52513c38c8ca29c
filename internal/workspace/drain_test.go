package workspace_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// TestStopForDrain: a drain with stop_workspaces stops, as StopWorkspace
// would, each AVAILABLE Workspace desired RUNNING on the node, under the
// command ID "<drain>#stop/<workspace>" with initiator NODE_DRAIN; a
// Workspace already stopping, one between states and those of other nodes
// are left alone; a resend of the drain changes nothing. Both dialects.
func TestStopForDrain(t *testing.T) {
	bothDialects(t, func(t *testing.T, st store.Store) {
		s, _ := expService(t, st)
		ctx := context.Background()
		avail := create(t, s, "dr-avail")
		completeCommand(t, st, "dr-avail")
		makeAvailable(t, st, avail.GetWorkspaceId()) // on node-1
		stopping := create(t, s, "dr-stopping")
		completeCommand(t, st, "dr-stopping")
		makeAvailable(t, st, stopping.GetWorkspaceId())
		editWorkspace(t, st, stopping.GetWorkspaceId(), func(w *store.Workspace, pub *ctrlv1.Workspace) {
			w.Power, pub.State = store.PowerStopped, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
		})
		creating := create(t, s, "dr-creating") // placed, still CREATING
		editWorkspace(t, st, creating.GetWorkspaceId(), func(w *store.Workspace, _ *ctrlv1.Workspace) { w.NodeID = "node-1" })
		other := create(t, s, "dr-other")
		completeCommand(t, st, "dr-other")
		makeAvailable(t, st, other.GetWorkspaceId())
		editWorkspace(t, st, other.GetWorkspaceId(), func(w *store.Workspace, _ *ctrlv1.Workspace) { w.NodeID = "node-2" })

		rows := func() map[string]*store.Workspace {
			out := map[string]*store.Workspace{}
			for _, id := range []string{avail.GetWorkspaceId(), stopping.GetWorkspaceId(), creating.GetWorkspaceId(), other.GetWorkspaceId()} {
				w, _ := row(t, st, id)
				out[id] = w
			}
			return out
		}
		before := rows()
		drain := func() {
			t.Helper()
			if err := st.InTx(ctx, func(tx store.Tx) error { return s.StopForDrain(ctx, tx, "node-1", "drain-1") }); err != nil {
				t.Fatalf("StopForDrain = %v", err)
			}
		}
		drain()
		id := workspace.DrainStopCommandID("drain-1", avail.GetWorkspaceId())
		if id != "drain-1#stop/"+avail.GetWorkspaceId() {
			t.Errorf("command ID = %q", id)
		}
		c, err := s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: id})
		if err != nil || c.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_NODE_DRAIN ||
			c.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP ||
			c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING || c.GetWorkspaceId() != avail.GetWorkspaceId() {
			t.Fatalf("GetWorkspaceCommand(%s) = %v, %v; want a PROCESSING STOP by NODE_DRAIN", id, c, err)
		}
		after := rows()
		w, pub := row(t, st, avail.GetWorkspaceId())
		if w.Power != store.PowerStopped || w.ForceStop || w.CommandID != id || w.Generation != before[w.ID].Generation+1 ||
			pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING {
			t.Errorf("drained workspace: power %v, force %v, command %q, generation %d, state %v; want a normal stop in flight",
				w.Power, w.ForceStop, w.CommandID, w.Generation, pub.GetState())
		}
		for _, ws := range []string{stopping.GetWorkspaceId(), creating.GetWorkspaceId(), other.GetWorkspaceId()} {
			if after[ws].Generation != before[ws].Generation || after[ws].CommandID != before[ws].CommandID {
				t.Errorf("workspace %s changed: generation %d → %d, command %q → %q", ws,
					before[ws].Generation, after[ws].Generation, before[ws].CommandID, after[ws].CommandID)
			}
			if _, err := s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: workspace.DrainStopCommandID("drain-1", ws)}); err == nil {
				t.Errorf("a drain stop of %s was recorded", ws)
			}
		}

		// A resend finds the stop recorded, even once it completed and the
		// Workspace was started again.
		completeCommand(t, st, id)
		editWorkspace(t, st, avail.GetWorkspaceId(), func(w *store.Workspace, pub *ctrlv1.Workspace) {
			w.Power, w.CommandID, w.ObservedGeneration = store.PowerRunning, "", w.Generation
			pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
		})
		again := rows()
		drain()
		if w, _ := row(t, st, avail.GetWorkspaceId()); w.Generation != again[w.ID].Generation || w.Power != store.PowerRunning {
			t.Errorf("the resend stopped again: generation %d → %d", again[w.ID].Generation, w.Generation)
		}
	})
}

// editWorkspace edits a Workspace's row and document.
func editWorkspace(t *testing.T, st store.Store, id string, edit func(*store.Workspace, *ctrlv1.Workspace)) {
	t.Helper()
	err := st.InTx(context.Background(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(context.Background(), id)
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		edit(w, pub)
		if err := workspace.Save(w, pub, time.Now().UTC().Truncate(time.Microsecond)); err != nil {
			return err
		}
		return tx.UpdateWorkspace(context.Background(), w)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// putNode writes node-1's fleet record: state, and drained with
// stop_workspaces under drain when drain is not empty.
func putNode(t *testing.T, st store.Store, state fleet.State, drain string) {
	t.Helper()
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		r, _, err := fleet.GetRecord(t.Context(), tx, "node-1")
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		rec := &fleet.Record{RegistrationVersion: 1, State: state, DrainStopsWorkspaces: drain != "", DrainCommandID: drain}
		return fleet.PutRecord(t.Context(), tx, r, "node-1", rec, time.Now().UTC().Truncate(time.Microsecond))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestStartOnNodeDrainingWithStop: StartWorkspace on a node DRAINING with
// stop_workspaces is refused (failed_precondition, STATE_CONFLICT) and
// changes nothing; on a node DRAINING without the option it starts.
func TestStartOnNodeDrainingWithStop(t *testing.T) {
	bothDialects(t, func(t *testing.T, st store.Store) {
		s, _ := expService(t, st)
		ws := create(t, s, "sd-create").GetWorkspaceId()
		completeCommand(t, st, "sd-create")
		stopped(t, st, ws) // on node-1
		putNode(t, st, fleet.StateDraining, "drain-1")
		before, _ := row(t, st, ws)
		_, err := s.Start(t.Context(), &ctrlv1.StartWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "sd-start-1"}, WorkspaceId: ws, ExpectedExpirationRevision: 1})
		fe, ok := fault.As(err)
		if !ok || fe.Kind != fault.KindFailedPrecondition || fe.Reason != fault.ReasonStateConflict ||
			!strings.Contains(fe.Message, "draining with stop_workspaces") {
			t.Fatalf("Start on a node draining with stop_workspaces = %v; want failed_precondition STATE_CONFLICT", err)
		}
		if w, _ := row(t, st, ws); w.Generation != before.Generation || w.Power != store.PowerStopped {
			t.Errorf("the refused start changed the workspace: generation %d → %d, power %v", before.Generation, w.Generation, w.Power)
		}
		putNode(t, st, fleet.StateDraining, "")
		res, err := s.Start(t.Context(), &ctrlv1.StartWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "sd-start-2"}, WorkspaceId: ws, ExpectedExpirationRevision: 1})
		if err != nil || res.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING {
			t.Fatalf("Start on a node draining without the option = %v, %v; want STARTING", res, err)
		}
	})
}

// TestStopForDrainRule: the standing rule stops a Workspace of the node
// once it is AVAILABLE (not while CREATING or STARTING), under
// "<drain>#stop/<workspace>/<generation>" with initiator NODE_DRAIN; a
// second try at the same generation — a replica that read the Workspace
// before the first stop committed — finds the command and stops nothing;
// a later start of the Workspace gets a stop under a new ID.
func TestStopForDrainRule(t *testing.T) {
	bothDialects(t, func(t *testing.T, st store.Store) {
		s, _ := expService(t, st)
		ctx := t.Context()
		ws := create(t, s, "dr-rule").GetWorkspaceId()
		editWorkspace(t, st, ws, func(w *store.Workspace, _ *ctrlv1.Workspace) { w.NodeID = "node-1" }) // CREATING
		rule := func() []string {
			t.Helper()
			var out []string
			if err := st.InTx(ctx, func(tx store.Tx) error {
				var err error
				out, err = s.StopForDrainRule(ctx, tx, "node-1", "drain-1")
				return err
			}); err != nil {
				t.Fatalf("StopForDrainRule = %v", err)
			}
			return out
		}
		if got := rule(); len(got) != 0 {
			t.Fatalf("a CREATING workspace was stopped: %v", got)
		}
		completeCommand(t, st, "dr-rule")
		makeAvailable(t, st, ws)
		w, _ := row(t, st, ws)
		gen := w.Generation
		on := []*store.Workspace{w}
		if !workspace.DrainRuleDue(on) {
			t.Error("DrainRuleDue = false for an AVAILABLE workspace")
		}
		if got := rule(); len(got) != 1 || got[0] != ws {
			t.Fatalf("stopped %v, want [%s]", got, ws)
		}
		id := workspace.DrainRuleStopCommandID("drain-1", ws, gen)
		if want := fmt.Sprintf("drain-1#stop/%s/%d", ws, gen); id != want {
			t.Errorf("command ID = %q, want %q", id, want)
		}
		c, err := s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: id})
		if err != nil || c.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_NODE_DRAIN ||
			c.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP || c.GetWorkspaceId() != ws {
			t.Fatalf("GetWorkspaceCommand(%s) = %v, %v; want a STOP by NODE_DRAIN", id, c, err)
		}
		if w, _ := row(t, st, ws); w.Power != store.PowerStopped || w.ForceStop || w.CommandID != id {
			t.Fatalf("workspace: power %v, force %v, command %q; want a normal stop under %s", w.Power, w.ForceStop, w.CommandID, id)
		}
		if workspace.DrainRuleDue([]*store.Workspace{func() *store.Workspace { w, _ := row(t, st, ws); return w }()}) {
			t.Error("DrainRuleDue = true for a stopping workspace")
		}
		if got := rule(); len(got) != 0 {
			t.Errorf("stopped again: %v", got)
		}
		// A replica that saw it AVAILABLE at gen tries the same ID.
		completeCommand(t, st, id)
		editWorkspace(t, st, ws, func(w *store.Workspace, pub *ctrlv1.Workspace) {
			w.Power, w.CommandID, w.Generation, w.ObservedGeneration = store.PowerRunning, "", gen, gen
			pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
		})
		if got := rule(); len(got) != 0 {
			t.Errorf("the same stop was made twice: %v", got)
		}
		// Started again since (a later generation): a new stop.
		editWorkspace(t, st, ws, func(w *store.Workspace, _ *ctrlv1.Workspace) { w.Generation, w.ObservedGeneration = gen+2, gen+2 })
		if got := rule(); len(got) != 1 {
			t.Fatalf("the workspace started again was not stopped: %v", got)
		}
		if _, err := s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: workspace.DrainRuleStopCommandID("drain-1", ws, gen+2)}); err != nil {
			t.Errorf("the second stop is not under generation %d: %v", gen+2, err)
		}
	})
}
