package kibotos

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// SetMemory replaces the memory the Workspace requests for its next
// execution (UpdateWorkspaceMemory). expectedRevision is the
// resources_revision read (Last().GetResourcesRevision()), shared with
// SetCPU: a mismatch is aborted and changes nothing. It is accepted only
// while the Workspace holds no execution. Options: WithCommandID,
// WithRetryPolicy.
func (w *Workspace) SetMemory(ctx context.Context, memoryMiB uint32, expectedRevision uint64, opts ...CallOption) error {
	req := &ctrlv1.UpdateWorkspaceMemoryRequest{WorkspaceId: w.id, ExpectedRevision: expectedRevision, MemoryMib: memoryMiB}
	return w.configure(ctx, ctrlv1connect.WorkspaceServiceUpdateWorkspaceMemoryProcedure, opts, req, &req.Metadata,
		func(ctx context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error) {
			res, err := w.c.WorkspaceService.UpdateWorkspaceMemory(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, nil, err
			}
			return res.Msg.GetWorkspace(), nil, nil
		})
}

// SetCPU replaces the CPU, in millicores, the Workspace requests for its
// next execution (UpdateWorkspaceCpu), under the rules of SetMemory and the
// same resources_revision.
func (w *Workspace) SetCPU(ctx context.Context, cpuMillis uint32, expectedRevision uint64, opts ...CallOption) error {
	req := &ctrlv1.UpdateWorkspaceCpuRequest{WorkspaceId: w.id, ExpectedRevision: expectedRevision, CpuMillis: cpuMillis}
	return w.configure(ctx, ctrlv1connect.WorkspaceServiceUpdateWorkspaceCpuProcedure, opts, req, &req.Metadata,
		func(ctx context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error) {
			res, err := w.c.WorkspaceService.UpdateWorkspaceCpu(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, nil, err
			}
			return res.Msg.GetWorkspace(), nil, nil
		})
}

// ResizeWritableLayer enlarges the Workspace's writable layer to the
// absolute capacityBytes, a whole number of MiB
// (ResizeWorkspaceWritableLayer). It has no expected revision. It returns
// when the resize completed; a result the server could not give within its
// bound is resent with the same command ID under the retry policy.
func (w *Workspace) ResizeWritableLayer(ctx context.Context, capacityBytes uint64, opts ...CallOption) error {
	req := &ctrlv1.ResizeWorkspaceWritableLayerRequest{WorkspaceId: w.id, CapacityBytes: capacityBytes}
	return w.configure(ctx, ctrlv1connect.WorkspaceServiceResizeWorkspaceWritableLayerProcedure, opts, req, &req.Metadata,
		func(ctx context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error) {
			res, err := w.c.WorkspaceService.ResizeWorkspaceWritableLayer(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, nil, err
			}
			return res.Msg.GetWorkspace(), res.Msg.GetCommand(), nil
		})
}

// SetExpiration sets the Workspace's expiration, or clears it when e is nil
// or its policy UNSPECIFIED (UpdateWorkspaceExpiration). expectedRevision is
// the expiration.revision read: a mismatch is failed_precondition
// (EXPIRATION_REVISION_MISMATCH) and changes nothing.
func (w *Workspace) SetExpiration(ctx context.Context, e *ctrlv1.ExpirationSpec, expectedRevision uint64, opts ...CallOption) error {
	req := &ctrlv1.UpdateWorkspaceExpirationRequest{WorkspaceId: w.id, ExpectedRevision: expectedRevision, Expiration: proto.CloneOf(e)}
	return w.configure(ctx, ctrlv1connect.WorkspaceServiceUpdateWorkspaceExpirationProcedure, opts, req, &req.Metadata,
		func(ctx context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error) {
			res, err := w.c.WorkspaceService.UpdateWorkspaceExpiration(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, nil, err
			}
			return res.Msg.GetWorkspace(), nil, nil
		})
}

// BindVolume replaces the Workspace's Volume binding with the complete
// target b (UpdateWorkspaceVolumeBinding): mode NONE releases the current
// Volume, BOUND binds b.VolumeId at b.MountPath. expectedRevision is the
// binding_revision read: a mismatch is aborted. It takes effect at the next
// start.
func (w *Workspace) BindVolume(ctx context.Context, b *ctrlv1.VolumeBinding, expectedRevision uint64, opts ...CallOption) error {
	req := &ctrlv1.UpdateWorkspaceVolumeBindingRequest{WorkspaceId: w.id, ExpectedRevision: expectedRevision, VolumeBinding: proto.CloneOf(b)}
	return w.configure(ctx, ctrlv1connect.WorkspaceServiceUpdateWorkspaceVolumeBindingProcedure, opts, req, &req.Metadata,
		func(ctx context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error) {
			res, err := w.c.WorkspaceService.UpdateWorkspaceVolumeBinding(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, nil, err
			}
			return res.Msg.GetWorkspace(), nil, nil
		})
}

// configure sends a configuration write of the Workspace: its command ID,
// the capability check and the retries of PreparedCommand.Do.
func (w *Workspace) configure(ctx context.Context, proc string, opts []CallOption, req proto.Message, md **ctrlv1.CommandMetadata,
	send func(context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error)) error {
	o, err := applyOptions(proc, opts)
	if err != nil {
		return err
	}
	p := w.c.prepare(proc, o, w)
	*md = &ctrlv1.CommandMetadata{CommandId: p.id}
	p.req, p.send = req, send
	_, err = p.Do(ctx)
	return err
}
