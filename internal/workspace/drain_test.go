package workspace_test

import (
	"context"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
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
