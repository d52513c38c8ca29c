package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// UpdateWorkspaceMemory records the memory of the Workspace's next
// execution (workspace.Service.UpdateMemory).
func (h *Workspaces) UpdateWorkspaceMemory(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceMemoryRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceMemoryResponse], error) {
	return respond(h.svc.UpdateMemory(ctx, req.Msg))
}

// UpdateWorkspaceCpu records the CPU of the Workspace's next execution
// (workspace.Service.UpdateCPU).
func (h *Workspaces) UpdateWorkspaceCpu(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceCpuRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceCpuResponse], error) {
	return respond(h.svc.UpdateCPU(ctx, req.Msg))
}

// ResizeWorkspaceWritableLayer grows the writable layer of a Workspace
// that holds no execution and waits (bounded) for its node
// (workspace.Service.ResizeWritableLayer).
func (h *Workspaces) ResizeWorkspaceWritableLayer(ctx context.Context, req *connect.Request[ctrlv1.ResizeWorkspaceWritableLayerRequest]) (*connect.Response[ctrlv1.ResizeWorkspaceWritableLayerResponse], error) {
	return respond(h.svc.ResizeWritableLayer(ctx, req.Msg))
}
