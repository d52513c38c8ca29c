package api_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
)

// TestWorkspaceExpiration: UpdateWorkspaceExpiration over the wire (Connect
// and gRPC, SQLite and PostgreSQL) with its refusals and their
// ErrorDetail, and deadlines that fire through the running engine as
// `expiration/<workspace>/<revision>` commands the runtime double carries
// out: a STOP deadline stops an AVAILABLE Workspace, a DELETE deadline
// deletes a stopped one, an expiration given to CreateWorkspace and to
// StopWorkspace is served.
func TestWorkspaceExpiration(t *testing.T) {
	t.Parallel()
	for _, pg := range []bool{false, true} {
		for _, proto := range []string{"connect+proto", "grpc"} {
			t.Run(fmt.Sprintf("%s/%s", map[bool]string{false: "sqlite", true: "postgres"}[pg], proto), func(t *testing.T) {
				t.Parallel()
				e, _, _ := wsEnv(t, ctrltest.Options{Postgres: pg})
				c := e.Clients(e.HTTP, ctrltest.Protocols[proto]...)
				testWorkspaceExpiration(t, c)
			})
		}
	}
}

func testWorkspaceExpiration(t *testing.T, c ctrltest.Clients) {
	ctx := t.Context()
	waitNode(t, c)
	info, err := c.ServerInfo.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil || !slices.Contains(info.Msg.GetCapabilities(), capability.WorkspaceExpiration) {
		t.Fatalf("capabilities %v (%v), want %s with a node", info.Msg.GetCapabilities(), err, capability.WorkspaceExpiration)
	}
	w, _ := createWS(t, c, "xp-create")
	id := w.GetWorkspaceId()
	waitState(t, c, id, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	update := func(cid string, expected uint64, exp *ctrlv1.ExpirationSpec) (*ctrlv1.Workspace, error) {
		r, err := c.Workspace.UpdateWorkspaceExpiration(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceExpirationRequest{
			Metadata: md(cid), WorkspaceId: id, ExpectedRevision: expected, Expiration: exp}))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetWorkspace(), nil
	}
	stopAt := func(d time.Duration) *ctrlv1.ExpirationSpec {
		return &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP, Deadline: timestamppb.New(time.Now().Add(d))}
	}

	// Bad input: invalid_argument with the field, nothing changed.
	for name, tc := range map[string]struct {
		exp   *ctrlv1.ExpirationSpec
		field string
	}{
		"past":    {stopAt(-time.Second), "expiration.deadline"},
		"horizon": {stopAt(3651 * 24 * time.Hour), "expiration.deadline"},
		"unknown": {&ctrlv1.ExpirationSpec{Policy: 7, Deadline: timestamppb.New(time.Now().Add(time.Hour))}, "expiration.policy"},
	} {
		_, err := update("xp-bad-"+name, 1, tc.exp)
		if d := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false); d.GetField() != tc.field {
			t.Errorf("%s: field %q, want %q", name, d.GetField(), tc.field)
		}
	}
	// A stale revision: failed_precondition EXPIRATION_REVISION_MISMATCH
	// with the Workspace as observed, recorded.
	_, err = update("xp-stale", 7, stopAt(time.Hour))
	d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH, true)
	if d.GetObservedWorkspace().GetExpiration().GetRevision() != 1 || d.GetField() != "expected_revision" {
		t.Errorf("stale revision: detail %v, want the Workspace at expiration revision 1 and field expected_revision", d)
	}

	// A STOP deadline fires as ctrl's own stop.
	armed, err := update("xp-arm", 1, stopAt(1500*time.Millisecond))
	if err != nil || armed.GetExpiration().GetRevision() != 2 {
		t.Fatalf("UpdateWorkspaceExpiration = %v, %v; want revision 2", armed.GetExpiration(), err)
	}
	cmdID := fmt.Sprintf("expiration/%s/2", id)
	cmd := waitFired(t, c, cmdID)
	if cmd.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED || cmd.GetError() != nil ||
		cmd.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP || cmd.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_EXPIRATION {
		t.Fatalf("expiration command = %v, want a completed STOP by EXPIRATION", cmd)
	}
	if at := cmd.GetCreatedAt().AsTime(); at.Before(armed.GetExpiration().GetDeadline().AsTime()) {
		t.Errorf("fired at %v, before the deadline %v", at, armed.GetExpiration().GetDeadline().AsTime())
	}
	got := waitState(t, c, id, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if e := got.GetExpiration(); e.GetRevision() != 3 || e.GetPolicy() != 0 || e.GetDeadline() != nil {
		t.Errorf("expiration after firing = %v, want none at revision 3", e)
	}
	// The caller's stop that read revision 2 fails now.
	_, err = c.Workspace.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("xp-start-stale"), WorkspaceId: id, ExpectedExpirationRevision: 2}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH, true)

	// A DELETE deadline deletes the stopped Workspace.
	if _, err := update("xp-arm-delete", 3, &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE,
		Deadline: timestamppb.New(time.Now().Add(500 * time.Millisecond))}); err != nil {
		t.Fatal(err)
	}
	if cmd := waitFired(t, c, fmt.Sprintf("expiration/%s/4", id)); cmd.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_DELETE || cmd.GetError() != nil {
		t.Fatalf("DELETE expiration command = %v", cmd)
	}
	waitState(t, c, id, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
	// A DELETED Workspace refuses the change: failed_precondition
	// STATE_CONFLICT, told apart by observed_workspace.
	_, err = update("xp-deleted", 5, stopAt(time.Hour))
	if d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true); d.GetObservedWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		t.Errorf("observed_workspace %v, want it DELETED", d.GetObservedWorkspace())
	}

	// CreateWorkspace and StopWorkspace take an expiration.
	cr, err := c.Workspace.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Metadata: md("xp-create-exp"),
		Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500}, Expiration: stopAt(time.Hour)}))
	if err != nil || cr.Msg.GetWorkspace().GetExpiration().GetPolicy() != ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP {
		t.Fatalf("CreateWorkspace with an expiration = %v, %v", cr, err)
	}
	id2 := cr.Msg.GetWorkspace().GetWorkspaceId()
	waitState(t, c, id2, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	sr, err := c.Workspace.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Metadata: md("xp-stop-exp"), WorkspaceId: id2,
		ExpectedExpirationRevision: 1, Expiration: &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE,
			Deadline: timestamppb.New(time.Now().Add(600 * time.Millisecond))}}))
	if err != nil || sr.Msg.GetWorkspace().GetExpiration().GetRevision() != 2 {
		t.Fatalf("StopWorkspace with an expiration = %v, %v; want revision 2", sr, err)
	}
	if cmd := waitFired(t, c, fmt.Sprintf("expiration/%s/2", id2)); cmd.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_DELETE {
		t.Fatalf("the stop's DELETE expiration = %v", cmd)
	}
	waitState(t, c, id2, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
}

// waitFired waits until ctrl started the command id (not_found until then)
// and it completed.
func waitFired(t *testing.T, c ctrltest.Clients, id string) *ctrlv1.WorkspaceCommand {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r, err := c.Workspace.GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: id, WaitTimeout: durationpb.New(5 * time.Second)}))
		switch {
		case connect.CodeOf(err) == connect.CodeNotFound:
			time.Sleep(20 * time.Millisecond)
		case err != nil:
			t.Fatalf("GetWorkspaceCommand(%s) = %v", id, err)
		case r.Msg.GetCommand().GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED:
			return r.Msg.GetCommand()
		}
	}
	t.Fatalf("command %s did not complete", id)
	return nil
}
