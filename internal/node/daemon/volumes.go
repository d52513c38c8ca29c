package daemon

import (
	"context"

	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

// The node's storage: the writable layers' resize and the Volume images
// (sandbox's volume.go), for the agent. Errors no retry can fix (an invalid
// id or capacity, a capacity smaller than the image's, a pool that cannot
// hold it: sandbox.Permanent) are marked agent.Permanent.

// permanent marks the sandbox's permanent errors for the agent.
func permanent(err error) error {
	if sandbox.Permanent(err) {
		return agent.Permanent(err)
	}
	return err
}

// Resize grows a stopped workspace's writable layer in place.
func (r *Runtime) Resize(ctx context.Context, id string, capacityBytes uint64) error {
	return permanent(r.rt.Resize(ctx, id, capacityBytes))
}

// EnsureVolume creates a Volume's image or grows it.
func (r *Runtime) EnsureVolume(ctx context.Context, id string, capacityBytes uint64) error {
	_, err := r.rt.EnsureVolume(ctx, id, capacityBytes)
	return permanent(err)
}

// DeleteVolume removes a Volume's image.
func (r *Runtime) DeleteVolume(ctx context.Context, id string) error {
	return permanent(r.rt.DeleteVolume(ctx, id))
}

// VolumeStatus describes a Volume's image.
func (r *Runtime) VolumeStatus(id string) agent.VolumeStatus {
	st, ok := r.rt.VolumeStatus(id)
	return agent.VolumeStatus{VolumeID: id, Exists: ok, CapacityBytes: st.CapacityBytes, Mounted: st.MountedBy != ""}
}

// Volumes lists the Volume images the node holds.
func (r *Runtime) Volumes() []agent.VolumeStatus {
	var out []agent.VolumeStatus
	for _, st := range r.rt.Volumes() {
		out = append(out, agent.VolumeStatus{VolumeID: st.VolumeID, Exists: true, CapacityBytes: st.CapacityBytes,
			Mounted: st.MountedBy != ""})
	}
	return out
}

var _ agent.VolumeRuntime = (*Runtime)(nil)
