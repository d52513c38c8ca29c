package workspace

import (
	"testing"

	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// TestMethods pins the procedures the Service names itself to the generated
// ones: they are part of recorded fingerprints.
func TestMethods(t *testing.T) {
	for got, want := range map[string]string{
		createMethod:              ctrlv1connect.WorkspaceServiceCreateWorkspaceProcedure,
		startMethod:               ctrlv1connect.WorkspaceServiceStartWorkspaceProcedure,
		stopMethod:                ctrlv1connect.WorkspaceServiceStopWorkspaceProcedure,
		deleteMethod:              ctrlv1connect.WorkspaceServiceDeleteWorkspaceProcedure,
		revokeMethod:              ctrlv1connect.WorkspaceServiceRevokeWorkspaceDataPlaneProcedure,
		updateNetworkPolicyMethod: ctrlv1connect.WorkspaceServiceUpdateWorkspaceNetworkPolicyProcedure,
	} {
		if got != want {
			t.Errorf("method %q, want %q", got, want)
		}
	}
}
