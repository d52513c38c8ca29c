package reconciler

import (
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/store"
)

// TestDeriveStartFailureRetryable: a start failure is retryable unless the
// node reports that retrying the same desired state cannot succeed.
func TestDeriveStartFailureRetryable(t *testing.T) {
	for _, tc := range []struct {
		name      string
		permanent bool
		retryable bool
	}{
		{"transient", false, true},
		{"permanent", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &store.Workspace{ID: "ws-1", Power: store.PowerRunning, Generation: 1}
			pub := &ctrlv1.Workspace{WorkspaceId: "ws-1"}
			out := derive(w, pub, &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: 1,
				State: nodev1.ExecState_EXEC_STATE_FAILED, FailureReason: "EXECUTION_FAILED", FailureMessage: "no template", Permanent: tc.permanent})
			if !out.done || out.err == nil {
				t.Fatalf("outcome = %+v, want a failed, done command", out)
			}
			if out.err.Retryable != tc.retryable {
				t.Errorf("retryable = %v, want %v", out.err.Retryable, tc.retryable)
			}
			if pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED {
				t.Errorf("state = %v, want FAILED", pub.GetState())
			}
		})
	}
}
