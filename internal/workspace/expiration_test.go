package workspace_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/workspace"
)

const (
	expStop   = ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP
	expDelete = ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE
)

// clock is a settable clock for the Service and its command engine.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// expService returns a Service on a fresh store of either dialect, on a
// settable clock that starts now, without a reconciler (tests play the node
// by writing the store).
func expService(t *testing.T, st store.Store) (*workspace.Service, *clock) {
	t.Helper()
	c := &clock{}
	c.ns.Store(time.Now().Truncate(time.Microsecond).UnixNano())
	return &workspace.Service{
		Engine: &command.Engine{Store: st, Now: c.Now}, Store: st, Now: c.Now,
		Pages:       paging.NewCodec([]byte("0123456789abcdef0123456789abcdef")),
		Templates:   func(id string) (string, bool) { return "v1", id == workspace.DefaultTemplate },
		MaxCapacity: func() workspace.Capacity { return workspace.Capacity{MemoryMiB: 4096, CPUMillis: 4000} },
		WaitBound:   20 * time.Millisecond,
	}, c
}

// expStore opens a fresh SQLite or PostgreSQL store (the PostgreSQL one is
// skipped without KIBOTOS_TEST_POSTGRES_URL, and fails in CI).
func expStore(t *testing.T, pg bool) store.Store {
	t.Helper()
	if !pg {
		st, err := sqlite.Open(context.Background(), t.TempDir()+"/ctrl.db")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	const env = "KIBOTOS_TEST_POSTGRES_URL"
	url := os.Getenv(env)
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set; CI must run the PostgreSQL tests", env)
		}
		t.Skipf("%s is not set: skipping PostgreSQL test", env)
	}
	st, cleanup, err := pgtest.Open(context.Background(), url, postgres.Open)
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	t.Cleanup(func() {
		if err := cleanup(); err != nil {
			t.Errorf("drop test schema: %v", err)
		}
	})
	return st
}

// bothDialects runs f on SQLite and on PostgreSQL (skipped without
// KIBOTOS_TEST_POSTGRES_URL, failed in CI).
func bothDialects(t *testing.T, f func(t *testing.T, st store.Store)) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			t.Parallel()
			f(t, expStore(t, pg))
		})
	}
}

func expReq(cid, ws string, expected uint64, exp *ctrlv1.ExpirationSpec) *ctrlv1.UpdateWorkspaceExpirationRequest {
	return &ctrlv1.UpdateWorkspaceExpirationRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid}, WorkspaceId: ws,
		ExpectedRevision: expected, Expiration: exp}
}

func spec(p ctrlv1.ExpirationPolicy, at time.Time) *ctrlv1.ExpirationSpec {
	return &ctrlv1.ExpirationSpec{Policy: p, Deadline: timestamppb.New(at)}
}

// wantRefusal checks a fault's kind, reason and field, and that it carries
// the Workspace as observed with expiration revision rev (0: none carried).
func wantExpRefusal(t *testing.T, what string, err error, kind fault.Kind, reason fault.Reason, field string, rev uint64) {
	t.Helper()
	fe, ok := fault.As(err)
	switch {
	case !ok || fe.Kind != kind || fe.Reason != reason || fe.Field != field:
		t.Errorf("%s = %v, want %v %v on %q", what, err, kind, reason, field)
	case rev == 0 && fe.ObservedWorkspace != nil:
		t.Errorf("%s carries observed_workspace %v, want none", what, fe.ObservedWorkspace)
	case rev != 0 && fe.ObservedWorkspace.GetExpiration().GetRevision() != rev:
		t.Errorf("%s: observed_workspace %v, want it at expiration revision %d", what, fe.ObservedWorkspace, rev)
	}
}

// TestUpdateExpiration: every sentence of UpdateWorkspaceExpiration.
func TestUpdateExpiration(t *testing.T) {
	t.Parallel()
	bothDialects(t, func(t *testing.T, st store.Store) {
		s, clk := expService(t, st)
		ctx := t.Context()
		id := create(t, s, "ue-create").GetWorkspaceId()
		at := clk.Now().Add(time.Hour).Add(123) // sub-microsecond digits
		upd := func(cid string, expected uint64, exp *ctrlv1.ExpirationSpec) (*ctrlv1.Workspace, error) {
			res, err := s.UpdateExpiration(ctx, expReq(cid, id, expected, exp))
			return res.GetWorkspace(), err
		}
		wantExp := func(what string, got *ctrlv1.Workspace, p ctrlv1.ExpirationPolicy, deadline time.Time, rev uint64) {
			t.Helper()
			e := got.GetExpiration()
			if e.GetPolicy() != p || e.GetRevision() != rev || (deadline.IsZero() != (e.GetDeadline() == nil)) ||
				(!deadline.IsZero() && !e.GetDeadline().AsTime().Equal(deadline)) {
				t.Errorf("%s: expiration %v, want %v at %v, revision %d", what, e, p, deadline, rev)
			}
			// The stored query column follows the document, rounded up
			// to the microsecond.
			w, _ := row(t, st, id)
			want := time.Time{}
			if !deadline.IsZero() {
				want = deadline.UTC().Truncate(time.Microsecond)
				if !want.Equal(deadline) {
					want = want.Add(time.Microsecond)
				}
			}
			if !w.ExpirationDeadline.Equal(want) {
				t.Errorf("%s: stored deadline %v, want %v", what, w.ExpirationDeadline, want)
			}
		}

		// Sets a policy: the revision moves from 1 to 2.
		got, err := upd("ue-set", 1, spec(expStop, at))
		if err != nil {
			t.Fatal(err)
		}
		wantExp("set STOP", got, expStop, at, 2)
		// Equal content keeps the revision.
		got, err = upd("ue-same", 2, spec(expStop, at))
		if err != nil {
			t.Fatal(err)
		}
		wantExp("same content", got, expStop, at, 2)
		// A change increments it: the deadline, then the policy.
		got, err = upd("ue-later", 2, spec(expStop, at.Add(time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		wantExp("later deadline", got, expStop, at.Add(time.Minute), 3)
		got, err = upd("ue-delete", 3, spec(expDelete, at.Add(time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		wantExp("DELETE policy", got, expDelete, at.Add(time.Minute), 4)
		// Clearing: no expiration, or policy UNSPECIFIED; clearing what is
		// clear keeps the revision.
		got, err = upd("ue-clear", 4, nil)
		if err != nil {
			t.Fatal(err)
		}
		wantExp("cleared", got, 0, time.Time{}, 5)
		got, err = upd("ue-clear-again", 5, &ctrlv1.ExpirationSpec{})
		if err != nil {
			t.Fatal(err)
		}
		wantExp("cleared again", got, 0, time.Time{}, 5)

		// A revision mismatch is failed_precondition, reason
		// EXPIRATION_REVISION_MISMATCH, with the Workspace as observed;
		// settled: the same ID replays it.
		for range 2 {
			_, err = upd("ue-stale", 4, spec(expStop, at))
			wantExpRefusal(t, "stale expected_revision", err, fault.KindFailedPrecondition, fault.ReasonExpirationRevisionMismatch, "expected_revision", 5)
		}
		// Bad input: invalid_argument with the field; nothing stored.
		now := clk.Now()
		for name, tc := range map[string]struct {
			exp   *ctrlv1.ExpirationSpec
			field string
		}{
			"past deadline":           {spec(expStop, now.Add(-time.Second)), "expiration.deadline"},
			"deadline now":            {spec(expStop, now), "expiration.deadline"},
			"beyond the horizon":      {spec(expDelete, now.Add(workspace.MaxExpirationHorizon+time.Second)), "expiration.deadline"},
			"policy without deadline": {&ctrlv1.ExpirationSpec{Policy: expStop}, "expiration.deadline"},
			"invalid deadline":        {&ctrlv1.ExpirationSpec{Policy: expStop, Deadline: &timestamppb.Timestamp{Seconds: 1, Nanos: -1}}, "expiration.deadline"},
			"deadline without policy": {&ctrlv1.ExpirationSpec{Deadline: timestamppb.New(at)}, "expiration.deadline"},
			"unknown policy":          {spec(42, at), "expiration.policy"},
		} {
			_, err := upd("ue-bad-"+fmt.Sprint(len(name)), 5, tc.exp)
			wantExpRefusal(t, name, err, fault.KindInvalidArgument, fault.ReasonInvalidArgument, tc.field, 0)
		}
		// At the horizon is accepted.
		if got, err = upd("ue-horizon", 5, spec(expDelete, now.Add(workspace.MaxExpirationHorizon))); err != nil {
			t.Fatalf("deadline at the horizon: %v", err)
		}
		wantExp("at the horizon", got, expDelete, now.Add(workspace.MaxExpirationHorizon), 6)

		// Completes at once: the command is COMPLETED, of kind
		// UPDATE_EXPIRATION, by the caller.
		c, err := s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: "ue-set"})
		if err != nil {
			t.Fatal(err)
		}
		if c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED ||
			c.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_EXPIRATION ||
			c.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_CALLER {
			t.Errorf("command of UpdateWorkspaceExpiration = %v, want COMPLETED UPDATE_EXPIRATION by the CALLER", c)
		}

		// A resend after its deadline passed replays the first answer.
		soon := clk.Now().Add(time.Second)
		first, err := upd("ue-replay", 6, spec(expStop, soon))
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Second)
		again, err := upd("ue-replay", 6, spec(expStop, soon))
		if err != nil || again.GetExpiration().GetRevision() != first.GetExpiration().GetRevision() {
			t.Errorf("resend after the deadline = %v, %v; want the replay of revision %d", again.GetExpiration(), err, first.GetExpiration().GetRevision())
		}

		// States that do not allow the change: failed_precondition
		// STATE_CONFLICT with the Workspace as observed (its state tells it
		// from a revision mismatch); judged before the revision.
		for _, state := range []ctrlv1.WorkspaceState{ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED} {
			other := create(t, s, "ue-gone-"+state.String()).GetWorkspaceId()
			edit(t, st, other, func(w *store.Workspace, pub *ctrlv1.Workspace) {
				pub.State = state
				w.Power = store.PowerDeleted
			})
			for _, expected := range []uint64{1, 9} {
				_, err := s.UpdateExpiration(ctx, expReq(fmt.Sprintf("ue-gone-%d-%d", state, expected), other, expected, spec(expStop, clk.Now().Add(time.Hour))))
				wantExpRefusal(t, state.String(), err, fault.KindFailedPrecondition, fault.ReasonStateConflict, "", 1)
				if fe, _ := fault.As(err); fe.ObservedWorkspace.GetState() != state {
					t.Errorf("observed state %v, want %v", fe.ObservedWorkspace.GetState(), state)
				}
			}
		}
	})
}

// TestUpdateExpirationStates: the change is accepted in every state but
// DELETING and DELETED.
func TestUpdateExpirationStates(t *testing.T) {
	t.Parallel()
	bothDialects(t, func(t *testing.T, st store.Store) {
		s, clk := expService(t, st)
		for _, state := range ctrlv1.WorkspaceState_value {
			state := ctrlv1.WorkspaceState(state)
			if state == 0 || state == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING || state == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
				continue
			}
			id := create(t, s, "us-"+state.String()).GetWorkspaceId()
			edit(t, st, id, func(w *store.Workspace, pub *ctrlv1.Workspace) { pub.State = state })
			res, err := s.UpdateExpiration(t.Context(), expReq("us-set-"+state.String(), id, 1, spec(expDelete, clk.Now().Add(time.Hour))))
			if err != nil || res.GetWorkspace().GetExpiration().GetRevision() != 2 {
				t.Errorf("UpdateExpiration on %v = %v, %v; want revision 2", state, res.GetWorkspace().GetExpiration(), err)
			}
		}
	})
}

// TestStopExpiration: StopWorkspace's expiration sentences, and the CAS of
// stop, start and delete on expected_expiration_revision.
func TestStopExpiration(t *testing.T) {
	t.Parallel()
	bothDialects(t, func(t *testing.T, st store.Store) {
		s, clk := expService(t, st)
		ctx := t.Context()
		stop := func(cid, id string, expected uint64, exp *ctrlv1.ExpirationSpec) error {
			_, err := s.Stop(ctx, &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid},
				WorkspaceId: id, ExpectedExpirationRevision: expected, Expiration: exp})
			if fe, ok := fault.As(err); ok && fe.Reason == fault.ReasonTimedOut {
				return nil // admitted; no node completes it here
			}
			return err
		}
		// avail returns an AVAILABLE Workspace armed with exp (nil: none).
		avail := func(name string, exp *ctrlv1.ExpirationSpec) string {
			res, err := s.Create(ctx, createReq("se-"+name, exp))
			if err != nil {
				t.Fatal(err)
			}
			makeAvailable(t, st, res.GetWorkspace().GetWorkspaceId())
			return res.GetWorkspace().GetWorkspaceId()
		}
		at := clk.Now().Add(time.Hour)
		for _, tc := range []struct {
			name    string
			armed   *ctrlv1.ExpirationSpec // at creation
			stopExp *ctrlv1.ExpirationSpec // the stop's own
			policy  ctrlv1.ExpirationPolicy
			rev     uint64
		}{
			// Without an expiration, a STOP policy is consumed ...
			{"stop policy consumed", spec(expStop, at), nil, 0, 2},
			// ... and a DELETE policy keeps constraining the stopped Workspace.
			{"delete policy kept", spec(expDelete, at), nil, expDelete, 1},
			{"nothing armed", nil, nil, 0, 1},
			// With one, it is committed in the stop admission.
			{"stop sets DELETE", nil, spec(expDelete, at), expDelete, 2},
			{"stop replaces STOP", spec(expStop, at), spec(expDelete, at.Add(time.Minute)), expDelete, 2},
			{"stop re-arms STOP", spec(expStop, at), spec(expStop, at.Add(time.Minute)), expStop, 2},
			{"stop clears DELETE", spec(expDelete, at), &ctrlv1.ExpirationSpec{}, 0, 2},
			{"stop keeps equal DELETE", spec(expDelete, at), spec(expDelete, at), expDelete, 1},
		} {
			cid := strings.ReplaceAll(tc.name, " ", "-")
			id := avail(cid, tc.armed)
			if err := stop("se-stop-"+cid, id, 1, tc.stopExp); err != nil {
				t.Fatalf("%s: Stop = %v", tc.name, err)
			}
			w, pub := row(t, st, id)
			e := pub.GetExpiration()
			if pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING || e.GetPolicy() != tc.policy || e.GetRevision() != tc.rev {
				t.Errorf("%s: after the stop admission %v %v, want STOPPING with policy %v at revision %d", tc.name, pub.GetState(), e, tc.policy, tc.rev)
			}
			if armed := !w.ExpirationDeadline.IsZero(); armed != (tc.policy != 0) {
				t.Errorf("%s: stored deadline %v, want armed = %v", tc.name, w.ExpirationDeadline, tc.policy != 0)
			}
		}

		// Bad expirations of a stop are invalid_argument; nothing admitted.
		id := avail("bad", nil)
		err := stop("se-bad-stop", id, 1, spec(expStop, clk.Now().Add(-time.Minute)))
		wantExpRefusal(t, "stop with a past deadline", err, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "expiration.deadline", 0)
		err = stop("se-far-stop", id, 1, spec(expStop, clk.Now().Add(workspace.MaxExpirationHorizon+time.Hour)))
		wantExpRefusal(t, "stop beyond the horizon", err, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "expiration.deadline", 0)
		if _, pub := row(t, st, id); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			t.Fatalf("after refused stops: %v, want AVAILABLE", pub.GetState())
		}
		// A stop resent after its expiration's deadline passed replays.
		if err := stop("se-replay", id, 1, spec(expDelete, clk.Now().Add(time.Second))); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Second)
		_, err = s.Stop(ctx, &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "se-replay"},
			WorkspaceId: id, ExpectedExpirationRevision: 1, Expiration: spec(expDelete, clk.Now().Add(-time.Second))})
		if fe, ok := fault.As(err); ok && fe.Kind == fault.KindInvalidArgument {
			t.Errorf("resent stop after its deadline = %v, want its replay", err)
		}

		// Stop, start and delete check expected_expiration_revision:
		// failed_precondition EXPIRATION_REVISION_MISMATCH with the
		// Workspace as observed.
		id = avail("cas", spec(expDelete, clk.Now().Add(time.Hour)))
		if _, err := s.UpdateExpiration(ctx, expReq("se-cas-move", id, 1, spec(expDelete, clk.Now().Add(2*time.Hour)))); err != nil {
			t.Fatal(err)
		}
		err = stop("se-cas-stop", id, 1, nil)
		wantExpRefusal(t, "stop at a stale revision", err, fault.KindFailedPrecondition, fault.ReasonExpirationRevisionMismatch, "expected_expiration_revision", 2)
		_, err = s.Start(ctx, &ctrlv1.StartWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "se-cas-start"}, WorkspaceId: id, ExpectedExpirationRevision: 1})
		wantExpRefusal(t, "start at a stale revision", err, fault.KindFailedPrecondition, fault.ReasonExpirationRevisionMismatch, "expected_expiration_revision", 2)
		_, err = s.Delete(ctx, &ctrlv1.DeleteWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "se-cas-delete"}, WorkspaceId: id, ExpectedExpirationRevision: 3})
		wantExpRefusal(t, "delete at a stale revision", err, fault.KindFailedPrecondition, fault.ReasonExpirationRevisionMismatch, "expected_expiration_revision", 2)
	})
}

// state puts a Workspace in a state as the reconciler would leave it.
func state(t *testing.T, s *workspace.Service, st store.Store, id string, want ctrlv1.WorkspaceState) {
	t.Helper()
	ctx := t.Context()
	admitted := func(err error) {
		t.Helper()
		if fe, ok := fault.As(err); err != nil && (!ok || fe.Reason != fault.ReasonTimedOut) {
			t.Fatal(err)
		}
	}
	switch want {
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING:
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE:
		makeAvailable(t, st, id)
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN: // over AVAILABLE
		makeAvailable(t, st, id)
		edit(t, st, id, func(_ *store.Workspace, pub *ctrlv1.Workspace) { pub.State = want })
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED:
		stopped(t, st, id)
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING:
		stopped(t, st, id)
		_, err := s.Start(ctx, &ctrlv1.StartWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "start-" + id}, WorkspaceId: id, ExpectedExpirationRevision: revOf(t, st, id)})
		admitted(err)
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING:
		makeAvailable(t, st, id)
		_, err := s.Stop(ctx, &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "stop-" + id}, WorkspaceId: id, ExpectedExpirationRevision: revOf(t, st, id),
			Expiration: specOf(t, st, id)})
		admitted(err)
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING:
		makeAvailable(t, st, id)
		_, err := s.Delete(ctx, &ctrlv1.DeleteWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "delete-" + id}, WorkspaceId: id, ExpectedExpirationRevision: revOf(t, st, id)})
		admitted(err)
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED: // a failed stop that holds its execution
		edit(t, st, id, func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, pub.HoldsExecution = want, true
			w.Power, w.ObservedGeneration, w.ObservedState, w.CommandID, w.NodeID = store.PowerStopped, w.Generation, store.ExecFailed, "", "node-1"
		})
	default:
		t.Fatalf("no way to reach %v", want)
	}
	if _, pub := row(t, st, id); pub.GetState() != want {
		t.Fatalf("%s is %v, want %v", id, pub.GetState(), want)
	}
}

func revOf(t *testing.T, st store.Store, id string) uint64 {
	_, pub := row(t, st, id)
	return pub.GetExpiration().GetRevision()
}

// specOf is the Workspace's expiration as a stop keeps it.
func specOf(t *testing.T, st store.Store, id string) *ctrlv1.ExpirationSpec {
	_, pub := row(t, st, id)
	e := pub.GetExpiration()
	return &ctrlv1.ExpirationSpec{Policy: e.GetPolicy(), Deadline: e.GetDeadline()}
}

// TestFireExpiration: what a due expiration does in each state, recorded
// as `expiration/<workspace>/<revision>` by the EXPIRATION initiator, in
// the transaction that moves the revision.
func TestFireExpiration(t *testing.T) {
	t.Parallel()
	const (
		creating   = ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING
		starting   = ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
		available  = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
		stopping   = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
		stopped    = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
		failed     = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
		deleting   = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING
		unknown    = ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN
		stopKind   = ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP
		delKind    = ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_DELETE
		normalStop = "a normal stop, as StopWorkspace would (writeback first)"
		deleted    = "deleted as DeleteWorkspace would"
	)
	tests := []struct {
		policy ctrlv1.ExpirationPolicy
		state  ctrlv1.WorkspaceState
		want   workspace.Firing
		kind   ctrlv1.WorkspaceCommandKind
		after  ctrlv1.WorkspaceState // the state the firing leaves
		// why: the command's message after "expiration: the <policy>
		// deadline <deadline> passed; "
		why string
	}{
		{expStop, available, workspace.FiringStarted, stopKind, stopping, normalStop},
		{expStop, unknown, workspace.FiringStarted, stopKind, stopping, normalStop}, // over AVAILABLE, as StopWorkspace
		{expStop, stopped, workspace.FiringConsumed, stopKind, stopped, "the workspace was STOPPED: the policy is consumed without a stop"},
		{expStop, failed, workspace.FiringConsumed, stopKind, failed, "the workspace was FAILED: the policy is consumed without a stop"},
		{expStop, creating, workspace.FiringWaits, 0, creating, ""},
		{expStop, starting, workspace.FiringWaits, 0, starting, ""},
		{expStop, stopping, workspace.FiringWaits, 0, stopping, ""},
		{expStop, deleting, workspace.FiringWaits, 0, deleting, ""},
		{expDelete, available, workspace.FiringStarted, delKind, deleting, deleted},
		{expDelete, creating, workspace.FiringStarted, delKind, deleting, deleted},
		{expDelete, starting, workspace.FiringStarted, delKind, deleting, deleted},
		{expDelete, stopping, workspace.FiringStarted, delKind, deleting, deleted},
		{expDelete, stopped, workspace.FiringStarted, delKind, deleting, deleted},
		{expDelete, failed, workspace.FiringStarted, delKind, deleting, deleted},
		{expDelete, unknown, workspace.FiringStarted, delKind, deleting, deleted},
		{expDelete, deleting, workspace.FiringWaits, 0, deleting, ""},
	}
	bothDialects(t, func(t *testing.T, st store.Store) {
		s, clk := expService(t, st)
		ctx := t.Context()
		type armed struct {
			id       string
			rev      uint64
			cmd      string // the command in flight before the firing
			deadline time.Time
		}
		var ids []armed
		for i, tc := range tests {
			id := create(t, s, fmt.Sprintf("fe-%d", i)).GetWorkspaceId()
			if _, err := s.UpdateExpiration(ctx, expReq(fmt.Sprintf("fe-arm-%d", i), id, 1, spec(tc.policy, clk.Now().Add(time.Hour)))); err != nil {
				t.Fatal(err)
			}
			state(t, s, st, id, tc.state)
			w, pub := row(t, st, id)
			ids = append(ids, armed{id, revOf(t, st, id), w.CommandID, pub.GetExpiration().GetDeadline().AsTime()})
		}
		// Not due yet: nothing.
		for _, a := range ids {
			if f, cid, err := s.FireExpiration(ctx, a.id); err != nil || f != workspace.FiringNone || cid != "" {
				t.Fatalf("FireExpiration before the deadline = %v %q %v, want none", f, cid, err)
			}
		}
		clk.Advance(time.Hour)
		for i, tc := range tests {
			a := ids[i]
			name := fmt.Sprintf("%v on %v", tc.policy, tc.state)
			f, cid, err := s.FireExpiration(ctx, a.id)
			if err != nil || f != tc.want {
				t.Errorf("%s: FireExpiration = %v, %v; want %v", name, f, err, tc.want)
				continue
			}
			w, pub := row(t, st, a.id)
			if pub.GetState() != tc.after {
				t.Errorf("%s: state after firing %v, want %v", name, pub.GetState(), tc.after)
			}
			if f == workspace.FiringWaits {
				if cid != "" || revOf(t, st, a.id) != a.rev || w.ExpirationDeadline.IsZero() {
					t.Errorf("%s: a waiting firing wrote (%q, revision %d, deadline %v)", name, cid, revOf(t, st, a.id), w.ExpirationDeadline)
				}
				continue
			}
			// Consumed: revision moved, nothing armed.
			e := pub.GetExpiration()
			if e.GetPolicy() != 0 || e.GetDeadline() != nil || e.GetRevision() != a.rev+1 || !w.ExpirationDeadline.IsZero() {
				t.Errorf("%s: expiration after firing %v (stored %v), want none at revision %d", name, e, w.ExpirationDeadline, a.rev+1)
			}
			wantID := fmt.Sprintf("expiration/%s/%d", a.id, a.rev)
			c, err := s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: wantID})
			if err != nil || cid != wantID {
				t.Fatalf("%s: command %q: %v %v", name, cid, c, err)
			}
			wantStatus := ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING
			if f == workspace.FiringConsumed {
				wantStatus = ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED
			}
			if c.GetKind() != tc.kind || c.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_EXPIRATION ||
				c.GetStatus() != wantStatus || c.GetError() != nil || c.GetWorkspaceId() != a.id {
				t.Errorf("%s: command %v, want %v by EXPIRATION, %v, no error", name, c, tc.kind, wantStatus)
			}
			// It says why.
			if want := fmt.Sprintf("expiration: the %s deadline %s passed; %s", strings.TrimPrefix(tc.policy.String(), "EXPIRATION_POLICY_"),
				a.deadline.UTC().Format(time.RFC3339Nano), tc.why); c.GetMessage() != want {
				t.Errorf("%s: message %q, want %q", name, c.GetMessage(), want)
			}
			if f == workspace.FiringStarted {
				// Exactly as a caller's: a normal stop (not forced) or a
				// forced delete, the command in flight superseded.
				wantPower, wantForce := store.PowerStopped, false
				if tc.kind == delKind {
					wantPower, wantForce = store.PowerDeleted, true
				}
				if w.Power != wantPower || w.ForceStop != wantForce || w.CommandID != wantID {
					t.Errorf("%s: desired %v force=%v command %q, want %v force=%v %q", name, w.Power, w.ForceStop, w.CommandID, wantPower, wantForce, wantID)
				}
				if a.cmd != "" {
					old, err := s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: a.cmd})
					if err != nil || old.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED ||
						old.GetError().GetDetail().GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CONFLICT {
						t.Errorf("%s: the command in flight %v (%v), want it superseded", name, old, err)
					}
				}
			}
			// Firing again does nothing: the revision moved with the
			// first one.
			if f, cid, err := s.FireExpiration(ctx, a.id); err != nil || f != workspace.FiringNone || cid != "" {
				t.Errorf("%s: second FireExpiration = %v %q %v, want none", name, f, cid, err)
			}
		}
	})
}

// TestFireExpirationOnce: concurrent firings of one deadline (engines of
// several replicas share the store; here several Services) fire it once.
func TestFireExpirationOnce(t *testing.T) {
	t.Parallel()
	bothDialects(t, func(t *testing.T, st store.Store) {
		s, clk := expService(t, st)
		replicas := []*workspace.Service{s}
		for range 3 {
			r, _ := expService(t, st)
			r.Now, r.Engine.Now = clk.Now, clk.Now
			replicas = append(replicas, r)
		}
		const n = 5
		var ids []string
		for i := range n {
			id := create(t, s, fmt.Sprintf("fo-%d", i)).GetWorkspaceId()
			makeAvailable(t, st, id)
			if _, err := s.UpdateExpiration(t.Context(), expReq(fmt.Sprintf("fo-arm-%d", i), id, 1, spec(expStop, clk.Now().Add(time.Minute)))); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		clk.Advance(time.Minute)
		var (
			mu     sync.Mutex
			fired  = map[string]int{}
			failed []error
			wg     sync.WaitGroup
		)
		for _, r := range replicas {
			for range 2 {
				for _, id := range ids {
					wg.Add(1)
					go func() {
						defer wg.Done()
						f, _, err := r.FireExpiration(t.Context(), id)
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							failed = append(failed, err)
						}
						if f == workspace.FiringStarted {
							fired[id]++
						}
					}()
				}
			}
		}
		wg.Wait()
		if len(failed) > 0 {
			t.Fatalf("firings failed: %v", failed)
		}
		for _, id := range ids {
			if fired[id] != 1 {
				t.Errorf("%s fired %d times, want once", id, fired[id])
			}
		}
	})
}

// TestExpirationRaces: a caller's stop, start or delete and a firing are
// decided by the expiration revision, whichever commits first.
func TestExpirationRaces(t *testing.T) {
	t.Parallel()
	bothDialects(t, func(t *testing.T, st store.Store) {
		s, clk := expService(t, st)
		ctx := t.Context()
		arm := func(name string, p ctrlv1.ExpirationPolicy) string {
			id := create(t, s, "ra-"+name).GetWorkspaceId()
			makeAvailable(t, st, id)
			if _, err := s.UpdateExpiration(ctx, expReq("ra-arm-"+name, id, 1, spec(p, clk.Now().Add(time.Minute)))); err != nil {
				t.Fatal(err)
			}
			return id
		}
		timedOut := func(err error) bool { fe, ok := fault.As(err); return ok && fe.Reason == fault.ReasonTimedOut }
		callerStop := arm("caller-stop", expStop)
		firingFirst := arm("firing-first", expStop)
		firingDelete := arm("firing-delete", expDelete)
		updateFirst := arm("update-first", expDelete)
		// The caller's stop at revision 2 consumes the STOP policy (revision
		// 3) before the deadline passes.
		if _, err := s.Stop(ctx, &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "ra-stop"}, WorkspaceId: callerStop, ExpectedExpirationRevision: 2}); err != nil && !timedOut(err) {
			t.Fatal(err)
		}
		// The caller clears the expiration just as it falls due.
		clk.Advance(time.Minute)
		if _, err := s.UpdateExpiration(ctx, expReq("ra-clear", updateFirst, 2, nil)); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{callerStop, updateFirst} {
			if f, cid, err := s.FireExpiration(ctx, id); err != nil || f != workspace.FiringNone {
				t.Errorf("firing after the caller moved the revision = %v %q %v, want nothing", f, cid, err)
			}
		}
		// The firing commits first: the caller's stop, start and delete at
		// the revision they read fail.
		for _, id := range []string{firingFirst, firingDelete} {
			if f, _, err := s.FireExpiration(ctx, id); err != nil || f != workspace.FiringStarted {
				t.Fatalf("FireExpiration = %v, %v", f, err)
			}
		}
		_, err := s.Stop(ctx, &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "ra-late-stop"}, WorkspaceId: firingFirst, ExpectedExpirationRevision: 2})
		wantExpRefusal(t, "stop after the firing", err, fault.KindFailedPrecondition, fault.ReasonExpirationRevisionMismatch, "expected_expiration_revision", 3)
		_, err = s.Delete(ctx, &ctrlv1.DeleteWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "ra-late-delete"}, WorkspaceId: firingDelete, ExpectedExpirationRevision: 2})
		wantExpRefusal(t, "delete after the firing", err, fault.KindFailedPrecondition, fault.ReasonExpirationRevisionMismatch, "expected_expiration_revision", 3)
		stopped(t, st, firingFirst)
		_, err = s.Start(ctx, &ctrlv1.StartWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "ra-late-start"}, WorkspaceId: firingFirst, ExpectedExpirationRevision: 2})
		wantExpRefusal(t, "start after the firing", err, fault.KindFailedPrecondition, fault.ReasonExpirationRevisionMismatch, "expected_expiration_revision", 3)
		// A DELETE policy kept by a caller's stop still fires on the
		// stopped Workspace.
		kept := arm("kept", expDelete)
		clk.Advance(-time.Minute)
		if _, err := s.Stop(ctx, &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "ra-kept-stop"}, WorkspaceId: kept, ExpectedExpirationRevision: 2}); err != nil && !timedOut(err) {
			t.Fatal(err)
		}
		stopped(t, st, kept)
		clk.Advance(2 * time.Minute)
		if f, _, err := s.FireExpiration(ctx, kept); err != nil || f != workspace.FiringStarted {
			t.Errorf("DELETE policy after a stop: FireExpiration = %v, %v; want the delete started", f, err)
		}
	})
}
