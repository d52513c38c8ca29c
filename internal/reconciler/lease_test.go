package reconciler

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// TestFleetLease: a replica without the fleet lease (Config.Leader false)
// does none of the fleet-wide work — it places nothing, fails no placement
// at its timeout and marks no silent node's Workspaces UNKNOWN — while it
// still pushes to the node connected to it (stream-holder work); once it
// holds the lease, its next pass does that work, judging silence from when
// it took the lease (or started).
func TestFleetLease(t *testing.T) {
	t.Run("placement timeout", func(t *testing.T) {
		var leads atomic.Bool
		r, st, clock := newTest(t, Config{PlacementTimeout: time.Minute, Leader: leads.Load})
		seed(t, st, t0, row{id: "ws-1", power: running, generation: 1, state: wsCreate, memMiB: 256, command: "c-1"})
		clock.Set(t0.Add(time.Hour))
		if err := r.pass(t.Context()); err != nil {
			t.Fatalf("pass = %v", err)
		}
		if _, pub := load(t, st, "ws-1"); pub.GetState() != wsCreate {
			t.Fatalf("non-holder: state = %v, want %v", pub.GetState(), wsCreate)
		}
		if c := loadCommand(t, st, "c-1"); c.Status != store.CommandProcessing {
			t.Fatalf("non-holder completed the command (%q)", c.ErrorCode)
		}
		leads.Store(true)
		if err := r.pass(t.Context()); err != nil {
			t.Fatalf("pass = %v", err)
		}
		if _, pub := load(t, st, "ws-1"); pub.GetState() != wsFailed {
			t.Fatalf("holder: state = %v, want %v", pub.GetState(), wsFailed)
		}
	})
	t.Run("silent node", func(t *testing.T) {
		var leads atomic.Bool
		r, st, clock := newTest(t, Config{NodeGrace: time.Second, Leader: leads.Load})
		nc := connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
		seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 1, observed: 1, exec: store.ExecRunning, state: wsAvail})
		r.detach(nc)
		clock.Set(t0.Add(time.Minute))
		if err := r.pass(t.Context()); err != nil {
			t.Fatalf("pass = %v", err)
		}
		if _, pub := load(t, st, "ws-1"); pub.GetState() != wsAvail {
			t.Fatalf("non-holder: state = %v, want %v", pub.GetState(), wsAvail)
		}
		leads.Store(true)
		if err := r.pass(t.Context()); err != nil {
			t.Fatalf("pass = %v", err)
		}
		// It judges from when it took the lease: the node gets the grace
		// again from there.
		if _, pub := load(t, st, "ws-1"); pub.GetState() != wsAvail {
			t.Fatalf("holder, at once: state = %v, want %v", pub.GetState(), wsAvail)
		}
		clock.Set(t0.Add(time.Minute + 1001*time.Millisecond))
		if err := r.pass(t.Context()); err != nil {
			t.Fatalf("pass = %v", err)
		}
		if _, pub := load(t, st, "ws-1"); pub.GetState() != wsUnk {
			t.Fatalf("holder, the grace after: state = %v, want UNKNOWN", pub.GetState())
		}
	})
	t.Run("restart", func(t *testing.T) {
		// A node last heard an hour before this ctrl started gets the
		// grace from the start: the time nobody could hear it does not
		// count.
		r, st, clock := newTest(t, Config{NodeGrace: time.Second})
		nc := connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
		seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 1, observed: 1, exec: store.ExecRunning, state: wsAvail})
		r.detach(nc)
		clock.Set(t0.Add(time.Hour))
		restarted := newReplica(st, clock, Config{NodeGrace: time.Second})
		if err := restarted.loadNodes(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := restarted.pass(t.Context()); err != nil {
			t.Fatalf("pass = %v", err)
		}
		if _, pub := load(t, st, "ws-1"); pub.GetState() != wsAvail {
			t.Fatalf("at the start: state = %v, want %v", pub.GetState(), wsAvail)
		}
		clock.Set(t0.Add(time.Hour + 1001*time.Millisecond))
		if err := restarted.pass(t.Context()); err != nil {
			t.Fatalf("pass = %v", err)
		}
		if _, pub := load(t, st, "ws-1"); pub.GetState() != wsUnk {
			t.Fatalf("the grace after the start: state = %v, want UNKNOWN", pub.GetState())
		}
	})
	t.Run("placement", func(t *testing.T) {
		// A replica places, at once, what it admitted; what another
		// replica admitted is the holder's once handoff has passed.
		// Pushing a placed one is every stream holder's work.
		var leads atomic.Bool
		r, st, clock := newTest(t, Config{Leader: leads.Load})
		nc := connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
		seed(t, st, t0, row{id: "ws-1", power: running, generation: 1, state: wsCreate, memMiB: 256, command: "c-1"})
		seed(t, st, t0, row{id: "ws-2", node: "n1", power: running, generation: 1, state: wsCreate, memMiB: 256, command: "c-2"})
		seed(t, st, t0, row{id: "ws-3", power: running, generation: 1, state: wsCreate, memMiB: 256, command: "c-3"})
		r.Admitted("ws-3")
		pass := func() {
			t.Helper()
			if err := r.pass(t.Context()); err != nil {
				t.Fatalf("pass = %v", err)
			}
		}
		pass()
		if w, _ := load(t, st, "ws-1"); w.NodeID != "" {
			t.Fatalf("non-holder placed ws-1, admitted elsewhere, on %q", w.NodeID)
		}
		if w, _ := load(t, st, "ws-3"); w.NodeID != "n1" || len(nc.send) != 2 {
			t.Fatalf("non-holder: ws-3 (admitted here) NodeID = %q, %d sent; want n1, 2 (ws-2, ws-3)", w.NodeID, len(nc.send))
		}
		leads.Store(true)
		clock.Set(t0.Add(handoff - time.Millisecond))
		pass()
		if w, _ := load(t, st, "ws-1"); w.NodeID != "" {
			t.Fatalf("holder placed ws-1 before handoff, on %q", w.NodeID)
		}
		clock.Set(t0.Add(handoff))
		pass()
		if w, _ := load(t, st, "ws-1"); w.NodeID != "n1" || len(nc.send) != 3 {
			t.Fatalf("holder after handoff: ws-1 NodeID = %q, %d sent; want n1, 3", w.NodeID, len(nc.send))
		}
	})
}
