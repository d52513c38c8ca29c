package api_test

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/store"
)

// waiters is what the stores' Notifier (store.LocalNotifier) tells of the
// subscriptions waiting on it.
type waiters interface {
	PrefixWaiters(prefix string) int
}

// requestWaiters are the subscriptions of requests, which wait for a
// Workspace's commands (store.WorkspaceTopic), apart from the standing ones
// ctrl keeps on its own topics for as long as it runs (the expiration
// engine, the reconcilers, the data tunnels).
func requestWaiters(w waiters) int {
	return w.PrefixWaiters(store.WorkspaceTopic(""))
}

func waitWaiters(t *testing.T, e *ctrltest.Env, n int) {
	t.Helper()
	w, ok := e.Store.(waiters)
	if !ok {
		t.Fatalf("%T does not count its waiters", e.Store)
	}
	deadline := time.Now().Add(10 * time.Second)
	for requestWaiters(w) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests wait, want %d", requestWaiters(w), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitServed waits until the server advertises name (a node registered).
func waitServed(t *testing.T, c ctrltest.Clients, name string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := c.ServerInfo.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err == nil && slices.Contains(res.Msg.GetCapabilities(), name) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never advertised (%v, %v)", name, res, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitFor(ctx context.Context, c ctrltest.Clients, id string, d time.Duration) (*ctrlv1.WorkspaceCommand, error) {
	res, err := c.Workspace.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: id, WaitTimeout: durationpb.New(d)}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetCommand(), nil
}

const completed = ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED

// TestWaitCommandPrompt: a wait returns as soon as the command completes,
// far sooner than the store is re-read (once a second) or a client polls.
func TestWaitCommandPrompt(t *testing.T) {
	t.Parallel()
	_, c, _ := wsEnv(t, ctrltest.Options{})
	waitServed(t, c, capability.WorkspaceCommandWait)
	var gaps []time.Duration
	for i := range 10 {
		id := "prompt-" + string(rune('a'+i))
		createWS(t, c, id)
		cmd, err := waitFor(t.Context(), c, id, 30*time.Second)
		seen := time.Now()
		if err != nil || cmd.GetStatus() != completed || cmd.GetError() != nil {
			t.Fatalf("wait(%s) = %v, %v; want COMPLETED without error", id, cmd, err)
		}
		gaps = append(gaps, seen.Sub(cmd.GetCompletedAt().AsTime()))
	}
	slices.Sort(gaps)
	t.Logf("completed_at → client saw it: min %v, median %v, max %v", gaps[0], gaps[len(gaps)/2], gaps[len(gaps)-1])
	// Re-reading once a second would give a median near 500 ms.
	if m := gaps[len(gaps)/2]; m > 100*time.Millisecond {
		t.Errorf("median completed_at → client = %v, want well under the 1 s recheck", m)
	}
}

// TestWaitCommand runs against a node whose starts wait for a gate, so
// the create command stays PROCESSING as long as the test wants. Not
// parallel: it counts goroutines.
func TestWaitCommand(t *testing.T) {
	rt := agenttest.New()
	rt.Gate = make(chan struct{})
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt})
	c := e.Clients(e.HTTP)
	ctx := t.Context()
	waitServed(t, c, capability.WorkspaceCommandWait)
	w, _ := createWS(t, c, "gated")

	// Past the timeout the command is answered as it is.
	t0 := time.Now()
	cmd, err := waitFor(ctx, c, "gated", 200*time.Millisecond)
	if err != nil || cmd.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING {
		t.Fatalf("wait past the timeout = %v, %v; want PROCESSING", cmd, err)
	}
	if d := time.Since(t0); d < 200*time.Millisecond {
		t.Fatalf("answered after %v, before the timeout", d)
	}

	// Bad timeouts.
	for name, d := range map[string]*durationpb.Duration{
		"zero":        {},
		"below 1 ms":  durationpb.New(time.Millisecond - 1),
		"above 60 s":  durationpb.New(time.Minute + time.Millisecond),
		"negative":    durationpb.New(-time.Second),
		"mixed signs": {Seconds: 1, Nanos: -5},
	} {
		_, err := c.Workspace.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: "gated", WaitTimeout: d}))
		if det := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false); det.GetField() != "wait_timeout" {
			t.Errorf("wait_timeout %s: field = %q, want wait_timeout", name, det.GetField())
		}
	}
	// An unknown command is not waited for.
	_, err = waitFor(ctx, c, "never-sent", time.Minute)
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)

	// The request's own deadline ends the wait.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	t0 = time.Now()
	_, err = waitFor(short, c, "gated", time.Minute)
	cancel()
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("wait beyond the request deadline = %v, want deadline_exceeded", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("the deadline of 300 ms ended the wait after %v", d)
	}
	waitWaiters(t, e, 0)

	// Other commands completing, on this Workspace or another, do not end
	// the wait: a start refused at admission (recorded, completed) and a
	// label change.
	other := make(chan error, 1)
	go func() {
		cmd, err := waitFor(ctx, c, "gated", time.Second)
		if err == nil && cmd.GetStatus() == completed {
			err = errString("the wait for gated returned COMPLETED")
		}
		other <- err
	}()
	waitWaiters(t, e, 1)
	_, err = c.Workspace.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("gated-start"), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
	if _, err := c.Workspace.UpdateWorkspaceLabels(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceLabelsRequest{Metadata: md("gated-labels"), WorkspaceId: w.GetWorkspaceId(), ExpectedRevision: 1})); err != nil {
		t.Fatal(err)
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}

	// Waiters whose requests end leave nothing behind.
	runtime.GC()
	base := runtime.NumGoroutine()
	const n = 200
	cctx, cancelAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := waitFor(cctx, c, "gated", time.Minute)
			errs <- err
		})
	}
	waitWaiters(t, e, n)
	cancelAll()
	wg.Wait()
	close(errs)
	for err := range errs {
		if connect.CodeOf(err) != connect.CodeCanceled {
			t.Fatalf("cancelled wait = %v, want canceled", err)
		}
	}
	waitWaiters(t, e, 0)
	waitGoroutines(t, base)

	// Many waiters all wake on the completion.
	type answer struct {
		cmd  *ctrlv1.WorkspaceCommand
		err  error
		seen time.Time
	}
	answers := make(chan answer, n)
	for range n {
		wg.Go(func() {
			cmd, err := waitFor(ctx, c, "gated", time.Minute)
			answers <- answer{cmd, err, time.Now()}
		})
	}
	waitWaiters(t, e, n)
	close(rt.Gate)
	wg.Wait()
	close(answers)
	var last time.Duration
	for a := range answers {
		if a.err != nil || a.cmd.GetStatus() != completed {
			t.Fatalf("wait = %v, %v; want COMPLETED", a.cmd, a.err)
		}
		last = max(last, a.seen.Sub(a.cmd.GetCompletedAt().AsTime()))
	}
	t.Logf("%d waiters: the last saw the completion %v after completed_at", n, last)
	waitWaiters(t, e, 0)
}

type errString string

func (e errString) Error() string { return string(e) }

func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the waiters:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
