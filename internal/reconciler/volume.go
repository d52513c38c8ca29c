package reconciler

import (
	"context"
	"slices"
	"sort"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/volume"
	"github.com/kibotos/kibotos/internal/workspace"
)

// The Volume side of the reconciler (internal/volume holds the rules):
//
//   - every full desired state lists all of the node's Volumes
//     (volumesOf), which the node creates, grows or deletes;
//   - a Volume whose generation the node has not answered is pushed alone
//     (pushVolumes): the Volumes of commands still PROCESSING (an indexed
//     query of the commands table, which finds the admissions of every
//     replica) and the ones this reconciler changed itself (placed with a
//     NEW binding's Workspace, deleted with one), remembered until sent;
//   - the desired state of a Workspace carries its Volume's mount
//     (DesiredWorkspace.volume) and, in the same message, that Volume's
//     own desired state, so that a node creating both meets the image
//     first;
//   - a VolumeReport is folded in by volume.Report, which completes the
//     waiting command; the Volume's waiters are woken after the commit.

// maxPendingVolumes bounds the Volume commands one pass looks at.
const maxPendingVolumes = 500

// workspaceVolume is the mount a Workspace's binding asks for; nil
// without a Volume.
func workspaceVolume(pub *ctrlv1.Workspace) *nodev1.WorkspaceVolume {
	b := pub.GetVolumeBinding()
	if b.GetMode() != ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND || b.GetVolumeId() == "" {
		return nil
	}
	return &nodev1.WorkspaceVolume{VolumeId: b.GetVolumeId(), MountPath: b.GetMountPath()}
}

// volumesOf is the desired state of every Volume of nc's node, read from
// tx, which it counts as sent.
func (r *Reconciler) volumesOf(ctx context.Context, tx store.Tx, nc *nodeConn) ([]*nodev1.DesiredVolume, error) {
	vols, err := volume.OnNode(ctx, tx, nc.id)
	if err != nil {
		return nil, err
	}
	out := make([]*nodev1.DesiredVolume, 0, len(vols))
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range vols {
		out = append(out, v.Desired())
		nc.volSent[v.Res.ID] = v.Generation
	}
	return out, nil
}

// boundVolume is the desired state of the Volume bound to Workspace w when
// it lives on w's node; nil otherwise.
func boundVolume(ctx context.Context, tx store.Tx, w *store.Workspace) (*nodev1.DesiredVolume, error) {
	pub, err := workspace.Decode(w)
	if err != nil || workspaceVolume(pub) == nil {
		return nil, err
	}
	v, err := volume.BoundVolume(ctx, tx, pub)
	if err != nil || v == nil || v.Node != w.NodeID {
		return nil, err
	}
	return v.Desired(), nil
}

// volumeChanged remembers that Volume id has a generation its node must
// hear of; the next passes push it. It is called inside the transaction
// that makes the change, which a pass may read before it commits: an ID
// whose Volume is not pending yet is kept for volPendingKeep.
func (r *Reconciler) volumeChanged(id string) {
	now := r.now()
	r.mu.Lock()
	r.volPending[id] = now
	r.mu.Unlock()
}

// volPendingKeep is how long a changed Volume that does not read as
// pending yet is looked at again.
const volPendingKeep = 10 * time.Second

// pushVolumes sends each connected node the Volumes whose generation it
// has not answered nor been sent yet.
func (r *Reconciler) pushVolumes(ctx context.Context) error {
	now := r.now()
	r.mu.Lock()
	ids := make([]string, 0, len(r.volPending))
	for id := range r.volPending {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	var vols []*volume.Volume
	err := r.store.View(ctx, func(tx store.Tx) error {
		vols = nil
		cmds, err := tx.ProcessingCommands(ctx, volume.ObjectKind, maxPendingVolumes)
		if err != nil {
			return err
		}
		for _, c := range cmds {
			if !slices.Contains(ids, c.ObjectID) {
				ids = append(ids, c.ObjectID)
			}
		}
		sort.Strings(ids)
		for _, id := range ids {
			v, err := volume.Load(ctx, tx, id)
			switch {
			case err != nil:
				// gone, or a command of no Volume
			case v.Pending():
				vols = append(vols, v)
				continue
			default:
				r.mu.Lock()
				if at, ok := r.volPending[id]; ok && now.Sub(at) < volPendingKeep {
					r.mu.Unlock()
					continue // its change may not be committed yet
				}
				r.mu.Unlock()
			}
			r.mu.Lock()
			delete(r.volPending, id)
			r.mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, v := range vols {
		r.mu.Lock()
		delete(r.volPending, v.Res.ID)
		nc := r.nodes[v.Node]
		if nc == nil || nc.volSent[v.Res.ID] >= v.Generation {
			r.mu.Unlock()
			continue
		}
		nc.volSent[v.Res.ID] = v.Generation
		r.mu.Unlock()
		msg := &nodev1.ConnectResponse{Desired: &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{v.Desired()}}}
		select {
		case nc.send <- msg:
		default:
			r.mu.Lock()
			delete(nc.volSent, v.Res.ID)
			r.volPending[v.Res.ID] = now
			r.mu.Unlock()
		}
	}
	return nil
}

// volumeReport folds a node's VolumeReport into the store and wakes the
// waiters of a command it completed.
func (r *Reconciler) volumeReport(ctx context.Context, node string, rep *nodev1.VolumeReport) error {
	var (
		v         *volume.Volume
		completed bool
	)
	err := r.store.InTx(ctx, func(tx store.Tx) error {
		var err error
		v, completed, err = volume.Report(ctx, tx, node, rep, r.now())
		return err
	})
	if err != nil {
		r.log.Error("apply volume report", "node_id", node, "volume_id", nodewire.Cut(rep.GetVolumeId(), 64), "error", err.Error())
		return err
	}
	if completed {
		r.store.Notify(volume.Topic(v.Res.ID))
	}
	return nil
}

// placeVolume places the Volume of a NEW binding with its Workspace, just
// placed on node, inside tx.
func (r *Reconciler) placeVolume(ctx context.Context, tx store.Tx, pub *ctrlv1.Workspace, node *candidate, now time.Time) error {
	v, err := volume.PlaceWithWorkspace(ctx, tx, pub, node.id, node.pool, now)
	if err != nil || v == nil {
		return err
	}
	r.volumeChanged(v.Res.ID)
	return nil
}

// workspaceGone releases or deletes the Volume of a Workspace whose
// deletion completed, inside that transaction (volume.WorkspaceGone).
func (r *Reconciler) workspaceGone(ctx context.Context, tx store.Tx, pub *ctrlv1.Workspace, now time.Time) error {
	v, err := volume.WorkspaceGone(ctx, tx, pub, now)
	if err != nil || v == nil {
		return err
	}
	r.volumeChanged(v.Res.ID)
	r.Kick()
	return nil
}

// volumeDemand narrows placement for a Workspace bound to a Volume: only
// the node holding the Volume can run it (node != ""), and a Volume of a
// NEW binding not placed yet needs room in the chosen node's pool (extra
// bytes beyond the writable layer).
func volumeDemand(ctx context.Context, tx store.Tx, pub *ctrlv1.Workspace) (node string, extra uint64, err error) {
	v, err := volume.BoundVolume(ctx, tx, pub)
	if err != nil || v == nil {
		return "", 0, err
	}
	if v.Node != "" {
		return v.Node, 0, nil
	}
	return "", v.Capacity, nil
}

// ServesVolumes reports whether a connected node serves Volumes
// (Hello.features has nodewire.FeatureVolumes): volume.create and
// workspace.volume_binding are served then.
func (r *Reconciler) ServesVolumes() bool { return len(r.VolumeNodes()) > 0 }

// VolumeNodes returns the IDs of the connected nodes that serve Volumes,
// sorted: where CreateVolume may place a Volume it is not told where to
// put.
func (r *Reconciler) VolumeNodes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.nodes {
		if r.features[id][nodewire.FeatureVolumes] {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}
