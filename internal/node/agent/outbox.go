package agent

import (
	"sync"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// outbox holds the reports not yet sent, at most one per workspace: a newer
// report replaces the pending one (ctrl needs the latest observation, not
// every step), so the outbox is bounded by the number of workspaces and
// never drops the last word about one. Workspaces are sent in the order
// they first got a pending report.
type outbox struct {
	mu      sync.Mutex
	pending map[string]*nodev1.ExecutionReport
	order   []string
	ready   chan struct{} // signalled when a report is pending
}

func newOutbox() *outbox {
	return &outbox{pending: map[string]*nodev1.ExecutionReport{}, ready: make(chan struct{}, 1)}
}

// put queues rep, replacing a pending report of the same workspace. A
// pending guest exit is kept on a later STOPPED report of the same
// generation: ctrl records the guest's own shutdown from it.
func (o *outbox) put(rep *nodev1.ExecutionReport) {
	o.mu.Lock()
	id := rep.GetWorkspaceId()
	if old, ok := o.pending[id]; ok {
		if old.GetGuestExited() && old.GetGeneration() == rep.GetGeneration() &&
			rep.GetState() == nodev1.ExecState_EXEC_STATE_STOPPED && !rep.GetGuestExited() {
			rep.GuestExited = true
		}
	} else {
		o.order = append(o.order, id)
	}
	o.pending[id] = rep
	o.mu.Unlock()
	o.signal()
}

// putBack returns a report that could not be sent, unless a newer one of
// the same workspace is pending.
func (o *outbox) putBack(rep *nodev1.ExecutionReport) {
	o.mu.Lock()
	id := rep.GetWorkspaceId()
	if _, ok := o.pending[id]; !ok {
		o.pending[id] = rep
		o.order = append([]string{id}, o.order...)
	}
	o.mu.Unlock()
	o.signal()
}

// take removes and returns the oldest pending report.
func (o *outbox) take() (*nodev1.ExecutionReport, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.order) == 0 {
		return nil, false
	}
	id := o.order[0]
	o.order = o.order[1:]
	rep := o.pending[id]
	delete(o.pending, id)
	if len(o.order) > 0 {
		o.signal()
	}
	return rep, true
}

func (o *outbox) signal() {
	select {
	case o.ready <- struct{}{}:
	default:
	}
}
