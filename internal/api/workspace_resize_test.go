package api_test

import (
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// TestResizeWireGrows: a stopped Workspace whose layer exists is resized
// inside the request: the answer carries the completed command and the new
// capacity, and the Workspace stays STOPPED.
func TestResizeWireGrows(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		c, _ := configEnv(t, pg)
		w := availableWS(t, c, "rg-create")
		id := w.GetWorkspaceId()
		if _, err := stopWS(c, t, "rg-stop", w, false); err != nil {
			t.Fatal(err)
		}
		target := w.GetWritableLayer().GetCapacityBytes() * 2
		res, err := resize(t, c, "rg", id, target)
		if err != nil {
			t.Fatal(err)
		}
		cmd := res.GetCommand()
		if cmd.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED || cmd.GetError() != nil ||
			cmd.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_RESIZE_WRITABLE_LAYER ||
			res.GetWorkspace().GetWritableLayer().GetCapacityBytes() != target || res.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
			t.Fatalf("resize = %v", res)
		}
		if got := getWS(t, c, id); got.GetWritableLayer().GetCapacityBytes() != target || got.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
			t.Fatalf("after the resize: %v", got)
		}
	})
}

// TestResizeWireNodeFails: a node that cannot grow the layer completes the
// resize with its failure (failed_precondition, EXECUTION_FAILED, stage
// resize_writable_layer), answered inside the request and replayed for the
// same command ID; the Workspace stays STOPPED with the capacity its layer
// really has, and a later resize with a new ID succeeds.
func TestResizeWireNodeFails(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		c, rt := configEnv(t, pg)
		w := availableWS(t, c, "rf-create")
		id := w.GetWorkspaceId()
		if _, err := stopWS(c, t, "rf-stop", w, false); err != nil {
			t.Fatal(err)
		}
		capacity := w.GetWritableLayer().GetCapacityBytes()
		rt.FailResize[id] = errors.New("resize2fs: no space left on device")
		for range 2 {
			_, err := resize(t, c, "rf", id, 2*capacity)
			d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED, true)
			if d.GetStage() != "resize_writable_layer" || !strings.Contains(d.GetMessage(), "no space left") {
				t.Fatalf("failure detail = %v", d)
			}
		}
		got := getWS(t, c, id)
		if got.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || got.GetWritableLayer().GetCapacityBytes() != capacity ||
			got.GetFailure().GetStage() != "resize_writable_layer" {
			t.Fatalf("after the failed resize: %v", got)
		}
		delete(rt.FailResize, id)
		res, err := resize(t, c, "rf-2", id, 2*capacity)
		if err != nil || res.GetWorkspace().GetWritableLayer().GetCapacityBytes() != 2*capacity || rt.Resizes[id] != 1 {
			t.Fatalf("resize after the failure = %v, %v (%d resizes)", res, err, rt.Resizes[id])
		}
	})
}
