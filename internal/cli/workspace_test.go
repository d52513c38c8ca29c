package cli

import (
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
)

const (
	processing = ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING
	completed  = ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED
)

func TestWorkspaceCreateWait(t *testing.T) {
	t.Parallel()
	for _, tty := range []bool{false, true} {
		t.Run(map[bool]string{false: "not a terminal", true: "terminal"}[tty], func(t *testing.T) {
			f := newFake(t, capability.WorkspaceCreate)
			f.ws.script = []ctrlv1.WorkspaceCommandStatus{processing, processing, completed}
			e := testEnv(t)
			e.isTerminal = func(io.Writer) bool { return tty }
			r := kiboWith(t, e, "", args(f.conn(), "workspace", "create", "--memory-mib", "512", "--cpu-millis", "1000", "--command-id", "ws/create/1", "--wait")...).want(t, ExitOK)
			if n := f.ws.pollCount(); n != 3 {
				t.Errorf("GetWorkspaceCommand polled %d times, want 3", n)
			}
			if !regexp.MustCompile(`State:\s+available\n`).MatchString(r.stdout) || !strings.Contains(r.stdout, "Command:               ws/create/1 (completed)") {
				t.Errorf("stdout:\n%s", r.stdout)
			}
			if got := strings.Contains(r.stderr, "waiting for command ws/create/1"); got != tty {
				t.Errorf("progress on stderr = %v, want %v:\n%q", got, tty, r.stderr)
			}
		})
	}
}

func TestWorkspaceWaitFailure(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.WorkspaceCreate)
	f.ws.script = []ctrlv1.WorkspaceCommandStatus{processing, completed}
	f.ws.failure = &ctrlv1.CommandError{Code: "resource_exhausted", Detail: &ctrlv1.ErrorDetail{
		Reason: ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, CommandSettled: true, Message: "no node has room", Stage: "placement",
	}}
	r := kibo(t, args(f.conn(), "-o", "json", "workspace", "create", "--memory-mib", "512", "--cpu-millis", "1000", "--wait")...).want(t, 8)
	if !strings.Contains(r.stdout, `"status": "WORKSPACE_COMMAND_STATUS_COMPLETED"`) {
		t.Errorf("stdout:\n%s", r.stdout)
	}
	if !strings.Contains(r.stderr, "error: resource_exhausted CAPACITY_EXHAUSTED: no node has room (retryable: no, settled: yes)") {
		t.Errorf("stderr:\n%s", r.stderr)
	}

	// "workspace command" reads it again, without --wait.
	r = kibo(t, args(f.conn(), "workspace", "command", "any/id")...).want(t, ExitOK)
	if !regexp.MustCompile(`Error:\s+resource_exhausted CAPACITY_EXHAUSTED`).MatchString(r.stdout) {
		t.Errorf("stdout:\n%s", r.stdout)
	}
}

func TestWorkspaceWaitNeedsItsCapabilities(t *testing.T) {
	t.Parallel()
	// workspace.start without workspace.create: start works, --wait (which
	// reads with GetWorkspaceCommand) is refused before the start is sent.
	f := newFake(t, capability.WorkspaceStart)
	kibo(t, args(f.conn(), "workspace", "start", "ws-1", "--expected-expiration-revision", "1", "--wait")...).want(t, ExitUnavailable)
	if diff := cmp.Diff([]string{ctrlv1connect.ServerInfoServiceGetServerInfoProcedure}, f.requests()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestWorkspaceUsage(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.WorkspaceCreate)
	for _, a := range [][]string{
		{"workspace", "create", "--memory-mib", "512"},
		{"workspace", "create", "--memory-mib", "512", "--cpu-millis", "1", "--network-mode", "lan"},
		{"workspace", "create", "--memory-mib", "512", "--cpu-millis", "1", "--expiration", "stop"},
		{"workspace", "create", "--memory-mib", "512", "--cpu-millis", "1", "--expiration", "stop", "--expire-at", "tomorrow"},
		{"workspace", "create", "--memory-mib", "512", "--cpu-millis", "1", "--volume", "vol-1", "--new-volume-mib", "1"},
		{"workspace", "create", "--memory-mib", "512", "--cpu-millis", "1", "--mount-path", "/data"},
		{"workspace", "list", "--state", "running"},
		{"workspace", "list", "--state", "available", "--include-deleted"},
		{"workspace", "start", "ws-1"},
	} {
		kibo(t, args(f.conn(), a...)...).want(t, ExitUsage)
	}
	if got := f.requests(); len(got) != 0 {
		t.Errorf("usage errors sent %v", got)
	}
}
