package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// UpdateWorkspaceExpiration sets or clears the expiration under CAS on
// expiration.revision; it completes at once (workspace.Service.UpdateExpiration).
func (h *Workspaces) UpdateWorkspaceExpiration(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceExpirationRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceExpirationResponse], error) {
	return respond(h.svc.UpdateExpiration(ctx, req.Msg))
}
