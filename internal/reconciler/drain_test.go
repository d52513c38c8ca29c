package reconciler

import (
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// TestDrainRule: while n1 is DRAINING with stop_workspaces, a Workspace
// that was STARTING at drain time is left alone until it is AVAILABLE,
// then stopped once (a normal stop by NODE_DRAIN under
// "<drain>#stop/<workspace>/<generation>", sent to the node in the same
// pass), and neither this loop's next passes nor another replica's repeat
// it; a Workspace of another node is left alone. Once the drain is
// cancelled — even before this replica's cached view knows — a Workspace
// turning AVAILABLE keeps running. Both dialects.
func TestDrainRule(t *testing.T) {
	memDialects(t, func(e *memEnv) {
		t := e.t
		seed(t, e.st, t0, row{id: "ws-s", node: "n1", power: store.PowerRunning, generation: 2, observed: 1,
			exec: store.ExecStopped, state: ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING})
		seed(t, e.st, t0, row{id: "ws-o", node: "n2", power: store.PowerRunning, generation: 1, observed: 1,
			exec: store.ExecRunning, state: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE})
		setRecord(t, e.st, "n1", func(rec *fleet.Record) {
			rec.State, rec.DrainStopsWorkspaces, rec.DrainCommandID = fleet.StateDraining, true, "drain-1"
		})
		if err := e.r.loadFleet(t.Context()); err != nil {
			t.Fatal(err)
		}
		pass := func(r *Reconciler) {
			t.Helper()
			if err := r.pass(t.Context()); err != nil {
				t.Fatalf("pass = %v", err)
			}
		}
		pass(e.r)
		if w, _ := load(t, e.st, "ws-s"); w.Power != store.PowerRunning || w.Generation != 2 {
			t.Fatalf("a STARTING workspace was changed: power %v, generation %d", w.Power, w.Generation)
		}

		e.report("ws-s", nodev1.ExecState_EXEC_STATE_RUNNING, true)
		if _, pub := load(t, e.st, "ws-s"); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			t.Fatalf("ws-s is %v after the node's report, want AVAILABLE", pub.GetState())
		}
		nc := e.r.nodes["n1"]
		for len(nc.send) > 0 {
			<-nc.send
		}
		pass(e.r)
		id := workspace.DrainRuleStopCommandID("drain-1", "ws-s", 2)
		c := loadCommand(t, e.st, id)
		if c.Status != store.CommandProcessing || ctrlv1.CommandInitiator(c.Initiator) != ctrlv1.CommandInitiator_COMMAND_INITIATOR_NODE_DRAIN ||
			ctrlv1.WorkspaceCommandKind(c.Kind) != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP || c.ObjectID != "ws-s" {
			t.Fatalf("command %s = %+v, want a PROCESSING STOP of ws-s by NODE_DRAIN", id, c)
		}
		w, _ := load(t, e.st, "ws-s")
		if w.Power != store.PowerStopped || w.ForceStop || w.CommandID != id || w.Generation != 3 {
			t.Fatalf("ws-s: power %v, force %v, command %q, generation %d; want a normal stop under %s at generation 3",
				w.Power, w.ForceStop, w.CommandID, w.Generation, id)
		}
		if len(nc.send) != 1 {
			t.Fatalf("%d messages sent, want the stop", len(nc.send))
		}
		if d := (<-nc.send).GetDesired().GetWorkspaces(); len(d) != 1 || d[0].GetWorkspaceId() != "ws-s" || d[0].GetGeneration() != 3 {
			t.Errorf("desired = %v, want ws-s at generation 3", d)
		}
		if w, _ := load(t, e.st, "ws-o"); w.Power != store.PowerRunning || w.Generation != 1 {
			t.Errorf("the workspace of another node was changed: power %v, generation %d", w.Power, w.Generation)
		}

		// Not repeated: the next pass, another replica.
		r2 := New(Config{Store: e.st, Now: e.clock.Now})
		if err := r2.loadFleet(t.Context()); err != nil {
			t.Fatal(err)
		}
		pass(e.r)
		if err := r2.drainRules(t.Context()); err != nil {
			t.Fatal(err)
		}
		if w, _ := load(t, e.st, "ws-s"); w.Generation != 3 || w.CommandID != id {
			t.Errorf("the stop was repeated: generation %d, command %q", w.Generation, w.CommandID)
		}

		// CancelNodeDrain (another replica's: this one's view still says
		// DRAINING) ends the rule.
		seed(t, e.st, t0, row{id: "ws-c", node: "n1", power: store.PowerRunning, generation: 1, observed: 0,
			exec: store.ExecStopped, state: ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING})
		setRecord(t, e.st, "n1", func(rec *fleet.Record) {
			rec.State, rec.DrainStopsWorkspaces, rec.DrainCommandID = fleet.StateActive, false, ""
		})
		e.report("ws-c", nodev1.ExecState_EXEC_STATE_RUNNING, true)
		pass(e.r)
		pass(e.r)
		if w, pub := load(t, e.st, "ws-c"); w.Power != store.PowerRunning || pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			t.Errorf("ws-c after the drain was cancelled: power %v, state %v; want running, AVAILABLE", w.Power, pub.GetState())
		}
		e.r.mu.Lock()
		st := e.r.fleetView().State("n1")
		e.r.mu.Unlock()
		if st != fleet.StateActive {
			t.Errorf("the cached view says n1 is %s, want ACTIVE (reloaded)", st)
		}
	})
}
