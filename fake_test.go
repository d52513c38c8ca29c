package kibotos_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
)

// fakeCtrl is a scripted ctrl for what the real one cannot provoke on
// demand: missing capabilities, lost answers, refusals. It serves
// GetServerInfo with caps and answers each WorkspaceService method with its
// script, recording every request in order.
type fakeCtrl struct {
	ctrlv1connect.UnimplementedServerInfoServiceHandler
	ctrlv1connect.UnimplementedWorkspaceServiceHandler

	caps []string
	// answers maps a method name ("StopWorkspace") to its answer; n counts
	// the calls of that method, from 1. A method without one answers
	// unimplemented.
	answers map[string]func(ctx context.Context, n int, req proto.Message) (proto.Message, error)

	mu    sync.Mutex
	calls []fakeCall
}

type fakeCall struct {
	method string
	req    proto.Message
}

// allWorkspaceCaps are the capabilities of a server that serves the
// workspace lifecycle, without the server-side wait.
var allWorkspaceCaps = []string{capability.WorkspaceCreate, capability.WorkspaceStart, capability.WorkspaceStop, capability.WorkspaceDelete}

func newFakeCtrl(caps ...string) *fakeCtrl {
	return &fakeCtrl{caps: caps, answers: map[string]func(context.Context, int, proto.Message) (proto.Message, error){}}
}

// on sets the answer of method.
func (f *fakeCtrl) on(method string, answer func(ctx context.Context, n int, req proto.Message) (proto.Message, error)) *fakeCtrl {
	f.answers[method] = answer
	return f
}

// methods returns the methods called, in order.
func (f *fakeCtrl) methods() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		out = append(out, c.method)
	}
	return out
}

// requests returns the requests of method, in order.
func (f *fakeCtrl) requests(method string) []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []proto.Message
	for _, c := range f.calls {
		if c.method == method {
			out = append(out, c.req)
		}
	}
	return out
}

func (f *fakeCtrl) count(method string) int { return len(f.requests(method)) }

func answer[Res any](ctx context.Context, f *fakeCtrl, method string, req proto.Message) (*connect.Response[Res], error) {
	f.mu.Lock()
	f.calls = append(f.calls, fakeCall{method, proto.Clone(req)})
	n := 0
	for _, c := range f.calls {
		if c.method == method {
			n++
		}
	}
	fn := f.answers[method]
	f.mu.Unlock()
	if fn == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("fake: no answer for %s", method))
	}
	res, err := fn(ctx, n, req)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(any(res).(*Res)), nil
}

func (f *fakeCtrl) GetServerInfo(ctx context.Context, r *connect.Request[ctrlv1.GetServerInfoRequest]) (*connect.Response[ctrlv1.GetServerInfoResponse], error) {
	f.mu.Lock()
	if f.answers["GetServerInfo"] == nil {
		f.answers["GetServerInfo"] = func(context.Context, int, proto.Message) (proto.Message, error) {
			return &ctrlv1.GetServerInfoResponse{SourceRevision: "fake", Capabilities: f.caps}, nil
		}
	}
	f.mu.Unlock()
	return answer[ctrlv1.GetServerInfoResponse](ctx, f, "GetServerInfo", r.Msg)
}

func (f *fakeCtrl) CreateWorkspace(ctx context.Context, r *connect.Request[ctrlv1.CreateWorkspaceRequest]) (*connect.Response[ctrlv1.CreateWorkspaceResponse], error) {
	return answer[ctrlv1.CreateWorkspaceResponse](ctx, f, "CreateWorkspace", r.Msg)
}

func (f *fakeCtrl) GetWorkspace(ctx context.Context, r *connect.Request[ctrlv1.GetWorkspaceRequest]) (*connect.Response[ctrlv1.GetWorkspaceResponse], error) {
	return answer[ctrlv1.GetWorkspaceResponse](ctx, f, "GetWorkspace", r.Msg)
}

func (f *fakeCtrl) ListWorkspaces(ctx context.Context, r *connect.Request[ctrlv1.ListWorkspacesRequest]) (*connect.Response[ctrlv1.ListWorkspacesResponse], error) {
	return answer[ctrlv1.ListWorkspacesResponse](ctx, f, "ListWorkspaces", r.Msg)
}

func (f *fakeCtrl) GetWorkspaceCommand(ctx context.Context, r *connect.Request[ctrlv1.GetWorkspaceCommandRequest]) (*connect.Response[ctrlv1.GetWorkspaceCommandResponse], error) {
	return answer[ctrlv1.GetWorkspaceCommandResponse](ctx, f, "GetWorkspaceCommand", r.Msg)
}

func (f *fakeCtrl) StopWorkspace(ctx context.Context, r *connect.Request[ctrlv1.StopWorkspaceRequest]) (*connect.Response[ctrlv1.StopWorkspaceResponse], error) {
	return answer[ctrlv1.StopWorkspaceResponse](ctx, f, "StopWorkspace", r.Msg)
}

func (f *fakeCtrl) StartWorkspace(ctx context.Context, r *connect.Request[ctrlv1.StartWorkspaceRequest]) (*connect.Response[ctrlv1.StartWorkspaceResponse], error) {
	return answer[ctrlv1.StartWorkspaceResponse](ctx, f, "StartWorkspace", r.Msg)
}

func (f *fakeCtrl) DeleteWorkspace(ctx context.Context, r *connect.Request[ctrlv1.DeleteWorkspaceRequest]) (*connect.Response[ctrlv1.DeleteWorkspaceResponse], error) {
	return answer[ctrlv1.DeleteWorkspaceResponse](ctx, f, "DeleteWorkspace", r.Msg)
}

// serveFake serves f over HTTP/2 and TLS and returns its server.
func serveFake(t *testing.T, f *fakeCtrl) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewServerInfoServiceHandler(f))
	mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(f))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// fastRetry keeps tests quick: short pauses, the default number of attempts.
var fastRetry = kibotos.RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}

// clientOf serves f and returns a client of it with short pauses.
func clientOf(t *testing.T, f *fakeCtrl, opts ...kibotos.Option) *kibotos.Client {
	t.Helper()
	srv := serveFake(t, f)
	opts = append([]kibotos.Option{
		kibotos.WithHTTPClient(srv.Client()),
		kibotos.WithWaitBackoff(time.Millisecond, 5*time.Millisecond),
		kibotos.WithDefaultRetryPolicy(fastRetry),
	}, opts...)
	c, err := kibotos.NewClient(srv.URL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// detailed is an error as ctrl returns it: a code and an ErrorDetail.
func detailed(code connect.Code, d *ctrlv1.ErrorDetail) *connect.Error {
	ce := connect.NewError(code, errors.New(d.GetMessage()))
	ed, err := connect.NewErrorDetail(d)
	if err != nil {
		panic(err)
	}
	ce.AddDetail(ed)
	return ce
}

// timedOut is the retryable answer of a stop or delete that did not
// complete within the server's bound.
func timedOut() error {
	return detailed(connect.CodeUnavailable, &ctrlv1.ErrorDetail{
		Reason: ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT, Retryable: true, Message: "the command did not complete within 1m0s",
	})
}

const fakeWorkspaceID = "ws-abcdefghijklmnopqrst"

func fakeWorkspace(state ctrlv1.WorkspaceState, expirationRevision uint64) *ctrlv1.Workspace {
	return &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID, State: state, Expiration: &ctrlv1.Expiration{Revision: expirationRevision}}
}

func fakeCommand(id string, kind ctrlv1.WorkspaceCommandKind, status ctrlv1.WorkspaceCommandStatus) *ctrlv1.WorkspaceCommand {
	return &ctrlv1.WorkspaceCommand{CommandId: id, WorkspaceId: fakeWorkspaceID, Kind: kind, Status: status}
}
