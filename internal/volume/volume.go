// Package volume holds Volumes on ctrl: VolumeService (create, get, list,
// resize, delete, commands, labels and annotations), the record each Volume
// is stored as, what the reconciler needs to drive a Volume's image on its
// node (its desired state, the reports that complete its commands), the
// binding of Volumes to Workspaces (the Volume's side of it) and the
// accounting of a node's storage pool (PoolFree).
//
// A Volume is a row of the generic resources table (store.ResourceTx) of
// kind KindVolume while it lives and KindDeleted once its deletion
// completed, so that a listing without include_deleted never reads a
// deleted row. Its Resource.Spec is a JSON record: the public
// kibotos.ctrl.v1.Volume (without the labels, annotations and their
// revisions, which are the Resource's own fields, as for Egresses) plus the
// desired and observed halves the reconciler drives together: the node, the
// desired generation, capacity and deletion, the generation the node last
// answered, and the command waiting for it.
//
// Create, resize and delete record their command and a new generation; the
// reconciler pushes DesiredState.volumes to the node holding the pool, the
// node reports a VolumeReport for that generation, and Report completes
// the command in the same transaction. The request waits for it up to the
// server's bound (Service.WaitBound, one minute).
package volume

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// Resource kinds of Volumes. A Volume moves from KindVolume to KindDeleted
// (same ID, same creation time) in the transaction that completes its
// deletion.
const (
	KindVolume  store.ResourceKind = "volume"
	KindDeleted store.ResourceKind = "volume-deleted"
)

// ObjectKind names Volumes in command records.
const ObjectKind = "volume"

// IDPrefix starts every Volume ID.
const IDPrefix = "vol-"

// MiB is a mebibyte; a Volume is a whole number of them.
const MiB = 1 << 20

// Volume sizes.
const (
	// MinCapacityBytes is the smallest Volume (an ext4 filesystem with a
	// journal needs room).
	MinCapacityBytes = 16 * MiB
	// MaxCapacityBytes is the largest Volume: 16 TiB, what ext4 with 4 KiB
	// blocks holds.
	MaxCapacityBytes = 16 << 40
)

// Topic is the topic notified when a command of the Volume completes.
func Topic(volumeID string) string { return "volume/" + volumeID }

// record is the JSON form of Resource.Spec.
type record struct {
	// Volume is the deterministic protobuf encoding of the public Volume
	// without labels, annotations and their revisions.
	Volume []byte `json:"volume"`
	// Node holds the image; "" for a Volume of a NEW binding whose
	// Workspace is not placed yet.
	Node string `json:"node,omitempty"`
	// Generation is bumped by every change the node must act on.
	Generation uint64 `json:"generation,omitempty"`
	// Observed is the generation the node last answered.
	Observed uint64 `json:"observed,omitempty"`
	// Capacity is the desired size; the public capacity_bytes is the size
	// the node confirmed.
	Capacity uint64 `json:"capacity,omitempty"`
	// Deleted: the image is to be removed.
	Deleted bool `json:"deleted,omitempty"`
	// Command waits for Generation; "" when none.
	Command string `json:"command,omitempty"`
}

// Volume is a stored Volume, decoded.
type Volume struct {
	// Res is the stored row; Save writes Pub and the desired and observed
	// fields back into it.
	Res *store.Resource
	// Pub is the public Volume, labels and annotations included.
	Pub *ctrlv1.Volume
	// Node holds the image ("" while a NEW Volume waits for its
	// Workspace's placement).
	Node string
	// Generation, Observed, Capacity, Deleted and Command: see record.
	Generation uint64
	Observed   uint64
	Capacity   uint64
	Deleted    bool
	Command    string
}

// Decode returns the Volume of a stored row.
func Decode(r *store.Resource) (*Volume, error) {
	var rec record
	if err := json.Unmarshal(r.Spec, &rec); err != nil {
		return nil, fault.Internal("decode volume %s: %v", r.ID, err)
	}
	pub := &ctrlv1.Volume{}
	if err := proto.Unmarshal(rec.Volume, pub); err != nil {
		return nil, fault.Internal("decode volume %s: %v", r.ID, err)
	}
	pub.VolumeId = r.ID
	pub.Labels, pub.LabelsRevision = maps.Clone(r.Labels), r.LabelsRevision
	pub.Annotations, pub.AnnotationsRevision = maps.Clone(r.Annotations), r.AnnotationsRevision
	if pub.Labels == nil {
		pub.Labels = map[string]string{}
	}
	if pub.Annotations == nil {
		pub.Annotations = map[string]string{}
	}
	pub.CreatedAt = timestamppb.New(r.CreatedAt)
	pub.UpdatedAt = timestamppb.New(r.UpdatedAt)
	return &Volume{Res: r, Pub: pub, Node: rec.Node, Generation: rec.Generation, Observed: rec.Observed,
		Capacity: rec.Capacity, Deleted: rec.Deleted, Command: rec.Command}, nil
}

// encode writes v into v.Res (spec, labels, annotations, revisions,
// updated_at = now).
func (v *Volume) encode(now time.Time) error {
	pub := proto.CloneOf(v.Pub)
	pub.Labels, pub.LabelsRevision, pub.Annotations, pub.AnnotationsRevision = nil, 0, nil, 0
	pub.CreatedAt, pub.UpdatedAt = nil, nil
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(pub)
	if err != nil {
		return fault.Internal("encode volume: %v", err)
	}
	spec, err := json.Marshal(record{Volume: b, Node: v.Node, Generation: v.Generation, Observed: v.Observed,
		Capacity: v.Capacity, Deleted: v.Deleted, Command: v.Command})
	if err != nil {
		return fault.Internal("encode volume: %v", err)
	}
	v.Res.Spec = spec
	v.Res.Labels, v.Res.LabelsRevision = nonNil(v.Pub.GetLabels()), v.Pub.GetLabelsRevision()
	v.Res.Annotations, v.Res.AnnotationsRevision = nonNil(v.Pub.GetAnnotations()), v.Pub.GetAnnotationsRevision()
	v.Res.UpdatedAt = now
	v.Pub.UpdatedAt = timestamppb.New(now)
	return nil
}

// save writes v to the store at now: an update of its row, or, when its
// deletion completed (state DELETED) and the row is still of KindVolume,
// the move of the row to KindDeleted.
func (v *Volume) save(ctx context.Context, tx store.Tx, now time.Time) error {
	if err := v.encode(now); err != nil {
		return err
	}
	if v.Pub.GetState() == ctrlv1.VolumeState_VOLUME_STATE_DELETED && v.Res.Kind == KindVolume {
		if err := tx.DeleteResource(ctx, KindVolume, v.Res.ID); err != nil {
			return err
		}
		v.Res.Kind = KindDeleted
		return tx.InsertResource(ctx, v.Res)
	}
	return tx.UpdateResource(ctx, v.Res)
}

// Load reads a Volume, deleted ones included; not_found when there is none.
func Load(ctx context.Context, tx store.Tx, id string) (*Volume, error) {
	r, err := tx.GetResource(ctx, KindVolume, id)
	if errors.Is(err, store.ErrNotFound) {
		r, err = tx.GetResource(ctx, KindDeleted, id)
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.NotFound("volume", id)
	}
	if err != nil {
		return nil, err
	}
	return Decode(r)
}

// loadLive reads a Volume whose deletion has not completed; nil when there
// is none.
func loadLive(ctx context.Context, tx store.Tx, id string) (*Volume, error) {
	r, err := tx.GetResource(ctx, KindVolume, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return Decode(r)
}

// All returns every Volume whose deletion has not completed, in creation
// order. It reads them all (the resources table has no node column): the
// cost of a node's Volumes is the cost of all Volumes.
func All(ctx context.Context, tx store.Tx) ([]*Volume, error) {
	var out []*Volume
	q := store.ListQuery{Kind: KindVolume, Limit: 1000}
	for {
		rows, err := tx.ListResources(ctx, q)
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			v, err := Decode(r)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		if len(rows) < q.Limit {
			return out, nil
		}
		last := rows[len(rows)-1]
		q.After = &store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
}

// OnNode returns the Volumes of a node whose deletion has not completed, in
// creation order (All, filtered).
func OnNode(ctx context.Context, tx store.Tx, nodeID string) ([]*Volume, error) {
	all, err := All(ctx, tx)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, v := range all {
		if v.Node == nodeID {
			out = append(out, v)
		}
	}
	return out, nil
}

// Desired is the DesiredVolume the node holding v receives.
func (v *Volume) Desired() *nodev1.DesiredVolume {
	return &nodev1.DesiredVolume{VolumeId: v.Res.ID, Generation: v.Generation, CapacityBytes: v.Capacity, Deleted: v.Deleted}
}

// Pending reports whether the node has not answered v's generation yet.
func (v *Volume) Pending() bool { return v.Node != "" && v.Generation > v.Observed }

// Observed attaches the Volume as it is to a refusal by its state
// (failed_precondition) or a revision (aborted). Other errors pass
// unchanged.
func Observed(err error, pub *ctrlv1.Volume) error {
	fe, ok := fault.As(err)
	if !ok || (fe.Kind != fault.KindFailedPrecondition && fe.Kind != fault.KindAborted) {
		return err
	}
	c := *fe
	c.ObservedVolume = proto.CloneOf(pub)
	return &c
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

func shortState(s ctrlv1.VolumeState) string {
	const p = "VOLUME_STATE_"
	n := s.String()
	if len(n) > len(p) {
		return n[len(p):]
	}
	return n
}
