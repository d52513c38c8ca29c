package agent

import (
	"context"
	"errors"
	"time"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// Volumes. ctrl sends the node's desired Volume images in
// DesiredState.volumes (all of them when full); the agent drives the
// runtime to each (create or grow to capacity_bytes, or delete), one worker
// per Volume as for workspaces, every action idempotent, and answers each
// with a VolumeReport of the generation it acted on. A full desired state
// also deletes the images the node holds that it does not list and no
// execution mounts (ctrl does not know them). Hello.volumes lists the
// images held (generation 0). A workspace mounts its Volume from its start
// (Spec.Volume, from DesiredWorkspace.volume).

// VolumeRuntime is a Runtime that holds Volume images (the sandbox's,
// through the daemon). Errors no retry can fix (a smaller capacity than
// the image's, a pool that cannot hold it) are Permanent.
type VolumeRuntime interface {
	// EnsureVolume creates the image at capacityBytes or grows it to that
	// size (never shrinks); refused while an execution mounts it and it
	// must grow.
	EnsureVolume(ctx context.Context, volumeID string, capacityBytes uint64) error
	// DeleteVolume removes the image (none is no error); refused while an
	// execution mounts it.
	DeleteVolume(ctx context.Context, volumeID string) error
	// VolumeStatus describes one image.
	VolumeStatus(volumeID string) VolumeStatus
	// Volumes lists the images held.
	Volumes() []VolumeStatus
}

// VolumeStatus is one Volume image.
type VolumeStatus struct {
	VolumeID      string
	Exists        bool
	CapacityBytes uint64
	// Mounted: an execution mounts it.
	Mounted bool
}

// volumeWork is the Volumes' desired state and workers (under Agent.mu).
type volumeWork struct {
	desired map[string]*volumeWant
	busy    map[string]bool // a worker runs for the Volume
	dirty   map[string]bool // desired changed while the worker ran
}

func newVolumeWork() volumeWork {
	return volumeWork{desired: map[string]*volumeWant{}, busy: map[string]bool{}, dirty: map[string]bool{}}
}

// volumeWant is what the agent wants of a Volume: ctrl's desired Volume,
// or, for an image a full desired state did not list, its deletion
// (orphan: not reported, ctrl does not know it).
type volumeWant struct {
	d      *nodev1.DesiredVolume
	orphan bool
}

// applyVolumes records the desired Volumes of d and wakes their workers.
func (a *Agent) applyVolumes(ctx context.Context, d *nodev1.DesiredState) {
	vr, ok := a.cfg.Runtime.(VolumeRuntime)
	if !ok {
		if len(d.GetVolumes()) > 0 {
			a.cfg.Log.Warn("desired Volumes ignored: the runtime holds none", "volumes", len(d.GetVolumes()))
		}
		return
	}
	var held []VolumeStatus
	if d.GetFull() {
		held = vr.Volumes()
	}
	listed := map[string]bool{}
	var orphans []string
	a.mu.Lock()
	for _, v := range d.GetVolumes() {
		id := v.GetVolumeId()
		listed[id] = true
		if cur := a.vols.desired[id]; cur == nil || cur.orphan || v.GetGeneration() >= cur.d.GetGeneration() {
			a.vols.desired[id] = &volumeWant{d: v}
		}
	}
	for _, st := range held {
		if !listed[st.VolumeID] && !st.Mounted {
			orphans = append(orphans, st.VolumeID)
			a.vols.desired[st.VolumeID] = &volumeWant{d: &nodev1.DesiredVolume{VolumeId: st.VolumeID, Deleted: true}, orphan: true}
		}
	}
	a.mu.Unlock()
	for id := range listed {
		a.wakeVolume(ctx, vr, id)
	}
	for _, id := range orphans {
		a.cfg.Log.Warn("deleting a Volume image ctrl does not list", "volume_id", id)
		a.wakeVolume(ctx, vr, id)
	}
}

// wakeVolume runs the Volume's worker, or marks it dirty if it runs.
func (a *Agent) wakeVolume(ctx context.Context, vr VolumeRuntime, id string) {
	a.mu.Lock()
	if a.vols.busy[id] {
		a.vols.dirty[id] = true
		a.mu.Unlock()
		return
	}
	a.vols.busy[id] = true
	a.mu.Unlock()
	go func() {
		for {
			a.mu.Lock()
			w := a.vols.desired[id]
			a.vols.dirty[id] = false
			a.mu.Unlock()
			if w != nil {
				a.actVolume(ctx, vr, w)
			}
			a.mu.Lock()
			if !a.vols.dirty[id] || ctx.Err() != nil {
				delete(a.vols.busy, id)
				delete(a.vols.dirty, id)
				if w != nil && w.d.GetDeleted() && a.vols.desired[id] == w {
					delete(a.vols.desired, id)
				}
				a.mu.Unlock()
				return
			}
			a.mu.Unlock()
		}
	}()
}

// actVolume drives one Volume to w and reports the result.
func (a *Agent) actVolume(ctx context.Context, vr VolumeRuntime, w *volumeWant) {
	id, gen := w.d.GetVolumeId(), w.d.GetGeneration()
	a.awaitRelease(ctx, vr, w.d)
	var err error
	if w.d.GetDeleted() {
		err = vr.DeleteVolume(ctx, id)
	} else {
		err = vr.EnsureVolume(ctx, id, w.d.GetCapacityBytes())
	}
	log := a.cfg.Log.With("volume_id", id, "generation", gen)
	if err != nil {
		log.Warn("volume not converged", "deleted", w.d.GetDeleted(), "capacity_bytes", w.d.GetCapacityBytes(),
			"error", failureMessage(err), "permanent", errors.Is(err, ErrPermanent))
	}
	if w.orphan {
		return
	}
	st := vr.VolumeStatus(id)
	rep := &nodev1.VolumeReport{VolumeId: id, Generation: gen, Exists: st.Exists}
	if st.Exists {
		rep.CapacityBytes = st.CapacityBytes
	}
	if err != nil {
		rep.FailureMessage, rep.Permanent = failureMessage(err), errors.Is(err, ErrPermanent)
	}
	a.reports.putVolume(rep)
}

// releaseWait bounds how long a Volume's deletion or growth waits for the
// execution that mounts it to be released by a workspace worker at work
// (a DeleteWorkspace with its Volume, say, arrives in one desired state).
var releaseWait = 30 * time.Second

// awaitRelease waits, when d deletes or grows a Volume that an execution
// mounts while some workspace's worker is at work (which may be releasing
// it), until it is released, no worker is at work, or releaseWait passed;
// the runtime then decides (a Volume still mounted is refused, a failure
// a later retry may pass).
func (a *Agent) awaitRelease(ctx context.Context, vr VolumeRuntime, d *nodev1.DesiredVolume) {
	deadline := time.Now().Add(releaseWait)
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
		st := vr.VolumeStatus(d.GetVolumeId())
		if !st.Mounted || (!d.GetDeleted() && d.GetCapacityBytes() <= st.CapacityBytes) || !a.workersBusy() || time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// workersBusy reports whether some workspace's worker is at work.
func (a *Agent) workersBusy() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, b := range a.busy {
		if b {
			return true
		}
	}
	return false
}

// heldVolumes are Hello.volumes: the images the runtime holds, generation
// 0.
func (a *Agent) heldVolumes() []*nodev1.VolumeReport {
	vr, ok := a.cfg.Runtime.(VolumeRuntime)
	if !ok {
		return nil
	}
	var out []*nodev1.VolumeReport
	for _, st := range vr.Volumes() {
		out = append(out, &nodev1.VolumeReport{VolumeId: st.VolumeID, Exists: true, CapacityBytes: st.CapacityBytes})
	}
	return out
}

// awaitVolume waits, at most releaseWait, while the Volume's worker runs:
// a workspace created with a NEW Volume receives both in one desired
// state, and its start must find the image the Volume's worker is making.
func (a *Agent) awaitVolume(ctx context.Context, id string) {
	deadline := time.Now().Add(releaseWait)
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		a.mu.Lock()
		busy := a.vols.busy[id]
		a.mu.Unlock()
		if !busy || time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}
