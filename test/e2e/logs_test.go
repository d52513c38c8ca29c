package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// TestWorkspaceLogsThroughKibo: "kibo workspace logs" prints what the
// real guest (PID 1) wrote at its start; --tail bounds it; a follower
// (-f) of the stopped workspace prints the start-up line of the guest that the
// next start runs, and ends with 0 at SIGINT; the stopped workspace's log
// is still served.
func TestWorkspaceLogsThroughKibo(t *testing.T) {
	e := newDPEnv(t, "e2e-logs")
	out, errs, code, _ := kiboRun(t, e.kibo("workspace", "logs", e.id), 30*time.Second)
	if code != 0 || !strings.Contains(out, "guest agent ready") {
		t.Fatalf("kibo workspace logs: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	out, errs, code, _ = kiboRun(t, e.kibo("workspace", "logs", e.id, "--tail", "20"), 30*time.Second)
	if code != 0 || len(out) != 20 {
		t.Errorf("kibo workspace logs --tail 20: exit %d, %d bytes %q, stderr %q", code, len(out), out, errs)
	}

	// Stopped: the last log is still served, and a follower gets the line
	// of the next start's guest.
	w := e.get()
	if _, err := e.ws.StopWorkspace(t.Context(), connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Metadata: md("e2e-logs-stop"), WorkspaceId: e.id,
		ExpectedExpirationRevision: w.GetExpiration().GetRevision()})); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); e.get().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the workspace did not stop: %v", e.get())
		}
	}
	out, errs, code, _ = kiboRun(t, e.kibo("workspace", "logs", e.id), 30*time.Second)
	if code != 0 || strings.Count(out, "guest agent ready") != 1 {
		t.Errorf("the stopped workspace's log: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	follow := e.kibo("workspace", "logs", e.id, "-f", "--tail", "1")
	var fout, ferr syncBuffer
	follow.Stdout, follow.Stderr = &fout, &ferr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- follow.Wait() }()
	t.Cleanup(func() {
		if follow.ProcessState == nil {
			_ = follow.Process.Kill()
			<-done
		}
	})
	for deadline := time.Now().Add(20 * time.Second); len(fout.String()) < 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the follower printed nothing in 20s; stderr %q", ferr.String())
		}
	}
	if _, err := e.ws.StartWorkspace(t.Context(), connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("e2e-logs-start"), WorkspaceId: e.id,
		ExpectedExpirationRevision: e.get().GetExpiration().GetRevision()})); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(fout.String(), "guest agent ready"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the follower did not print the new guest's start-up line in 60s: %q; stderr %q", fout.String(), ferr.String())
		}
	}
	_ = follow.Process.Signal(syscall.SIGINT)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("kibo workspace logs -f after SIGINT: %v; stderr %q", err, ferr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("kibo workspace logs -f still runs 15s after SIGINT")
	}
	e.waitReady()
}
