package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI runs as root: the workspace end-to-end tests must not skip")
	}
	t.Skip("needs root (namespaces, cgroups, loop devices): run as root or in CI")
}

func md(id string) *ctrlv1.CommandMetadata { return &ctrlv1.CommandMetadata{CommandId: id} }

// TestWorkspaceOnRealSandbox drives the real binaries in --dev mode: the
// embedded node runs real sandboxes (namespaces, cgroups, overlay over an
// ext4 layer on a loop device, kibotos-guest as PID 1).
func TestWorkspaceOnRealSandbox(t *testing.T) {
	requireRoot(t)
	dataDir := t.TempDir()
	p := startCtrl(t, dataDir, "--guest-binary", filepath.Join(binDir, "kibotos-guest"))
	hc := operatorClient(t, dataDir)
	ws := ctrlv1connect.NewWorkspaceServiceClient(hc, p.url)
	info := ctrlv1connect.NewServerInfoServiceClient(hc, p.url)
	ctx := t.Context()

	// The node registers, then the lifecycle is advertised.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := info.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if contains(res.Msg.GetCapabilities(), "workspace.create") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace.create never advertised; stderr:\n%s", p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}

	cr, err := ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md("e2e-ws-1"), Resources: &ctrlv1.Resources{MemoryMib: 128, CpuMillis: 500}, WritableLayerCapacityBytes: 64 << 20,
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := cr.Msg.GetWorkspace().GetWorkspaceId()
	waitCmd := func(cid string) *ctrlv1.WorkspaceCommand {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			r, err := ws.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: cid}))
			if err != nil {
				t.Fatal(err)
			}
			if r.Msg.GetCommand().GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
				if r.Msg.GetCommand().GetError() != nil {
					t.Fatalf("command %s failed: %v\nstderr:\n%s", cid, r.Msg.GetCommand().GetError(), p.stderr)
				}
				return r.Msg.GetCommand()
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("command %s did not complete; stderr:\n%s", cid, p.stderr)
		return nil
	}
	get := func() *ctrlv1.Workspace {
		r, err := ws.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetWorkspace()
	}
	waitCmd("e2e-ws-1")
	w := get()
	if w.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || w.GetGuestObservation().GetCondition() != ctrlv1.GuestCondition_GUEST_CONDITION_READY {
		t.Fatalf("after create: %v", w)
	}
	nodeRoot := filepath.Join(dataDir, "node")
	layer := filepath.Join(nodeRoot, "layers", id+".img")
	if fi, err := os.Stat(layer); err != nil || fi.Size() != 64<<20 {
		t.Fatalf("writable layer %s: %v (size %d), want exactly 64 MiB", layer, err, fi.Size())
	}

	stop := func(cid string, mode ctrlv1.StopMode) {
		t.Helper()
		r, err := ws.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Metadata: md(cid), WorkspaceId: id, ExpectedExpirationRevision: 1, Mode: mode}))
		if err != nil {
			t.Fatalf("stop %s: %v\nstderr:\n%s", cid, err, p.stderr)
		}
		if r.Msg.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
			t.Fatalf("stop %s: state %v", cid, r.Msg.GetWorkspace().GetState())
		}
	}
	start := func(cid string) {
		t.Helper()
		if _, err := ws.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md(cid), WorkspaceId: id, ExpectedExpirationRevision: 1})); err != nil {
			t.Fatal(err)
		}
		waitCmd(cid)
	}
	stop("e2e-stop-1", ctrlv1.StopMode_STOP_MODE_UNSPECIFIED)
	if _, err := os.Stat(layer); err != nil {
		t.Fatalf("the writable layer must survive a stop: %v", err)
	}
	start("e2e-start-1")
	stop("e2e-force-1", ctrlv1.StopMode_STOP_MODE_FORCE)
	start("e2e-start-2")

	if _, err := ws.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("e2e-del"), WorkspaceId: id, ExpectedExpirationRevision: 1})); err != nil {
		t.Fatal(err)
	}
	if w := get(); w.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		t.Fatalf("after delete: %v", w.GetState())
	}
	if _, err := os.Stat(layer); !os.IsNotExist(err) {
		t.Fatalf("the writable layer survived delete: %v", err)
	}
	leaks, err := sandbox.Leaks(nodeRoot)
	if err != nil {
		t.Fatal(err)
	}
	if len(leaks) > 0 {
		t.Fatalf("leftovers after delete: %v", leaks)
	}
	p.stop(t)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
