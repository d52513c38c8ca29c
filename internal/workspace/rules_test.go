package workspace

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// TestAdmitTable pins every (state, holds execution, deletion began, op)
// combination against the seed's admissions and refusals.
func TestAdmitTable(t *testing.T) {
	const (
		CR = ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING
		SG = ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
		AV = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
		SP = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
		ST = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
		FA = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
		DG = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING
		DD = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
	)
	type row struct {
		s    Status
		want map[Op]bool // ops admitted; every other op is refused
	}
	all := func(ops ...Op) map[Op]bool {
		m := map[Op]bool{}
		for _, o := range ops {
			m[o] = true
		}
		return m
	}
	rows := []row{
		{Status{State: CR}, all(OpDelete, OpUpdateMaps, OpUpdateExpiration, OpRevokeDataPlane)},
		{Status{State: SG}, all(OpDelete, OpUpdateMaps, OpUpdateExpiration, OpRevokeDataPlane)},
		{Status{State: AV, HoldsExecution: true}, all(OpStop, OpForceStop, OpDelete, OpUpdateMaps, OpUpdateNetworkPolicy, OpUpdateExpiration, OpRevokeDataPlane)},
		// FORCE is admitted while a normal stop is in flight, which it supersedes...
		{Status{State: SP, HoldsExecution: true}, all(OpForceStop, OpDelete, OpUpdateMaps, OpUpdateExpiration, OpRevokeDataPlane)},
		// ...but not while a forced one is.
		{Status{State: SP, HoldsExecution: true, ForcePending: true}, all(OpDelete, OpUpdateMaps, OpUpdateExpiration, OpRevokeDataPlane)},
		{Status{State: ST}, all(OpStart, OpDelete, OpUpdateMaps, OpUpdateConfig, OpUpdateNetworkPolicy, OpUpdateExpiration, OpRevokeDataPlane)},
		// FAILED holding its execution: FORCE releases it, start is refused.
		{Status{State: FA, HoldsExecution: true}, all(OpForceStop, OpDelete, OpUpdateMaps, OpUpdateExpiration, OpRevokeDataPlane)},
		// FAILED without an execution: refuses FORCE and accepts start as it is.
		{Status{State: FA}, all(OpStart, OpDelete, OpUpdateMaps, OpUpdateConfig, OpUpdateExpiration, OpRevokeDataPlane)},
		// FAILED after its deletion began: DeleteWorkspace finishes it; FORCE is refused.
		{Status{State: FA, HoldsExecution: true, DeletionBegan: true}, all(OpDelete, OpUpdateMaps, OpUpdateExpiration, OpRevokeDataPlane)},
		{Status{State: FA, DeletionBegan: true}, all(OpDelete, OpUpdateMaps, OpUpdateExpiration, OpRevokeDataPlane)},
		{Status{State: DG, DeletionBegan: true}, all(OpUpdateMaps)},
		{Status{State: DD, DeletionBegan: true}, all()},
	}
	ops := []Op{OpStart, OpStop, OpForceStop, OpDelete, OpUpdateMaps, OpUpdateConfig, OpUpdateNetworkPolicy, OpUpdateExpiration, OpRevokeDataPlane}
	for _, r := range rows {
		for _, op := range ops {
			t.Run(fmt.Sprintf("%v/holds=%v/deleting=%v/force=%v/%v", r.s.State, r.s.HoldsExecution, r.s.DeletionBegan, r.s.ForcePending, op), func(t *testing.T) {
				err := Admit(op, r.s)
				if got := err == nil; got != r.want[op] {
					t.Fatalf("Admit(%v, %+v) = %v, want admitted=%v", op, r.s, err, r.want[op])
				}
				if err != nil {
					fe, _ := fault.As(err)
					if fe.Kind != fault.KindFailedPrecondition || fe.Reason != fault.ReasonStateConflict {
						t.Fatalf("refusal = %v %v, want failed_precondition STATE_CONFLICT", fe.Kind, fe.Reason)
					}
				}
			})
		}
	}
}

func TestExpirationAfterStop(t *testing.T) {
	dl := timestamppb.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	dl2 := timestamppb.New(time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))
	stopPol := &ctrlv1.Expiration{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP, Deadline: dl, Revision: 3}
	delPol := &ctrlv1.Expiration{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, Deadline: dl, Revision: 3}
	none := &ctrlv1.Expiration{Revision: 3}
	tests := []struct {
		name    string
		cur     *ctrlv1.Expiration
		stop    *ctrlv1.ExpirationSpec
		policy  ctrlv1.ExpirationPolicy
		rev     uint64
		changed bool
	}{
		{"STOP policy consumed", stopPol, nil, ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED, 4, true},
		{"DELETE policy kept", delPol, nil, ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, 3, false},
		{"none stays none", none, nil, ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED, 3, false},
		{"stop sets its own", stopPol, &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, Deadline: dl2}, ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, 4, true},
		{"stop clears", delPol, &ctrlv1.ExpirationSpec{}, ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED, 4, true},
		{"stop repeats the same", delPol, &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, Deadline: dl}, ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, 3, false},
	}
	for _, tt := range tests {
		got, changed := ExpirationAfterStop(tt.cur, tt.stop)
		if got.GetPolicy() != tt.policy || got.GetRevision() != tt.rev || changed != tt.changed {
			t.Errorf("%s: ExpirationAfterStop = %v (changed %v), want policy %v revision %d changed %v", tt.name, got, changed, tt.policy, tt.rev, tt.changed)
		}
	}
}

func TestCheckExpirationRevision(t *testing.T) {
	err := CheckExpirationRevision(2, &ctrlv1.Expiration{Revision: 1})
	fe, ok := fault.As(err)
	if !ok || fe.Kind != fault.KindFailedPrecondition || fe.Reason != fault.ReasonExpirationRevisionMismatch {
		t.Fatalf("mismatch = %v", err)
	}
	if err := CheckExpirationRevision(1, &ctrlv1.Expiration{Revision: 1}); err != nil {
		t.Fatal(err)
	}
}

func TestUnderlying(t *testing.T) {
	tests := []struct {
		w    store.Workspace
		want ctrlv1.WorkspaceState
	}{
		{store.Workspace{Power: store.PowerRunning, Generation: 2, ObservedGeneration: 2, ObservedState: store.ExecRunning}, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE},
		// A policy update in flight on a running execution.
		{store.Workspace{Power: store.PowerRunning, Generation: 3, ObservedGeneration: 2, ObservedState: store.ExecRunning}, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE},
		{store.Workspace{Power: store.PowerRunning, Generation: 3, ObservedGeneration: 2, ObservedState: store.ExecStopped}, ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING},
		{store.Workspace{Power: store.PowerRunning, Generation: 1}, ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING},
		{store.Workspace{Power: store.PowerRunning, Generation: 3, ObservedGeneration: 2}, ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING},
		{store.Workspace{Power: store.PowerStopped, Generation: 2, ObservedGeneration: 2, ObservedState: store.ExecStopped}, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED},
		{store.Workspace{Power: store.PowerStopped, Generation: 2, ObservedGeneration: 1}, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING},
		{store.Workspace{Power: store.PowerStopped, Generation: 2, ObservedGeneration: 2, ObservedState: store.ExecFailed}, ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED},
		{store.Workspace{Power: store.PowerDeleted, Generation: 2, ObservedGeneration: 1}, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING},
	}
	for _, tt := range tests {
		if got := Underlying(&tt.w); got != tt.want {
			t.Errorf("Underlying(%+v) = %v, want %v", tt.w, got, tt.want)
		}
	}
}
