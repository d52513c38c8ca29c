package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/workspace"
)

// Workspaces serves WorkspaceService. The lifecycle methods, the network
// policy, memory, CPU and the writable layer resize (workspace_config.go)
// are served; the other configuration methods (expiration, Volume binding)
// answer unimplemented with an ErrorDetail until their capabilities are
// served.
type Workspaces struct {
	ctrlv1connect.UnimplementedWorkspaceServiceHandler
	svc *workspace.Service
	// Served, when set, returns the capabilities served now: methods whose
	// capability depends on the nodes (UpdateWorkspaceVolumeBinding) refuse
	// while it is not served.
	Served func() []string
}

// NewWorkspaces returns the WorkspaceService handler.
func NewWorkspaces(svc *workspace.Service) *Workspaces { return &Workspaces{svc: svc} }

// CreateWorkspace accepts a durable creation command.
func (h *Workspaces) CreateWorkspace(ctx context.Context, req *connect.Request[ctrlv1.CreateWorkspaceRequest]) (*connect.Response[ctrlv1.CreateWorkspaceResponse], error) {
	return respond(h.svc.Create(ctx, req.Msg))
}

// GetWorkspace reads one Workspace.
func (h *Workspaces) GetWorkspace(ctx context.Context, req *connect.Request[ctrlv1.GetWorkspaceRequest]) (*connect.Response[ctrlv1.GetWorkspaceResponse], error) {
	w, err := h.svc.Get(ctx, req.Msg.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetWorkspaceResponse{Workspace: w}), nil
}

// ListWorkspaces lists one page.
func (h *Workspaces) ListWorkspaces(ctx context.Context, req *connect.Request[ctrlv1.ListWorkspacesRequest]) (*connect.Response[ctrlv1.ListWorkspacesResponse], error) {
	return respond(h.svc.List(ctx, req.Msg))
}

// GetWorkspaceCommand reads a command; with wait_timeout, once it has
// completed or the timeout passed.
func (h *Workspaces) GetWorkspaceCommand(ctx context.Context, req *connect.Request[ctrlv1.GetWorkspaceCommandRequest]) (*connect.Response[ctrlv1.GetWorkspaceCommandResponse], error) {
	c, err := h.svc.GetCommand(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetWorkspaceCommandResponse{Command: c}), nil
}

// StartWorkspace accepts a durable start command.
func (h *Workspaces) StartWorkspace(ctx context.Context, req *connect.Request[ctrlv1.StartWorkspaceRequest]) (*connect.Response[ctrlv1.StartWorkspaceResponse], error) {
	return respond(h.svc.Start(ctx, req.Msg))
}

// StopWorkspace stops and waits (bounded).
func (h *Workspaces) StopWorkspace(ctx context.Context, req *connect.Request[ctrlv1.StopWorkspaceRequest]) (*connect.Response[ctrlv1.StopWorkspaceResponse], error) {
	return respond(h.svc.Stop(ctx, req.Msg))
}

// DeleteWorkspace deletes and waits (bounded).
func (h *Workspaces) DeleteWorkspace(ctx context.Context, req *connect.Request[ctrlv1.DeleteWorkspaceRequest]) (*connect.Response[ctrlv1.DeleteWorkspaceResponse], error) {
	return respond(h.svc.Delete(ctx, req.Msg))
}

// UpdateWorkspaceLabels replaces the label map under CAS.
func (h *Workspaces) UpdateWorkspaceLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceLabelsRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceLabelsResponse], error) {
	m := req.Msg
	w, err := h.svc.UpdateMap(ctx, ctrlv1connect.WorkspaceServiceUpdateWorkspaceLabelsProcedure, m, m.GetWorkspaceId(), false, m.GetExpectedRevision(), m.GetLabels())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceLabelsResponse{Workspace: w}), nil
}

// UpdateWorkspaceAnnotations replaces the annotation map under CAS.
func (h *Workspaces) UpdateWorkspaceAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceAnnotationsResponse], error) {
	m := req.Msg
	w, err := h.svc.UpdateMap(ctx, ctrlv1connect.WorkspaceServiceUpdateWorkspaceAnnotationsProcedure, m, m.GetWorkspaceId(), true, m.GetExpectedRevision(), m.GetAnnotations())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceAnnotationsResponse{Workspace: w}), nil
}

// RevokeWorkspaceDataPlane ends every data-plane credential of the
// Workspace; it returns completed.
func (h *Workspaces) RevokeWorkspaceDataPlane(ctx context.Context, req *connect.Request[ctrlv1.RevokeWorkspaceDataPlaneRequest]) (*connect.Response[ctrlv1.RevokeWorkspaceDataPlaneResponse], error) {
	return respond(h.svc.RevokeDataPlane(ctx, req.Msg))
}

// UpdateWorkspaceNetworkPolicy replaces the expected network policy; on an
// AVAILABLE Workspace it waits (bounded) for the node to apply it.
func (h *Workspaces) UpdateWorkspaceNetworkPolicy(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceNetworkPolicyRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceNetworkPolicyResponse], error) {
	return respond(h.svc.UpdateNetworkPolicy(ctx, req.Msg))
}
