package volume

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
)

// Report folds a node's VolumeReport into the store, inside tx, and
// returns the Volume it changed (nil when it changed none) and whether a
// command completed (its waiters are to be woken: Topic). A report is
// hostile input: one about a Volume that is not on nodeID, or that does not
// answer the Volume's current generation (stale, from the future, or the
// generation 0 of a Hello), changes nothing; its failure message is cut to
// nodewire.MaxFailureMessageBytes.
//
// A report of the current generation settles it:
//   - a deletion: the image gone (exists false, no failure) makes the
//     Volume DELETED; otherwise the deletion failed and the Volume is
//     AVAILABLE again;
//   - a creation (CREATING): the image there makes the Volume AVAILABLE;
//     otherwise the creation failed and the Volume is DELETED (there is no
//     FAILED state; the node removes a partial image with the next full
//     state, which no longer lists it);
//   - anything else (a resize): the image at least at the desired capacity
//     makes that the Volume's capacity; otherwise the resize failed and the
//     Volume keeps its capacity (the desired one falls back to it).
//
// The waiting command completes with it: its final response is recorded
// (the Volume as the report left it), or the failure with the node's
// message (resource_exhausted CAPACITY_EXHAUSTED when the node says the
// failure is permanent, else a retryable unavailable EXECUTION_FAILED; a
// failed deletion that is permanent is failed_precondition).
func Report(ctx context.Context, tx store.Tx, nodeID string, rep *nodev1.VolumeReport, now time.Time) (*Volume, bool, error) {
	if rep.GetGeneration() == 0 || len(rep.GetVolumeId()) > ids.MaxLen {
		return nil, false, nil
	}
	v, err := loadLive(ctx, tx, rep.GetVolumeId())
	if err != nil || v == nil {
		return nil, false, err
	}
	if v.Node != nodeID || rep.GetGeneration() != v.Generation || v.Observed >= v.Generation {
		return nil, false, nil
	}
	v.Observed = v.Generation
	msg := nodewire.Cut(rep.GetFailureMessage(), nodewire.MaxFailureMessageBytes)
	permanent := rep.GetPermanent()
	var fe *fault.Error
	switch {
	case v.Deleted:
		if !rep.GetExists() && msg == "" {
			v.Pub.State, v.Pub.DeletedAt, v.Pub.BoundWorkspaceId = ctrlv1.VolumeState_VOLUME_STATE_DELETED, timestamppb.New(now), ""
			break
		}
		if msg == "" {
			msg = "the image still exists"
		}
		v.Deleted = false
		v.Pub.State = ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE
		fe = nodeFailure("delete_volume", "the node could not delete the volume: "+msg, permanent, fault.KindFailedPrecondition)
	case v.Pub.GetState() == ctrlv1.VolumeState_VOLUME_STATE_CREATING:
		if rep.GetExists() && msg == "" && rep.GetCapacityBytes() >= v.Capacity {
			v.Pub.State, v.Pub.CapacityBytes = ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE, v.Capacity
			break
		}
		if msg == "" {
			msg = "the image was not created at the size asked for"
		}
		v.Pub.State, v.Pub.DeletedAt = ctrlv1.VolumeState_VOLUME_STATE_DELETED, timestamppb.New(now)
		fe = nodeFailure("create_volume", "the node could not create the volume: "+msg, permanent, fault.KindResourceExhausted)
	default:
		if rep.GetExists() && msg == "" && rep.GetCapacityBytes() >= v.Capacity {
			v.Pub.CapacityBytes = v.Capacity
			break
		}
		if msg == "" {
			msg = "the image is missing or smaller than asked for"
		}
		v.Capacity = v.Pub.GetCapacityBytes()
		fe = nodeFailure("resize_volume", "the node could not resize the volume: "+msg, permanent, fault.KindResourceExhausted)
	}
	v.Pub.UpdatedAt = timestamppb.New(now)
	completed := v.Command != ""
	if err := complete(ctx, tx, v, fe, now); err != nil {
		return nil, false, err
	}
	if err := v.save(ctx, tx, now); err != nil {
		return nil, false, err
	}
	return v, completed, nil
}

// nodeFailure is the failure of a node's action: of kind permanentKind
// (CAPACITY_EXHAUSTED for resource_exhausted, else EXECUTION_FAILED) when
// the node says retrying cannot fix it, else a retryable unavailable
// EXECUTION_FAILED.
func nodeFailure(stage, msg string, permanent bool, permanentKind fault.Kind) *fault.Error {
	if !permanent {
		return &fault.Error{Kind: fault.KindUnavailable, Reason: fault.ReasonExecutionFailed, Retryable: true, Stage: stage, Message: msg}
	}
	reason := fault.ReasonExecutionFailed
	if permanentKind == fault.KindResourceExhausted {
		reason = fault.ReasonCapacityExhausted
	}
	return &fault.Error{Kind: permanentKind, Reason: reason, Stage: stage, Message: msg}
}

// complete records the end of the command waiting on v: its failure, or
// its final response (the shape the responses of create, resize and
// delete share), which replays of its command ID return.
func complete(ctx context.Context, tx store.Tx, v *Volume, fe *fault.Error, now time.Time) error {
	if v.Command == "" {
		return nil
	}
	rec, err := tx.GetCommand(ctx, v.Command)
	v.Command = ""
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || rec.Status == store.CommandCompleted {
		return err
	}
	rec.Status, rec.CompletedAt = store.CommandCompleted, now
	if fe != nil {
		fe.ObservedVolume = proto.CloneOf(v.Pub)
		if rec.ErrorCode, rec.ErrorDetail, err = fault.Encode(fe); err != nil {
			return err
		}
	} else if rec.Result, err = proto.Marshal(&result{Volume: v.Pub, Command: CommandMessage(rec)}); err != nil {
		return err
	}
	return tx.UpdateCommand(ctx, rec)
}

// BoundVolume returns the live Volume a Workspace's binding names and that
// is bound to it; nil when it has none.
func BoundVolume(ctx context.Context, tx store.Tx, ws *ctrlv1.Workspace) (*Volume, error) {
	b := ws.GetVolumeBinding()
	if b.GetMode() != ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND || b.GetVolumeId() == "" {
		return nil, nil
	}
	v, err := loadLive(ctx, tx, b.GetVolumeId())
	if err != nil || v == nil || v.Pub.GetBoundWorkspaceId() != ws.GetWorkspaceId() {
		return nil, err
	}
	return v, nil
}

// PlaceWithWorkspace places the Volume of a NEW binding on the node its
// Workspace was just placed on (generation 1: the node creates it); it
// returns the Volume when it placed it, nil when there was none to place.
func PlaceWithWorkspace(ctx context.Context, tx store.Tx, ws *ctrlv1.Workspace, nodeID, pool string, now time.Time) (*Volume, error) {
	v, err := BoundVolume(ctx, tx, ws)
	if err != nil || v == nil || v.Node != "" {
		return nil, err
	}
	v.Node, v.Pub.Placement = nodeID, &ctrlv1.Placement{NodeId: nodeID, StoragePool: pool}
	v.Generation++
	if err := v.save(ctx, tx, now); err != nil {
		return nil, err
	}
	return v, nil
}

// WorkspaceGone handles the Volume bound to a Workspace whose deletion
// completed, inside that transaction: with delete_with_workspace it is
// deleted (DELETING until the node removed the image; DELETED at once when
// it was never placed, which only a NEW Volume can be), otherwise released
// to AVAILABLE with its data. A Volume of a NEW binding that was never
// placed holds no data and is deleted either way. It returns the Volume
// when the node must be told (nil otherwise).
func WorkspaceGone(ctx context.Context, tx store.Tx, ws *ctrlv1.Workspace, now time.Time) (*Volume, error) {
	v, err := BoundVolume(ctx, tx, ws)
	if err != nil || v == nil {
		return nil, err
	}
	v.Pub.BoundWorkspaceId = ""
	push := false
	switch {
	case v.Node == "":
		v.Pub.State, v.Pub.DeletedAt = ctrlv1.VolumeState_VOLUME_STATE_DELETED, timestamppb.New(now)
	case ws.GetVolumeBinding().GetDeleteWithWorkspace():
		if err := supersede(ctx, tx, v, "the volume is deleted with workspace "+ws.GetWorkspaceId(), now); err != nil {
			return nil, err
		}
		v.Deleted, push = true, true
		v.Generation++
		v.Pub.State = ctrlv1.VolumeState_VOLUME_STATE_DELETING
	}
	if err := v.save(ctx, tx, now); err != nil {
		return nil, err
	}
	if !push {
		return nil, nil
	}
	return v, nil
}
