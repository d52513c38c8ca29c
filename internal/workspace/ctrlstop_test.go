package workspace_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// TestAdmitCtrlStop: a stop ctrl starts itself is StopWorkspace's
// admission without an expected expiration revision: AVAILABLE only (a
// refusal writes nothing), a STOP policy consumed, the bumped generation
// and the command in flight; FORCE supersedes it.
func TestAdmitCtrlStop(t *testing.T) {
	s, st := newService(t)
	ctx := context.Background()
	admit := func(id, ws string, force bool) (*ctrlv1.Workspace, *store.Command, error) {
		rec := &store.Command{ID: id, Method: "ctrl/test", ObjectKind: workspace.ObjectKind, ObjectID: ws,
			Kind:      int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP),
			Initiator: int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_HOST_MEMORY), CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
		var pub *ctrlv1.Workspace
		err := st.InTx(ctx, func(tx store.Tx) error {
			var err error
			if pub, err = s.AdmitCtrlStop(ctx, tx, rec, force); err != nil {
				return err
			}
			return tx.InsertCommand(ctx, rec)
		})
		return pub, rec, err
	}

	w := create(t, s, "c-1")
	// Still CREATING: refused, nothing written.
	_, _, err := admit("host-memory/n/1/"+w.GetWorkspaceId(), w.GetWorkspaceId(), false)
	if fe, ok := fault.As(err); !ok || fe.Kind != fault.KindFailedPrecondition || fe.Reason != fault.ReasonStateConflict || fe.ObservedWorkspace == nil {
		t.Fatalf("AdmitCtrlStop on CREATING = %v, want failed_precondition STATE_CONFLICT with observed_workspace", err)
	}
	if _, err := s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: "host-memory/n/1/" + w.GetWorkspaceId()}); err == nil {
		t.Error("a refused admission recorded its command")
	}

	// AVAILABLE with a STOP policy armed, revision 2: no expected revision
	// is needed, the policy is consumed.
	completeCommand(t, st, "c-1")
	makeAvailable(t, st, w.GetWorkspaceId())
	if err := st.InTx(ctx, func(tx store.Tx) error {
		row, err := tx.GetWorkspace(ctx, w.GetWorkspaceId())
		if err != nil {
			return err
		}
		pub, _ := workspace.Decode(row)
		pub.Expiration = &ctrlv1.Expiration{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP,
			Deadline: timestamppb.New(time.Now().Add(time.Hour)), Revision: 2}
		if err := workspace.Save(row, pub, time.Now().UTC()); err != nil {
			return err
		}
		return tx.UpdateWorkspace(ctx, row)
	}); err != nil {
		t.Fatal(err)
	}
	id := "host-memory/n/1/" + w.GetWorkspaceId()
	pub, rec, err := admit(id, w.GetWorkspaceId(), false)
	if err != nil {
		t.Fatalf("AdmitCtrlStop on AVAILABLE = %v", err)
	}
	if pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING || rec.Status != store.CommandProcessing ||
		pub.GetExpiration().GetPolicy() != ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED || pub.GetExpiration().GetRevision() != 3 {
		t.Errorf("after AdmitCtrlStop: state %v, command %v, expiration %v; want STOPPING, PROCESSING, the STOP policy consumed (revision 3)",
			pub.GetState(), rec.Status, pub.GetExpiration())
	}
	got, err := s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: id})
	if err != nil || got.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_HOST_MEMORY ||
		got.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP {
		t.Errorf("GetWorkspaceCommand(%s) = %v, %v; want a STOP by HOST_MEMORY", id, got, err)
	}
	var row *store.Workspace
	_ = st.View(ctx, func(tx store.Tx) error { row, err = tx.GetWorkspace(ctx, w.GetWorkspaceId()); return err })
	if row.Power != store.PowerStopped || row.ForceStop || row.CommandID != id || row.Generation != 2 {
		t.Errorf("row = power %v force %v command %q generation %d; want a normal stop of generation 2", row.Power, row.ForceStop, row.CommandID, row.Generation)
	}
	// A normal stop again is refused (STOPPING); FORCE supersedes it.
	if _, _, err := admit(id+"/again", w.GetWorkspaceId(), false); err == nil {
		t.Error("a second normal stop was admitted while STOPPING")
	}
	if _, _, err := admit(id+"/force", w.GetWorkspaceId(), true); err != nil {
		t.Fatalf("FORCE while STOPPING = %v", err)
	}
	old, err := s.GetCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: id})
	if err != nil || old.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED || old.GetError() == nil {
		t.Errorf("the normal stop after FORCE = %v, %v; want completed, superseded", old, err)
	}
}
