package workspace_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/workspace"
)

// newService returns a Service on a fresh SQLite store, without a
// reconciler: tests play the node by writing the store.
func newService(t *testing.T) (*workspace.Service, *sqlite.Store) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &workspace.Service{
		Engine: &command.Engine{Store: st}, Store: st, Pages: paging.NewCodec([]byte("0123456789abcdef0123456789abcdef")),
		Templates:   func(id string) (string, bool) { return "v1", id == workspace.DefaultTemplate },
		MaxCapacity: func() workspace.Capacity { return workspace.Capacity{MemoryMiB: 4096, CPUMillis: 4000} },
		WaitBound:   50 * time.Millisecond,
		// Long enough that a wait that returns was woken by a notification.
		Recheck: time.Hour,
	}, st
}

func createReq(id string, exp *ctrlv1.ExpirationSpec) *ctrlv1.CreateWorkspaceRequest {
	return &ctrlv1.CreateWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: id},
		Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}, Expiration: exp}
}

func create(t *testing.T, s *workspace.Service, id string) *ctrlv1.Workspace {
	t.Helper()
	res, err := s.Create(t.Context(), createReq(id, nil))
	if err != nil {
		t.Fatalf("Create(%s) = %v", id, err)
	}
	return res.GetWorkspace()
}

// completeCommand completes a command as the reconciler does: in a
// transaction, then a notification of its Workspace after the commit.
func completeCommand(t *testing.T, st store.Store, id string) {
	t.Helper()
	var ws string
	err := st.InTx(context.Background(), func(tx store.Tx) error {
		rec, err := tx.GetCommand(context.Background(), id)
		if err != nil {
			return err
		}
		ws = rec.ObjectID
		rec.Status, rec.CompletedAt = store.CommandCompleted, time.Now().UTC().Truncate(time.Microsecond)
		return tx.UpdateCommand(context.Background(), rec)
	})
	if err != nil {
		t.Fatal(err)
	}
	st.Notify(store.WorkspaceTopic(ws))
}

// makeAvailable plays a node that started the Workspace.
func makeAvailable(t *testing.T, st store.Store, id string) {
	t.Helper()
	err := st.InTx(context.Background(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(context.Background(), id)
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, true
		w.ObservedGeneration, w.ObservedState, w.CommandID, w.NodeID = w.Generation, store.ExecRunning, "", "node-1"
		if err := workspace.Save(w, pub, time.Now().UTC().Truncate(time.Microsecond)); err != nil {
			return err
		}
		return tx.UpdateWorkspace(context.Background(), w)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func wantFault(t *testing.T, what string, err error, kind fault.Kind, field string) {
	t.Helper()
	fe, ok := fault.As(err)
	if !ok || fe.Kind != kind || fe.Field != field {
		t.Errorf("%s = %v, want a %v fault on %q", what, err, kind, field)
	}
}

// TestExpirationRules: the expiration of a create or a stop is validated and
// applied by the service. The server refuses both requests before they get
// here while workspace.expiration is not served (the API tests check that);
// these rules are what it will serve.
func TestExpirationRules(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	ctx := t.Context()
	future := timestamppb.New(time.Now().Add(time.Hour))
	for name, tc := range map[string]struct {
		exp   *ctrlv1.ExpirationSpec
		field string
	}{
		"past deadline":           {&ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP, Deadline: timestamppb.New(time.Now().Add(-time.Minute))}, "expiration.deadline"},
		"policy without deadline": {&ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE}, "expiration.deadline"},
		"deadline without policy": {&ctrlv1.ExpirationSpec{Deadline: future}, "expiration.deadline"},
		"unknown policy":          {&ctrlv1.ExpirationSpec{Policy: 42, Deadline: future}, "expiration.policy"},
	} {
		_, err := s.Create(ctx, createReq("bad-"+strings.ReplaceAll(name, " ", "-"), tc.exp))
		wantFault(t, "Create("+name+")", err, fault.KindInvalidArgument, tc.field)
	}

	res, err := s.Create(ctx, createReq("exp-create", &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, Deadline: future}))
	if err != nil {
		t.Fatal(err)
	}
	w := res.GetWorkspace()
	if e := w.GetExpiration(); e.GetPolicy() != ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE || e.GetRevision() != 1 {
		t.Fatalf("expiration after create = %v, want DELETE at revision 1", e)
	}

	// A stop that carries an expiration commits it with the stop: the
	// revision moves (the stop itself then waits for a node that never
	// comes, and times out retryably).
	makeAvailable(t, st, w.GetWorkspaceId())
	stop := func(id string, exp *ctrlv1.ExpirationSpec) error {
		_, err := s.Stop(ctx, &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: id},
			WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1, Expiration: exp})
		return err
	}
	err = stop("exp-stop-bad", &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP, Deadline: timestamppb.New(time.Now().Add(-time.Minute))})
	wantFault(t, "Stop(past deadline)", err, fault.KindInvalidArgument, "expiration.deadline")
	err = stop("exp-stop", &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP, Deadline: future})
	if fe, ok := fault.As(err); !ok || fe.Reason != fault.ReasonTimedOut {
		t.Fatalf("Stop without a node = %v, want TIMED_OUT", err)
	}
	got, err := s.Get(ctx, w.GetWorkspaceId())
	if err != nil {
		t.Fatal(err)
	}
	if e := got.GetExpiration(); e.GetRevision() != 2 || e.GetPolicy() != ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP {
		t.Fatalf("expiration after a stop with an expiration = %v, want STOP at revision 2", e)
	}
}

func getCommand(ctx context.Context, s *workspace.Service, id string, wait time.Duration) (*ctrlv1.WorkspaceCommand, error) {
	return s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: id, WaitTimeout: durationpb.New(wait)})
}

// waitWaiters waits until n requests wait on the store.
func waitWaiters(t *testing.T, st *sqlite.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for st.Waiters() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, want %d", st.Waiters(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

type answer struct {
	cmd *ctrlv1.WorkspaceCommand
	err error
	at  time.Time
}

func waitAsync(ctx context.Context, s *workspace.Service, id string, d time.Duration) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		c, err := getCommand(ctx, s, id, d)
		ch <- answer{c, err, time.Now()}
	}()
	return ch
}

// TestWaitWakesOnNotification: a waiting GetCommand returns on the
// notification of the completing commit (the recheck is an hour), and
// only its own Workspace's notifications wake it.
func TestWaitWakesOnNotification(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	create(t, s, "wake-a")
	create(t, s, "wake-b")
	a := waitAsync(t.Context(), s, "wake-a", 30*time.Second)
	waitWaiters(t, st, 1)

	// B completes: A's waiter must not return.
	completeCommand(t, st, "wake-b")
	select {
	case r := <-a:
		t.Fatalf("the waiter for wake-a returned when wake-b completed: %v, %v", r.cmd, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	if c, err := getCommand(t.Context(), s, "wake-b", time.Millisecond); err != nil || c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
		t.Fatalf("wake-b = %v, %v; want COMPLETED at once", c, err)
	}

	t0 := time.Now()
	completeCommand(t, st, "wake-a")
	select {
	case r := <-a:
		if r.err != nil || r.cmd.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
			t.Fatalf("wait = %v, %v; want COMPLETED", r.cmd, r.err)
		}
		t.Logf("returned %v after the commit", r.at.Sub(t0))
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not return on the notification")
	}
	waitWaiters(t, st, 0)
}

// TestWaitTimeout: past the timeout the command is returned as it is, not
// an error; an unknown command is not_found at once; bad timeouts are
// refused.
func TestWaitTimeout(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	create(t, s, "slow")
	t0 := time.Now()
	c, err := getCommand(t.Context(), s, "slow", 100*time.Millisecond)
	if err != nil || c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING {
		t.Fatalf("wait = %v, %v; want PROCESSING", c, err)
	}
	if d := time.Since(t0); d < 100*time.Millisecond {
		t.Fatalf("returned after %v, before the timeout", d)
	}
	_, err = getCommand(t.Context(), s, "nope", time.Minute)
	wantFault(t, "wait(unknown command)", err, fault.KindNotFound, "")
	for name, d := range map[string]*durationpb.Duration{
		"zero":           {},
		"below 1 ms":     durationpb.New(999 * time.Microsecond),
		"above 60 s":     durationpb.New(time.Minute + time.Nanosecond),
		"negative":       durationpb.New(-time.Second),
		"mixed signs":    {Seconds: 1, Nanos: -1},
		"nanos overflow": {Nanos: 1e9},
	} {
		_, err := s.GetCommand(t.Context(), &ctrlv1.GetWorkspaceCommandRequest{CommandId: "slow", WaitTimeout: d})
		wantFault(t, "wait("+name+")", err, fault.KindInvalidArgument, "wait_timeout")
	}
	for _, d := range []time.Duration{time.Millisecond, time.Minute} {
		if _, err := workspace.CheckWaitTimeout("wait_timeout", durationpb.New(d)); err != nil {
			t.Errorf("CheckWaitTimeout(%v) = %v, want nil", d, err)
		}
	}
	waitWaiters(t, st, 0)
}

// TestWaitersReleased: many waiters all wake on one completion, and
// waiters whose requests end leave nothing behind (no subscription, no
// goroutine).
func TestWaitersReleased(t *testing.T) {
	s, st := newService(t)
	create(t, s, "many")
	const n = 200
	runtime.GC()
	base := runtime.NumGoroutine()

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := getCommand(ctx, s, "many", time.Minute)
			errs <- err
		})
	}
	waitWaiters(t, st, n)
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled wait = %v, want context.Canceled", err)
		}
	}
	waitWaiters(t, st, 0)
	waitGoroutines(t, base)

	answers := make(chan answer, n)
	for range n {
		wg.Go(func() {
			c, err := getCommand(t.Context(), s, "many", time.Minute)
			answers <- answer{c, err, time.Now()}
		})
	}
	waitWaiters(t, st, n)
	completeCommand(t, st, "many")
	wg.Wait()
	close(answers)
	for r := range answers {
		if r.err != nil || r.cmd.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
			t.Fatalf("wait = %v, %v; want COMPLETED", r.cmd, r.err)
		}
	}
	waitWaiters(t, st, 0)
	waitGoroutines(t, base)
}

func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the waiters:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStopWaitsForNotification: StopWorkspace's bounded wait uses the same
// mechanism: it returns the completed stop on the notification.
func TestStopWaitsForNotification(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	s.WaitBound = time.Minute
	w := create(t, s, "stop-create")
	makeAvailable(t, st, w.GetWorkspaceId())
	done := make(chan error, 1)
	go func() {
		_, err := s.Stop(t.Context(), &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "stop-1"},
			WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1})
		done <- err
	}()
	waitWaiters(t, st, 1)
	// Complete it with a recorded failure: the stop returns that failure.
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		rec, err := tx.GetCommand(t.Context(), "stop-1")
		if err != nil {
			return err
		}
		rec.Status, rec.CompletedAt = store.CommandCompleted, time.Now().UTC().Truncate(time.Microsecond)
		rec.ErrorCode = fault.KindFailedPrecondition.String()
		return tx.UpdateCommand(t.Context(), rec)
	})
	if err != nil {
		t.Fatal(err)
	}
	st.Notify(store.WorkspaceTopic(w.GetWorkspaceId()))
	select {
	case err := <-done:
		wantFault(t, "Stop", err, fault.KindFailedPrecondition, "")
	case <-time.After(5 * time.Second):
		t.Fatal("the stop did not return on the notification")
	}
}
