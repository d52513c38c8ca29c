package api_test

import (
	"strings"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrltest"
)

// TestUpdateWorkspaceVolumeBindingWire: the refusals of
// UpdateWorkspaceVolumeBinding over each wire protocol carry their
// ErrorDetail: NEW is invalid_argument on volume_binding.mode (nothing
// recorded), a stale binding_revision is aborted with observed_workspace,
// a Volume bound elsewhere is failed_precondition with observed_volume;
// the same binding keeps binding_revision.
func TestUpdateWorkspaceVolumeBindingWire(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e, c, _ := volumeEnv(t, pg, 10<<30)
		v := createVolume(t, c, "vol", 32<<20)
		a := createBoundWS(t, c, "a", &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: v.GetVolumeId(), MountPath: "/v"})
		b := createBoundWS(t, c, "b", nil)
		stopped(t, c, "stop-b", b)
		for name, opts := range ctrltest.Protocols {
			t.Run(name, func(t *testing.T) {
				pc := e.Clients(e.HTTP, opts...)
				update := func(cid string, exp uint64, vb *ctrlv1.VolumeBinding) (*ctrlv1.Workspace, error) {
					r, err := pc.Workspace.UpdateWorkspaceVolumeBinding(t.Context(), connect.NewRequest(&ctrlv1.UpdateWorkspaceVolumeBindingRequest{
						Metadata: md(strings.ReplaceAll(name, "+", "-") + "-" + cid), WorkspaceId: b.GetWorkspaceId(), ExpectedRevision: exp, VolumeBinding: vb}))
					if err != nil {
						return nil, err
					}
					return r.Msg.GetWorkspace(), nil
				}
				_, err := update("new", 1, &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW, NewVolumeCapacityBytes: 32 << 20, MountPath: "/v"})
				if d := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false); d.GetField() != "volume_binding.mode" {
					t.Errorf("NEW: field %q", d.GetField())
				}
				_, err = update("stale", 7, &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE})
				if d := wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true); d.GetObservedWorkspace().GetBindingRevision() != 1 {
					t.Errorf("stale: observed %v", d.GetObservedWorkspace())
				}
				_, err = update("taken", 1, &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: v.GetVolumeId(), MountPath: "/v"})
				if d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT, true); d.GetObservedVolume().GetBoundWorkspaceId() != a.GetWorkspaceId() {
					t.Errorf("taken: observed %v", d.GetObservedVolume())
				}
				w, err := update("same", 1, &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE})
				if err != nil || w.GetBindingRevision() != 1 {
					t.Errorf("same binding = %v, %v", w, err)
				}
			})
		}
	})
}
