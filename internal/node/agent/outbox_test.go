package agent

import (
	"fmt"
	"testing"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

func rep(id string, gen uint64, st nodev1.ExecState) *nodev1.ExecutionReport {
	return &nodev1.ExecutionReport{WorkspaceId: id, Generation: gen, State: st}
}

// drain takes every pending report and returns the workspaces' (Volume
// reports are dropped: drainAll keeps them).
func drain(o *outbox) []*nodev1.ExecutionReport {
	var out []*nodev1.ExecutionReport
	for _, m := range drainAll(o) {
		if r := m.GetReport(); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// drainAll takes every pending report, in order.
func drainAll(o *outbox) []*nodev1.ConnectRequest {
	var out []*nodev1.ConnectRequest
	for {
		m, ok := o.take()
		if !ok {
			return out
		}
		out = append(out, m)
	}
}

func TestOutboxKeepsTheLatestPerWorkspace(t *testing.T) {
	o := newOutbox()
	o.put(rep("a", 1, nodev1.ExecState_EXEC_STATE_STARTING))
	o.put(rep("b", 1, nodev1.ExecState_EXEC_STATE_STARTING))
	o.put(rep("a", 1, nodev1.ExecState_EXEC_STATE_RUNNING))
	got := drain(o)
	if len(got) != 2 || got[0].GetWorkspaceId() != "a" || got[0].GetState() != nodev1.ExecState_EXEC_STATE_RUNNING || got[1].GetWorkspaceId() != "b" {
		t.Fatalf("drained %v", got)
	}
	select {
	case <-o.ready:
	default:
		t.Error("no signal after puts")
	}
}

// TestOutboxNeverDrops: far more reports than any fixed queue held, for
// many workspaces; the last of each arrives.
func TestOutboxNeverDrops(t *testing.T) {
	o := newOutbox()
	const ws, per = 3000, 5
	for g := uint64(1); g <= per; g++ {
		for i := range ws {
			o.put(rep(fmt.Sprint("ws-", i), g, nodev1.ExecState_EXEC_STATE_RUNNING))
		}
	}
	got := drain(o)
	if len(got) != ws {
		t.Fatalf("%d reports, want one per workspace (%d)", len(got), ws)
	}
	for i, r := range got {
		if r.GetWorkspaceId() != fmt.Sprint("ws-", i) || r.GetGeneration() != per {
			t.Fatalf("report %d = %v, want ws-%d generation %d", i, r, i, per)
		}
	}
}

func TestOutboxKeepsGuestExit(t *testing.T) {
	o := newOutbox()
	exited := rep("a", 3, nodev1.ExecState_EXEC_STATE_STOPPED)
	exited.GuestExited = true
	o.put(exited)
	o.put(rep("a", 3, nodev1.ExecState_EXEC_STATE_STOPPED))
	if got := drain(o); len(got) != 1 || !got[0].GetGuestExited() {
		t.Errorf("guest exit lost: %v", got)
	}
	// Not across generations.
	o.put(exited)
	o.put(rep("a", 4, nodev1.ExecState_EXEC_STATE_STOPPED))
	if got := drain(o); len(got) != 1 || got[0].GetGuestExited() {
		t.Errorf("guest exit carried into another generation: %v", got)
	}
}

func TestOutboxPutBack(t *testing.T) {
	o := newOutbox()
	o.put(rep("a", 1, nodev1.ExecState_EXEC_STATE_RUNNING))
	o.put(rep("b", 1, nodev1.ExecState_EXEC_STATE_RUNNING))
	r, _ := o.take() // a, then its send fails
	o.putBack(r)
	if got := drain(o); len(got) != 2 || got[0].GetWorkspaceId() != "a" {
		t.Errorf("put back = %v, want a first again", got)
	}
	// A newer report wins over the one put back.
	o.put(rep("a", 1, nodev1.ExecState_EXEC_STATE_STARTING))
	r, _ = o.take()
	o.put(rep("a", 2, nodev1.ExecState_EXEC_STATE_RUNNING))
	o.putBack(r)
	if got := drain(o); len(got) != 1 || got[0].GetGeneration() != 2 {
		t.Errorf("put back over a newer report = %v", got)
	}
}
