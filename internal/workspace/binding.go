package workspace

import (
	"context"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/volume"
)

const updateBindingMethod = "/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceVolumeBinding"

// Volume bindings (seed 000, SPEC §7). A Workspace's volume_binding is
// NONE, or BOUND to a Volume (volume_id, mount_path,
// delete_with_workspace); the Volume's bound_workspace_id names the
// Workspace back, and both change in one transaction.
//
//   - CreateWorkspace takes NONE (or none), BOUND to an AVAILABLE unbound
//     Volume (the Workspace is then placed on the node holding it), or NEW:
//     a Volume of new_volume_capacity_bytes is created with the Workspace,
//     CREATING, bound to it and without a node; placement puts it on the
//     Workspace's node, whose pool must hold both, and the node creates its
//     image with the Workspace. The stored binding then reads BOUND to that
//     Volume.
//   - The Volume is mounted at mount_path from each start.
//   - When the Workspace's deletion completes, its Volume is deleted with it
//     (delete_with_workspace) or released to AVAILABLE with its data
//     (internal/reconciler calls volume.WorkspaceGone).

// checkBinding validates a binding a request gives in field. create allows
// NEW and an absent or unspecified mode (NONE).
func checkBinding(field string, b *ctrlv1.VolumeBinding, create bool) error {
	empty := func() error {
		switch {
		case b.GetVolumeId() != "":
			return fault.Invalid(field+".volume_id", "a binding without a volume names none")
		case b.GetMountPath() != "":
			return fault.Invalid(field+".mount_path", "a binding without a volume has no mount path")
		case b.GetDeleteWithWorkspace():
			return fault.Invalid(field+".delete_with_workspace", "a binding without a volume deletes none")
		case b.GetNewVolumeCapacityBytes() != 0:
			return fault.Invalid(field+".new_volume_capacity_bytes", "new_volume_capacity_bytes is for the mode NEW only")
		}
		return nil
	}
	switch b.GetMode() {
	case ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_UNSPECIFIED:
		if !create {
			return fault.Invalid(field+".mode", "the mode is required: NONE or BOUND")
		}
		return empty()
	case ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE:
		return empty()
	case ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND:
		if b.GetVolumeId() == "" {
			return fault.Invalid(field+".volume_id", "a BOUND binding names its volume")
		}
		if b.GetNewVolumeCapacityBytes() != 0 {
			return fault.Invalid(field+".new_volume_capacity_bytes", "new_volume_capacity_bytes is for the mode NEW only")
		}
		return volume.CheckMountPath(field+".mount_path", b.GetMountPath())
	case ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW:
		if !create {
			return fault.Invalid(field+".mode", "NEW is accepted by CreateWorkspace only; create the volume with CreateVolume and bind it")
		}
		if b.GetVolumeId() != "" {
			return fault.Invalid(field+".volume_id", "a NEW binding's volume is created by the server")
		}
		if err := volume.CheckCapacity(field+".new_volume_capacity_bytes", b.GetNewVolumeCapacityBytes()); err != nil {
			return err
		}
		return volume.CheckMountPath(field+".mount_path", b.GetMountPath())
	}
	return fault.Invalid(field+".mode", "unknown volume binding mode %d", b.GetMode())
}

// bindingOf is the binding a Workspace stores for a valid target: NONE, or
// BOUND to volumeID with its mount path and delete_with_workspace.
func bindingOf(b *ctrlv1.VolumeBinding, volumeID string) *ctrlv1.VolumeBinding {
	if volumeID == "" {
		return &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE}
	}
	return &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: volumeID,
		MountPath: b.GetMountPath(), DeleteWithWorkspace: b.GetDeleteWithWorkspace()}
}

// boundID is the Volume a stored binding names; "" for none.
func boundID(b *ctrlv1.VolumeBinding) string {
	if b.GetMode() != ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND {
		return ""
	}
	return b.GetVolumeId()
}

// admitBinding applies a create's binding b (checked by checkBinding) to
// the new Workspace pub inside its transaction: BOUND binds the Volume
// (AVAILABLE, unbound, else failed_precondition with observed_volume), NEW
// creates one.
func admitBinding(ctx context.Context, tx store.Tx, pub *ctrlv1.Workspace, b *ctrlv1.VolumeBinding) error {
	now := pub.GetCreatedAt().AsTime()
	switch b.GetMode() {
	case ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND:
		if err := volume.Bind(ctx, tx, "volume_binding.volume_id", b.GetVolumeId(), pub.GetWorkspaceId(), "", now); err != nil {
			return err
		}
		pub.VolumeBinding = bindingOf(b, b.GetVolumeId())
	case ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW:
		id, err := volume.CreateBound(ctx, tx, pub.GetWorkspaceId(), b.GetNewVolumeCapacityBytes(), now)
		if err != nil {
			return err
		}
		pub.VolumeBinding = bindingOf(b, id)
	default:
		pub.VolumeBinding = bindingOf(nil, "")
	}
	return nil
}

// UpdateVolumeBinding serves UpdateWorkspaceVolumeBinding (seed 000): the
// complete target replaces the binding.
//
//   - NONE releases the current Volume; BOUND with the current Volume
//     changes its mount path or delete_with_workspace; BOUND with another
//     Volume binds it and releases the current one. NEW (and no mode) is
//     invalid_argument here, as is a malformed mount path.
//   - Configuration only: nothing starts, stops or is rebuilt, and the node
//     is not involved; the next start mounts the new binding. A released
//     Volume survives with its data and returns to AVAILABLE.
//   - Same state rule as UpdateWorkspaceMemory: only a Workspace that holds
//     no execution (failed_precondition STATE_CONFLICT, observed_workspace).
//   - expected_revision must equal binding_revision (aborted
//     REVISION_MISMATCH, observed_workspace), which is independent of
//     resources_revision. The same binding keeps binding_revision; a
//     different one increments it by one.
//   - The target Volume must exist (not_found) and be AVAILABLE, unbound,
//     and on the node of the Workspace's placement when it has one
//     (failed_precondition with observed_volume and observed_workspace).
//
// Every refusal is recorded with the command ID and changes nothing.
func (s *Service) UpdateVolumeBinding(ctx context.Context, req *ctrlv1.UpdateWorkspaceVolumeBindingRequest) (*ctrlv1.UpdateWorkspaceVolumeBindingResponse, error) {
	id := req.GetWorkspaceId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	target := req.GetVolumeBinding()
	if target == nil {
		return nil, fault.Invalid("volume_binding", "volume_binding is required: the complete target, NONE or BOUND")
	}
	if err := checkBinding("volume_binding", target, false); err != nil {
		return nil, err
	}
	return command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.UpdateWorkspaceVolumeBindingRequest, *ctrlv1.UpdateWorkspaceVolumeBindingResponse]{
		Method: updateBindingMethod, ObjectKind: ObjectKind, ObjectID: id,
		CommandKind: int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_VOLUME_BINDING), Request: req,
		NewResponse: func() *ctrlv1.UpdateWorkspaceVolumeBindingResponse {
			return &ctrlv1.UpdateWorkspaceVolumeBindingResponse{}
		},
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*ctrlv1.UpdateWorkspaceVolumeBindingResponse, error) {
			w, pub, err := s.load(ctx, tx, id)
			if err != nil {
				return nil, err
			}
			if err := Admit(OpUpdateConfig, status(w, pub)); err != nil {
				return nil, observed(err, pub)
			}
			if cur, exp := pub.GetBindingRevision(), req.GetExpectedRevision(); cur != exp {
				return nil, observed(fault.RevisionMismatch("expected_revision", exp, cur), pub)
			}
			cur := boundID(pub.GetVolumeBinding())
			next := bindingOf(target, boundID(target))
			if proto.Equal(bindingOf(pub.GetVolumeBinding(), cur), next) {
				return &ctrlv1.UpdateWorkspaceVolumeBindingResponse{Workspace: pub}, nil
			}
			now := s.now()
			if v := next.GetVolumeId(); v != "" && v != cur {
				if err := volume.Bind(ctx, tx, "volume_binding.volume_id", v, id, w.NodeID, now); err != nil {
					return nil, observed(err, pub)
				}
			}
			if cur != "" && cur != next.GetVolumeId() {
				if err := volume.Release(ctx, tx, cur, id, now); err != nil {
					return nil, err
				}
			}
			pub.VolumeBinding = next
			pub.BindingRevision++
			if err := Save(w, pub, now); err != nil {
				return nil, err
			}
			if err := tx.UpdateWorkspace(ctx, w); err != nil {
				return nil, err
			}
			// rec is COMPLETED already (the engine's default).
			return &ctrlv1.UpdateWorkspaceVolumeBindingResponse{Workspace: pub}, nil
		},
	})
}
