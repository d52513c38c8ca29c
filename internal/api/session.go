package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/dataplane"
)

// Sessions serves SessionService. Its requests are refused before they
// reach it unless the deployment serves the capability of every scope they
// ask for (RefuseUnservedFields).
type Sessions struct {
	svc *dataplane.Service
}

var _ ctrlv1connect.SessionServiceHandler = (*Sessions)(nil)

// NewSessions returns the SessionService handler.
func NewSessions(svc *dataplane.Service) *Sessions { return &Sessions{svc: svc} }

// CreateDataPlaneSession issues a data-plane credential.
func (h *Sessions) CreateDataPlaneSession(ctx context.Context, req *connect.Request[ctrlv1.CreateDataPlaneSessionRequest]) (*connect.Response[ctrlv1.CreateDataPlaneSessionResponse], error) {
	return respond(h.svc.Create(ctx, req.Msg))
}
