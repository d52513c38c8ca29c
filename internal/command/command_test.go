package command

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
)

func TestFingerprint(t *testing.T) {
	mk := func(id string, rev uint64, labels map[string]string) *ctrlv1.UpdateWorkspaceNetworkPolicyRequest {
		return &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: id}, WorkspaceId: "ws-1",
			NetworkPolicy: &ctrlv1.NetworkPolicy{Revision: rev, Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET},
		}
	}
	ignoreRev := func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { r.GetNetworkPolicy().Revision = 0 }
	fp := func(m string, r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest, n func(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest)) []byte {
		b, err := Fingerprint(m, r, n)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	base := fp("m", mk("a", 1, nil), ignoreRev)
	if !bytes.Equal(base, fp("m", mk("b", 1, nil), ignoreRev)) {
		t.Error("metadata changes the fingerprint")
	}
	if !bytes.Equal(base, fp("m", mk("a", 7, nil), ignoreRev)) {
		t.Error("network_policy.revision changes the fingerprint although it is ignored")
	}
	if bytes.Equal(base, fp("m", mk("a", 7, nil), nil)) {
		t.Error("without normalization the revision must count")
	}
	if bytes.Equal(base, fp("other", mk("a", 1, nil), ignoreRev)) {
		t.Error("the method does not change the fingerprint")
	}
	// The request itself is left alone.
	r := mk("a", 5, nil)
	fp("m", r, ignoreRev)
	if r.GetMetadata().GetCommandId() != "a" || r.GetNetworkPolicy().GetRevision() != 5 {
		t.Error("Fingerprint modified its input")
	}
	// Map order does not matter.
	a := &ctrlv1.CreateEgressRequest{Labels: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}}
	b := &ctrlv1.CreateEgressRequest{Labels: map[string]string{"d": "4", "c": "3", "b": "2", "a": "1"}}
	fa, _ := Fingerprint("m", a, nil)
	for range 20 {
		fb, _ := Fingerprint("m", b, nil)
		if !bytes.Equal(fa, fb) {
			t.Fatal("map order changes the fingerprint")
		}
	}
}

func TestSettles(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{fault.NotFound("egress", "x"), true},
		{fault.RevisionMismatch("expected_revision", 1, 2), true},
		{fault.Precondition(fault.ReasonConflict, "in use"), true},
		{fault.Invalid("f", "bad"), true},
		{fault.Unavailable(fault.ReasonUnavailable, "later"), false},
		{fault.Internal("boom"), false},
		{errors.New("plain"), false},
		{context.Canceled, false},
	}
	for _, tt := range tests {
		if got := Settles(tt.err); got != tt.want {
			t.Errorf("Settles(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestReplaySettledFailure: a settled failure comes back as a fault with
// Settled set and all its content, on the first answer and on every resend,
// without running the decision again.
func TestReplaySettledFailure(t *testing.T) {
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &Engine{Store: st}
	refusal := &fault.Error{Kind: fault.KindFailedPrecondition, Reason: fault.ReasonStateConflict, Field: "workspace_id",
		Message: "stop is not accepted", Stage: "admission",
		ObservedWorkspace: &ctrlv1.Workspace{WorkspaceId: "ws-1", State: ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED}}
	decided := 0
	spec := func(ws string) Spec[*ctrlv1.StopWorkspaceRequest, *ctrlv1.StopWorkspaceResponse] {
		return Spec[*ctrlv1.StopWorkspaceRequest, *ctrlv1.StopWorkspaceResponse]{
			Method: "/m", ObjectKind: "workspace", ObjectID: ws, CommandKind: 2,
			Request:     &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "c-1"}, WorkspaceId: ws},
			NewResponse: func() *ctrlv1.StopWorkspaceResponse { return &ctrlv1.StopWorkspaceResponse{} },
			Decide: func(context.Context, store.Tx, *store.Command) (*ctrlv1.StopWorkspaceResponse, error) {
				decided++
				return nil, refusal
			},
		}
	}
	want := *refusal
	want.Settled = true
	for i := range 2 {
		_, err := Execute(t.Context(), e, spec("ws-1"))
		fe, ok := fault.As(err)
		if !ok {
			t.Fatalf("Execute #%d = %v, want a fault", i, err)
		}
		if diff := cmp.Diff(&want, fe, protocmp.Transform()); diff != "" {
			t.Errorf("Execute #%d (-want +got):\n%s", i, diff)
		}
	}
	if decided != 1 {
		t.Errorf("Decide ran %d times, want once", decided)
	}
	if refusal.Settled {
		t.Error("Execute changed the decision's fault")
	}
	// The same ID with another request is not a replay.
	_, err = Execute(t.Context(), e, spec("ws-2"))
	if fe, ok := fault.As(err); !ok || fe.Reason != fault.ReasonCommandIDReused || fe.Settled {
		t.Errorf("Execute(other request) = %#v, want COMMAND_ID_REUSED, not settled", err)
	}
}

// downStore is a store that cannot serve: the PostgreSQL dialect's
// unavailable fault on every read.
type downStore struct{ store.Store }

var errDown = &fault.Error{Kind: fault.KindUnavailable, Reason: fault.ReasonUnavailable, Retryable: true, Stage: "store",
	Message: "the database cannot serve now"}

func (downStore) View(context.Context, func(store.Tx) error) error { return errDown }

// TestStoreFaultPassesThrough: a store that answers with a fault (the
// database is unreachable: unavailable, retryable) is answered with that
// fault, not turned into an internal error, from the first look-up of the ID.
func TestStoreFaultPassesThrough(t *testing.T) {
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &Engine{Store: downStore{st}}
	_, err = Execute(t.Context(), e, Spec[*ctrlv1.StopWorkspaceRequest, *ctrlv1.StopWorkspaceResponse]{
		Method: "/m", ObjectKind: "workspace", ObjectID: "ws-1", CommandKind: 2,
		Request:     &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "c-1"}, WorkspaceId: "ws-1"},
		NewResponse: func() *ctrlv1.StopWorkspaceResponse { return &ctrlv1.StopWorkspaceResponse{} },
		Decide: func(context.Context, store.Tx, *store.Command) (*ctrlv1.StopWorkspaceResponse, error) {
			t.Fatal("Decide ran against a store that cannot serve")
			return nil, nil
		},
	})
	if fe, ok := fault.As(err); !ok || fe.Kind != fault.KindUnavailable || !fe.Retryable {
		t.Fatalf("Execute = %v, want the store's unavailable retryable fault", err)
	}
}

// staleCheck is a store whose next View misses every command: the
// request's look-up ran before a concurrent request with its ID committed.
type staleCheck struct {
	store.Store
	stale atomic.Bool
}

type missingCommands struct{ store.Tx }

func (missingCommands) GetCommand(context.Context, string) (*store.Command, error) {
	return nil, store.ErrNotFound
}

func (s *staleCheck) View(ctx context.Context, fn func(store.Tx) error) error {
	if s.stale.CompareAndSwap(true, false) {
		return s.Store.View(ctx, func(tx store.Tx) error { return fn(missingCommands{tx}) })
	}
	return s.Store.View(ctx, fn)
}

// TestRecordedMeanwhile: a command whose ID another request recorded
// after its look-up — its transaction does not look the ID up again —
// is undone at its record's insert, and answers with the recorded result.
func TestRecordedMeanwhile(t *testing.T) {
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sc := &staleCheck{Store: st}
	e := &Engine{Store: sc}
	spec := func(state ctrlv1.WorkspaceState) Spec[*ctrlv1.StopWorkspaceRequest, *ctrlv1.StopWorkspaceResponse] {
		return Spec[*ctrlv1.StopWorkspaceRequest, *ctrlv1.StopWorkspaceResponse]{
			Method: "/m", ObjectKind: "workspace", ObjectID: "ws-1", CommandKind: 2,
			Request:     &ctrlv1.StopWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "c-1"}, WorkspaceId: "ws-1"},
			NewResponse: func() *ctrlv1.StopWorkspaceResponse { return &ctrlv1.StopWorkspaceResponse{} },
			Decide: func(ctx context.Context, tx store.Tx, _ *store.Command) (*ctrlv1.StopWorkspaceResponse, error) {
				// A write the replay must undo.
				if err := tx.InsertResource(ctx, &store.Resource{Kind: store.KindEgress, ID: state.String(), CreatedAt: time.Unix(1, 0), UpdatedAt: time.Unix(1, 0)}); err != nil {
					return nil, err
				}
				return &ctrlv1.StopWorkspaceResponse{Workspace: &ctrlv1.Workspace{WorkspaceId: "ws-1", State: state}}, nil
			},
		}
	}
	first, err := Execute(t.Context(), e, spec(ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED))
	if err != nil {
		t.Fatal(err)
	}
	sc.stale.Store(true)
	second, err := Execute(t.Context(), e, spec(ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING))
	if err != nil {
		t.Fatalf("Execute after a stale look-up = %v, want the recorded result", err)
	}
	if !proto.Equal(first, second) {
		t.Errorf("Execute after a stale look-up = %v, want the recorded %v", second, first)
	}
	if err := st.View(t.Context(), func(tx store.Tx) error {
		_, err := tx.GetResource(t.Context(), store.KindEgress, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING.String())
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the undone decision's write: %v, want not found", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
