package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
)

// UpdateWorkspaceVolumeBinding replaces the Volume binding with the
// complete target; configuration only, mounted at the next start.
func (h *Workspaces) UpdateWorkspaceVolumeBinding(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceVolumeBindingRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceVolumeBindingResponse], error) {
	if err := unserved(h.Served, capability.WorkspaceVolumeBinding, "UpdateWorkspaceVolumeBinding"); err != nil {
		return nil, err
	}
	return respond(h.svc.UpdateVolumeBinding(ctx, req.Msg))
}
