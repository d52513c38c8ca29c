package kibotos_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
)

const (
	statusProcessing = ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING
	statusCompleted  = ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED
)

// script answers GetWorkspaceCommand with one answer per call, the last one
// repeated.
func script(answers ...func(ctx context.Context, req *ctrlv1.GetWorkspaceCommandRequest) (*ctrlv1.WorkspaceCommand, error)) func(context.Context, int, proto.Message) (proto.Message, error) {
	return func(ctx context.Context, n int, req proto.Message) (proto.Message, error) {
		c, err := answers[min(n, len(answers))-1](ctx, req.(*ctrlv1.GetWorkspaceCommandRequest))
		if err != nil {
			return nil, err
		}
		return &ctrlv1.GetWorkspaceCommandResponse{Command: c}, nil
	}
}

func status(s ctrlv1.WorkspaceCommandStatus, e *ctrlv1.CommandError) func(context.Context, *ctrlv1.GetWorkspaceCommandRequest) (*ctrlv1.WorkspaceCommand, error) {
	return func(_ context.Context, req *ctrlv1.GetWorkspaceCommandRequest) (*ctrlv1.WorkspaceCommand, error) {
		return &ctrlv1.WorkspaceCommand{CommandId: req.GetCommandId(), WorkspaceId: "ws-1", Status: s, Error: e}, nil
	}
}

var (
	processing = status(statusProcessing, nil)
	completed  = status(statusCompleted, nil)
)

// waiting answers like a server that serves wait_timeout: PROCESSING only
// once the requested wait has passed.
func waiting(ctx context.Context, req *ctrlv1.GetWorkspaceCommandRequest) (*ctrlv1.WorkspaceCommand, error) {
	if d := req.GetWaitTimeout(); d != nil {
		select {
		case <-time.After(d.AsDuration()):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return processing(ctx, req)
}

func waitTimeouts(f *fakeCtrl) []time.Duration {
	var out []time.Duration
	for _, r := range f.requests("GetWorkspaceCommand") {
		out = append(out, r.(*ctrlv1.GetWorkspaceCommandRequest).GetWaitTimeout().AsDuration())
	}
	return out
}

func TestWaitWorkspaceCommandPolls(t *testing.T) {
	f := newFakeCtrl(capability.WorkspaceCreate).on("GetWorkspaceCommand", script(processing, processing, completed))
	c := clientOf(t, f)
	got, err := c.WaitWorkspaceCommand(t.Context(), "create-ws-1")
	if err != nil {
		t.Fatalf("WaitWorkspaceCommand = %v", err)
	}
	if got.GetStatus() != statusCompleted || got.GetCommandId() != "create-ws-1" {
		t.Errorf("WaitWorkspaceCommand returned %v, want the COMPLETED command create-ws-1", got)
	}
	if n := f.count("GetWorkspaceCommand"); n != 3 {
		t.Errorf("WaitWorkspaceCommand polled %d times, want 3", n)
	}
	for i, r := range f.requests("GetWorkspaceCommand") {
		if r.(*ctrlv1.GetWorkspaceCommandRequest).GetWaitTimeout() != nil {
			t.Errorf("poll %d carries wait_timeout, but the server does not offer %s", i+1, capability.WorkspaceCommandWait)
		}
	}
	// A second wait reads the server info it already has.
	if _, err := c.WaitWorkspaceCommand(t.Context(), "create-ws-1"); err != nil {
		t.Fatal(err)
	}
	if n := f.count("GetServerInfo"); n != 1 {
		t.Errorf("GetServerInfo called %d times for two waits, want 1", n)
	}
}

func TestWaitWorkspaceCommandLongPoll(t *testing.T) {
	f := newFakeCtrl(capability.WorkspaceCreate, capability.WorkspaceCommandWait).on("GetWorkspaceCommand", script(waiting, waiting, completed))
	// A poll back-off of one second would show: the waits follow each other
	// without a pause.
	c := clientOf(t, f, kibotos.WithServerWaitTimeout(30*time.Millisecond), kibotos.WithWaitBackoff(time.Second, time.Second))
	start := time.Now()
	got, err := c.WaitWorkspaceCommand(t.Context(), "c-1")
	if err != nil || got.GetStatus() != statusCompleted {
		t.Fatalf("WaitWorkspaceCommand = %v, %v; want the completed command", got, err)
	}
	if want := []time.Duration{30 * time.Millisecond, 30 * time.Millisecond, 30 * time.Millisecond}; !slices.Equal(waitTimeouts(f), want) {
		t.Errorf("wait_timeout of the requests = %v, want %v", waitTimeouts(f), want)
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Errorf("WaitWorkspaceCommand took %v: it paused between server-side waits", d)
	}
}

func TestWaitWorkspaceCommandLongPollDefaults(t *testing.T) {
	t.Run("20s, cut to the context's deadline", func(t *testing.T) {
		f := newFakeCtrl(capability.WorkspaceCreate, capability.WorkspaceCommandWait).on("GetWorkspaceCommand", script(completed))
		c := clientOf(t, f)
		if _, err := c.WaitWorkspaceCommand(t.Context(), "c-1"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if _, err := c.WaitWorkspaceCommand(ctx, "c-1"); err != nil {
			t.Fatal(err)
		}
		got := waitTimeouts(f)
		if len(got) != 2 || got[0] != 20*time.Second || got[1] > 5*time.Second || got[1] < 4*time.Second {
			t.Errorf("wait_timeout of the requests = %v, want [20s, just under 5s]", got)
		}
	})
	t.Run("a server that answers at once is not polled in a tight loop", func(t *testing.T) {
		f := newFakeCtrl(capability.WorkspaceCreate, capability.WorkspaceCommandWait).on("GetWorkspaceCommand", script(processing))
		c := clientOf(t, f, kibotos.WithWaitBackoff(20*time.Millisecond, 20*time.Millisecond))
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		if _, err := c.WaitWorkspaceCommand(ctx, "c-1"); err == nil {
			t.Fatal("WaitWorkspaceCommand = nil error, want the end of the context")
		}
		if n := f.count("GetWorkspaceCommand"); n > 12 {
			t.Errorf("%d requests in 200ms with a 20ms back-off: the client did not pause", n)
		}
	})
	t.Run("a refused wait falls back to polling", func(t *testing.T) {
		refused := func(ctx context.Context, req *ctrlv1.GetWorkspaceCommandRequest) (*ctrlv1.WorkspaceCommand, error) {
			if req.GetWaitTimeout() != nil {
				return nil, detailed(connect.CodeUnimplemented, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, Message: "wait_timeout is not served"})
			}
			return processing(ctx, req)
		}
		f := newFakeCtrl(capability.WorkspaceCreate, capability.WorkspaceCommandWait).on("GetWorkspaceCommand", script(refused, refused, completed))
		c := clientOf(t, f)
		if _, err := c.WaitWorkspaceCommand(t.Context(), "c-1"); err != nil {
			t.Fatalf("WaitWorkspaceCommand = %v, want nil", err)
		}
		got := waitTimeouts(f)
		if len(got) != 3 || got[0] == 0 || got[1] != 0 || got[2] != 0 {
			t.Errorf("wait_timeout of the requests = %v, want one server-side wait, then polls", got)
		}
	})
}

func TestWaitWorkspaceCommandCapability(t *testing.T) {
	f := newFakeCtrl(capability.WorkspaceStart).on("GetWorkspaceCommand", script(completed))
	c := clientOf(t, f)
	_, err := c.WaitWorkspaceCommand(t.Context(), "c-1")
	var me *kibotos.MissingCapabilityError
	if !errors.As(err, &me) || me.Capability != capability.WorkspaceCreate {
		t.Fatalf("WaitWorkspaceCommand without workspace.create = %v, want a *MissingCapabilityError", err)
	}
	if got := f.methods(); !slices.Equal(got, []string{"GetServerInfo"}) {
		t.Errorf("requests = %v, want GetServerInfo alone", got)
	}
}

func TestWaitWorkspaceCommandFailure(t *testing.T) {
	failed := status(statusCompleted, &ctrlv1.CommandError{
		Code:   "resource_exhausted",
		Detail: &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, CommandSettled: true, Message: "no node has 64 GiB"},
	})
	f := newFakeCtrl(capability.WorkspaceCreate).on("GetWorkspaceCommand", script(processing, failed))
	c := clientOf(t, f)
	got, err := c.WaitWorkspaceCommand(t.Context(), "create-ws-2")
	if got.GetStatus() != statusCompleted {
		t.Errorf("WaitWorkspaceCommand returned %v, want the completed command", got)
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted || kibotos.Reason(err) != ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED || !kibotos.IsSettled(err) {
		t.Errorf("WaitWorkspaceCommand error = %v, want the command's settled resource_exhausted", err)
	}
}

func TestWaitWorkspaceCommandErrors(t *testing.T) {
	transient := func(context.Context, *ctrlv1.GetWorkspaceCommandRequest) (*ctrlv1.WorkspaceCommand, error) {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("store unavailable"))
	}
	notFound := func(context.Context, *ctrlv1.GetWorkspaceCommandRequest) (*ctrlv1.WorkspaceCommand, error) {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such command"))
	}
	t.Run("transient errors are polled through", func(t *testing.T) {
		f := newFakeCtrl(capability.WorkspaceCreate).on("GetWorkspaceCommand", script(transient, processing, transient, completed))
		c := clientOf(t, f, kibotos.WithConnectOptions(connect.WithGRPC()))
		if _, err := c.WaitWorkspaceCommand(t.Context(), "c"); err != nil {
			t.Fatalf("WaitWorkspaceCommand = %v, want nil", err)
		}
	})
	t.Run("a transient failure of GetServerInfo is read through", func(t *testing.T) {
		f := newFakeCtrl(capability.WorkspaceCreate).on("GetWorkspaceCommand", script(completed))
		f.on("GetServerInfo", func(_ context.Context, n int, _ proto.Message) (proto.Message, error) {
			if n == 1 {
				return nil, connect.NewError(connect.CodeUnavailable, errors.New("shutting down"))
			}
			return &ctrlv1.GetServerInfoResponse{Capabilities: f.caps}, nil
		})
		c := clientOf(t, f)
		if _, err := c.WaitWorkspaceCommand(t.Context(), "c"); err != nil {
			t.Fatalf("WaitWorkspaceCommand = %v, want nil", err)
		}
		if n := f.count("GetServerInfo"); n != 2 {
			t.Errorf("GetServerInfo called %d times, want 2", n)
		}
	})
	t.Run("a definite error ends the wait", func(t *testing.T) {
		f := newFakeCtrl(capability.WorkspaceCreate).on("GetWorkspaceCommand", script(processing, notFound))
		c := clientOf(t, f)
		if _, err := c.WaitWorkspaceCommand(t.Context(), "c"); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("WaitWorkspaceCommand = %v, want not_found", err)
		}
	})
	t.Run("the context ends the wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		cancelling := func(ctx context.Context, req *ctrlv1.GetWorkspaceCommandRequest) (*ctrlv1.WorkspaceCommand, error) {
			cancel() // the caller gives up while the second poll is in flight
			return processing(ctx, req)
		}
		f := newFakeCtrl(capability.WorkspaceCreate).on("GetWorkspaceCommand", script(processing, cancelling))
		c := clientOf(t, f)
		got, err := c.WaitWorkspaceCommand(ctx, "c")
		if err == nil || got.GetStatus() != statusProcessing {
			t.Fatalf("WaitWorkspaceCommand = %v, %v; want the last PROCESSING command and an error", got, err)
		}
	})
}
