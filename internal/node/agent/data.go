package agent

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// The node's data service, served to ctrl on the node's data tunnels
// (internal/tunnel), never on the control stream: the guest's
// ProcessService of each workspace the node runs, at
// /w/WORKSPACE_ID/kibotos.guest.v1.ProcessService/METHOD. Every call is
// forwarded to the workspace's guest as it is; the guest's errors come
// back unchanged (their codes and details are the guest's contract).

// ErrNotRunning is returned by Processes for a workspace the node does not
// run.
var ErrNotRunning = errors.New("the workspace does not run on this node")

// Processes is implemented by a Runtime whose guests serve a
// ProcessService: the agent then serves them on its data tunnels.
type Processes interface {
	// Processes returns a client of workspaceID's guest and a function
	// that releases it; ErrNotRunning when the workspace does not run.
	Processes(workspaceID string) (guestv1connect.ProcessServiceClient, func(), error)
}

// DataPath is the path prefix of a workspace's services in the node's data
// service.
func DataPath(workspaceID string) string { return "/w/" + workspaceID }

// NewDataHandler returns the node's data service over p.
func NewDataHandler(p Processes) http.Handler {
	prefix, h := guestv1connect.NewProcessServiceHandler(&processProxy{p: p},
		connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage), connect.WithSendMaxBytes(protocol.MaxDataPlaneMessage))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/w/")
		id, tail, ok2 := strings.Cut(rest, "/")
		if !ok || !ok2 || id == "" || !strings.HasPrefix("/"+tail, prefix) {
			http.NotFound(w, r)
			return
		}
		r2 := r.Clone(context.WithValue(r.Context(), workspaceKey{}, id))
		r2.URL.Path, r2.URL.RawPath = "/"+tail, ""
		h.ServeHTTP(w, r2)
	})
}

type workspaceKey struct{}

type processProxy struct{ p Processes }

func (x *processProxy) client(ctx context.Context) (guestv1connect.ProcessServiceClient, func(), error) {
	id, _ := ctx.Value(workspaceKey{}).(string)
	c, release, err := x.p.Processes(id)
	if errors.Is(err, ErrNotRunning) {
		return nil, nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return c, release, nil
}

// unary forwards one unary call.
func unary[Req, Res any](ctx context.Context, x *processProxy, req *connect.Request[Req],
	call func(guestv1connect.ProcessServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) (*connect.Response[Res], error) {
	c, release, err := x.client(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	res, err := call(c, ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res.Msg), nil
}

func (x *processProxy) Start(ctx context.Context, req *connect.Request[guestv1.StartRequest]) (*connect.Response[guestv1.StartResponse], error) {
	return unary(ctx, x, req, guestv1connect.ProcessServiceClient.Start)
}

func (x *processProxy) SendInput(ctx context.Context, req *connect.Request[guestv1.SendInputRequest]) (*connect.Response[guestv1.SendInputResponse], error) {
	return unary(ctx, x, req, guestv1connect.ProcessServiceClient.SendInput)
}

func (x *processProxy) CloseInput(ctx context.Context, req *connect.Request[guestv1.CloseInputRequest]) (*connect.Response[guestv1.CloseInputResponse], error) {
	return unary(ctx, x, req, guestv1connect.ProcessServiceClient.CloseInput)
}

func (x *processProxy) Signal(ctx context.Context, req *connect.Request[guestv1.SignalRequest]) (*connect.Response[guestv1.SignalResponse], error) {
	return unary(ctx, x, req, guestv1connect.ProcessServiceClient.Signal)
}

func (x *processProxy) Resize(ctx context.Context, req *connect.Request[guestv1.ResizeRequest]) (*connect.Response[guestv1.ResizeResponse], error) {
	return unary(ctx, x, req, guestv1connect.ProcessServiceClient.Resize)
}

func (x *processProxy) List(ctx context.Context, req *connect.Request[guestv1.ListRequest]) (*connect.Response[guestv1.ListResponse], error) {
	return unary(ctx, x, req, guestv1connect.ProcessServiceClient.List)
}

func (x *processProxy) Events(ctx context.Context, req *connect.Request[guestv1.EventsRequest], out *connect.ServerStream[guestv1.EventsResponse]) error {
	c, release, err := x.client(ctx)
	if err != nil {
		return err
	}
	defer release()
	in, err := c.Events(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return err
	}
	defer in.Close()
	for in.Receive() {
		if err := out.Send(in.Msg()); err != nil {
			return err
		}
	}
	return in.Err()
}
