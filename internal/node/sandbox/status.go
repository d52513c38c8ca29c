package sandbox

import (
	"os"
	"sort"
	"time"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// Status describes one execution.
type Status struct {
	WorkspaceID string
	Generation  uint64
	// Running is false for an execution that ended but is still held
	// (release failed); a forced Stop releases it.
	Running      bool
	PID          int
	LayerExists  bool
	Guest        GuestCondition
	GuestMessage string
	StartedAt    time.Time
	// LayerBytes is the writable layer's size.
	LayerBytes uint64
	// TemplateDir is the rootfs the execution runs from (its record's).
	TemplateDir string
	// Network is what the execution's network applies, with the DNS
	// configuration version it started with; nil when the runtime has no
	// networking or holds no execution.
	Network *nodev1.NetworkStatus
}

// Executions lists the executions this runtime holds (after Adopt, also the
// re-adopted ones), sorted by workspace.
func (r *Runtime) Executions() []Status {
	r.mu.Lock()
	list := make([]*execution, 0, len(r.execs))
	for _, e := range r.execs {
		list = append(list, e)
	}
	r.mu.Unlock()
	out := make([]Status, 0, len(list))
	for _, e := range list {
		out = append(out, r.status(e))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].WorkspaceID < out[j].WorkspaceID })
	return out
}

// Status returns the status of one workspace's execution.
func (r *Runtime) Status(workspaceID string) (Status, bool) {
	e := r.get(workspaceID)
	if e == nil {
		st := Status{WorkspaceID: workspaceID}
		if fi, err := os.Stat(r.layerPath(workspaceID)); err == nil {
			st.LayerExists, st.LayerBytes = true, uint64(fi.Size())
		}
		return st, false
	}
	return r.status(e), true
}

// status describes e; the layer size is read from the image.
func (r *Runtime) status(e *execution) Status {
	e.mu.Lock()
	s := Status{
		WorkspaceID:  e.ws,
		Generation:   e.st.Generation,
		Running:      e.alive(),
		PID:          e.st.PID,
		Guest:        e.cond,
		GuestMessage: e.msg,
		StartedAt:    e.st.StartedAt,
		TemplateDir:  e.st.TemplateDir,
	}
	e.mu.Unlock()
	s.Network = r.netStatus(e)
	if fi, err := os.Stat(r.layerPath(e.ws)); err == nil {
		s.LayerExists, s.LayerBytes = true, uint64(fi.Size())
	}
	return s
}

// Stats reads the execution's cgroup.
func (r *Runtime) Stats(workspaceID string) (CgroupStats, error) {
	if r.get(workspaceID) == nil {
		return CgroupStats{}, ErrNotRunning
	}
	return r.cg.stats(r.cgroupRel(workspaceID))
}
