package kibotos_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// fakeWorkspaces answers GetWorkspaceCommand from a script: one answer per
// call, the last one repeated.
type fakeWorkspaces struct {
	ctrlv1connect.UnimplementedWorkspaceServiceHandler
	mu      sync.Mutex
	ids     []string
	answers []func(id string) (*ctrlv1.WorkspaceCommand, error)
}

func (f *fakeWorkspaces) GetWorkspaceCommand(_ context.Context, req *connect.Request[ctrlv1.GetWorkspaceCommandRequest]) (*connect.Response[ctrlv1.GetWorkspaceCommandResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids = append(f.ids, req.Msg.GetCommandId())
	answer := f.answers[min(len(f.ids), len(f.answers))-1]
	c, err := answer(req.Msg.GetCommandId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetWorkspaceCommandResponse{Command: c}), nil
}

func status(s ctrlv1.WorkspaceCommandStatus, e *ctrlv1.CommandError) func(string) (*ctrlv1.WorkspaceCommand, error) {
	return func(id string) (*ctrlv1.WorkspaceCommand, error) {
		return &ctrlv1.WorkspaceCommand{CommandId: id, WorkspaceId: "ws-1", Status: s, Error: e}, nil
	}
}

var (
	processing = status(ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING, nil)
	completed  = status(ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED, nil)
)

// serveWorkspaces serves f over HTTP/2 and TLS and returns a client of it.
func serveWorkspaces(t *testing.T, f *fakeWorkspaces, opts ...kibotos.Option) *kibotos.Client {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	_, h := ctrlv1connect.NewWorkspaceServiceHandler(f)
	srv.Config.Handler = h
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	opts = append([]kibotos.Option{kibotos.WithHTTPClient(srv.Client()), kibotos.WithWaitBackoff(time.Millisecond, 5*time.Millisecond)}, opts...)
	c, err := kibotos.NewClient(srv.URL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestWaitWorkspaceCommand(t *testing.T) {
	f := &fakeWorkspaces{answers: []func(string) (*ctrlv1.WorkspaceCommand, error){processing, processing, completed}}
	c := serveWorkspaces(t, f)
	got, err := c.WaitWorkspaceCommand(t.Context(), "create-ws-1")
	if err != nil {
		t.Fatalf("WaitWorkspaceCommand = %v", err)
	}
	if got.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED || got.GetCommandId() != "create-ws-1" {
		t.Errorf("WaitWorkspaceCommand returned %v, want the COMPLETED command create-ws-1", got)
	}
	if len(f.ids) != 3 {
		t.Errorf("WaitWorkspaceCommand polled %d times, want 3", len(f.ids))
	}
}

func TestWaitWorkspaceCommandFailure(t *testing.T) {
	failed := status(ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED, &ctrlv1.CommandError{
		Code:   "resource_exhausted",
		Detail: &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, CommandSettled: true, Message: "no node has 64 GiB"},
	})
	f := &fakeWorkspaces{answers: []func(string) (*ctrlv1.WorkspaceCommand, error){processing, failed}}
	c := serveWorkspaces(t, f)
	got, err := c.WaitWorkspaceCommand(t.Context(), "create-ws-2")
	if got.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
		t.Errorf("WaitWorkspaceCommand returned %v, want the completed command", got)
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted || kibotos.Reason(err) != ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED || !kibotos.IsSettled(err) {
		t.Errorf("WaitWorkspaceCommand error = %v, want the command's settled resource_exhausted", err)
	}
}

func TestWaitWorkspaceCommandErrors(t *testing.T) {
	transient := func(string) (*ctrlv1.WorkspaceCommand, error) {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("store unavailable"))
	}
	notFound := func(string) (*ctrlv1.WorkspaceCommand, error) {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such command"))
	}
	t.Run("transient errors are polled through", func(t *testing.T) {
		f := &fakeWorkspaces{answers: []func(string) (*ctrlv1.WorkspaceCommand, error){transient, processing, transient, completed}}
		c := serveWorkspaces(t, f, kibotos.WithConnectOptions(connect.WithGRPC()))
		if _, err := c.WaitWorkspaceCommand(t.Context(), "c"); err != nil {
			t.Fatalf("WaitWorkspaceCommand = %v, want nil", err)
		}
	})
	t.Run("a definite error ends the wait", func(t *testing.T) {
		f := &fakeWorkspaces{answers: []func(string) (*ctrlv1.WorkspaceCommand, error){processing, notFound}}
		c := serveWorkspaces(t, f)
		if _, err := c.WaitWorkspaceCommand(t.Context(), "c"); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("WaitWorkspaceCommand = %v, want not_found", err)
		}
	})
	t.Run("the context ends the wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		cancelling := func(id string) (*ctrlv1.WorkspaceCommand, error) {
			cancel() // the caller gives up while the second poll is in flight
			return processing(id)
		}
		f := &fakeWorkspaces{answers: []func(string) (*ctrlv1.WorkspaceCommand, error){processing, cancelling}}
		c := serveWorkspaces(t, f)
		got, err := c.WaitWorkspaceCommand(ctx, "c")
		if err == nil || got.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING {
			t.Fatalf("WaitWorkspaceCommand = %v, %v; want the last PROCESSING command and an error", got, err)
		}
	})
}
