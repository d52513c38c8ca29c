package agent

import (
	"sync"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// outbox holds the reports not yet sent, at most one per workspace and one
// per Volume: a newer report replaces the pending one (ctrl needs the
// latest observation, not every step), so the outbox is bounded by the
// number of workspaces and Volumes and never drops the last word about one.
// Reports are sent in the order their workspace or Volume first got a
// pending report.
type outbox struct {
	mu      sync.Mutex
	pending map[string]*nodev1.ExecutionReport // by workspace
	volumes map[string]*nodev1.VolumeReport    // by Volume
	order   []outKey
	ready   chan struct{} // signalled when a report is pending
}

// outKey names a pending report: a workspace's, or a Volume's.
type outKey struct {
	volume bool
	id     string
}

func newOutbox() *outbox {
	return &outbox{pending: map[string]*nodev1.ExecutionReport{}, volumes: map[string]*nodev1.VolumeReport{},
		ready: make(chan struct{}, 1)}
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
		o.order = append(o.order, outKey{id: id})
	}
	o.pending[id] = rep
	o.mu.Unlock()
	o.signal()
}

// putVolume queues rep, replacing a pending report of the same Volume.
func (o *outbox) putVolume(rep *nodev1.VolumeReport) {
	o.mu.Lock()
	id := rep.GetVolumeId()
	if _, ok := o.volumes[id]; !ok {
		o.order = append(o.order, outKey{volume: true, id: id})
	}
	o.volumes[id] = rep
	o.mu.Unlock()
	o.signal()
}

// putBack returns a report (a ConnectRequest take gave) that could not be
// sent, unless a newer one of the same workspace or Volume is pending.
func (o *outbox) putBack(msg *nodev1.ConnectRequest) {
	o.mu.Lock()
	if rep := msg.GetReport(); rep != nil {
		id := rep.GetWorkspaceId()
		if _, ok := o.pending[id]; !ok {
			o.pending[id] = rep
			o.order = append([]outKey{{id: id}}, o.order...)
		}
	} else if rep := msg.GetVolumeReport(); rep != nil {
		id := rep.GetVolumeId()
		if _, ok := o.volumes[id]; !ok {
			o.volumes[id] = rep
			o.order = append([]outKey{{volume: true, id: id}}, o.order...)
		}
	}
	o.mu.Unlock()
	o.signal()
}

// take removes and returns the oldest pending report as the message that
// sends it.
func (o *outbox) take() (*nodev1.ConnectRequest, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.order) == 0 {
		return nil, false
	}
	k := o.order[0]
	o.order = o.order[1:]
	if len(o.order) > 0 {
		o.signal()
	}
	if k.volume {
		rep := o.volumes[k.id]
		delete(o.volumes, k.id)
		return &nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_VolumeReport{VolumeReport: rep}}, true
	}
	rep := o.pending[k.id]
	delete(o.pending, k.id)
	return &nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Report{Report: rep}}, true
}

func (o *outbox) signal() {
	select {
	case o.ready <- struct{}{}:
	default:
	}
}
