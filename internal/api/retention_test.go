package api_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/reconciler"
	"github.com/kibotos/kibotos/internal/retention"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/volume"
)

// TestRetention: once retention has passed, a deleted Workspace and a
// deleted Volume are not_found, their commands' records too, while a live
// Workspace stays; the pruned command ID, resent, executes again as a new
// command. SQLite and PostgreSQL.
func TestRetention(t *testing.T) {
	t.Parallel()
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			t.Parallel()
			e, c, _ := volumeEnv(t, pg, 8<<30)
			ctx := t.Context()
			doomed, _ := createWS(t, c, "ret-create")
			waitCommand(t, c, "ret-create")
			if _, err := c.Workspace.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("ret-delete"),
				WorkspaceId: doomed.GetWorkspaceId(), ExpectedExpirationRevision: 1})); err != nil {
				t.Fatal(err)
			}
			waitState(t, c, doomed.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
			live, _ := createWS(t, c, "ret-live")
			waitCommand(t, c, "ret-live")
			v := createVolume(t, c, "ret-volume", 64<<20)
			waitVolume(t, c, v.GetVolumeId(), ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE)
			if _, err := c.Volume.DeleteVolume(ctx, connect.NewRequest(&ctrlv1.DeleteVolumeRequest{Metadata: md("ret-volume-delete"), VolumeId: v.GetVolumeId()})); err != nil {
				t.Fatal(err)
			}
			waitVolume(t, c, v.GetVolumeId(), ctrlv1.VolumeState_VOLUME_STATE_DELETED)

			// Nothing is due yet.
			p := &retention.Pruner{Store: e.Store, KeepMethods: reconciler.RetainedMethods(), DeletedKinds: []store.ResourceKind{volume.KindDeleted}}
			if n, err := p.Pass(ctx); err != nil || n != (retention.Counts{}) {
				t.Fatalf("Pass now = %+v, %v; want nothing pruned", n, err)
			}
			// Eight days later, everything completed is.
			p.Now = func() time.Time { return time.Now().Add(8 * 24 * time.Hour) }
			if n, err := p.Pass(ctx); err != nil || n.Workspaces < 1 || n.Resources != 1 || n.Commands < 5 {
				t.Fatalf("Pass in 8 days = %+v, %v; want the deleted Workspaces, 1 Volume and the 5 commands at least", n, err)
			}
			_, err := c.Workspace.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: doomed.GetWorkspaceId()}))
			wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
			_, err = c.Volume.GetVolume(ctx, connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: v.GetVolumeId()}))
			wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
			_, err = c.Workspace.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: "ret-delete"}))
			wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
			if got := getWS(t, c, live.GetWorkspaceId()); got.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
				t.Errorf("live Workspace is %v after pruning", got.GetState())
			}
			// The pruned ID executes again: a new Workspace.
			again, _ := createWS(t, c, "ret-create")
			if again.GetWorkspaceId() == doomed.GetWorkspaceId() {
				t.Errorf("a resent pruned command ID replayed %s, want a new Workspace", again.GetWorkspaceId())
			}
		})
	}
}
