package cli

import (
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
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

// TestWorkspaceLifecycleAgainstServer drives the workspace commands against
// a real ctrl with a node whose runtime runs nothing (agenttest).
func TestWorkspaceLifecycleAgainstServer(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{Runtime: agenttest.New()})
	c := conn(e)
	// The workspace capabilities are listed once the node registered.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(kibo(t, args(c, "server", "info")...).want(t, ExitOK).stdout, capability.WorkspaceCreate+"\n") {
		if time.Now().After(deadline) {
			t.Fatal("the server does not list workspace.create 10s after the node started")
		}
		time.Sleep(20 * time.Millisecond)
	}

	r := kibo(t, args(c, "workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "--label", "team=ml", "--wait", "-q")...).want(t, ExitOK)
	id := strings.TrimSpace(r.stdout)
	if !regexp.MustCompile(`^ws-[a-z0-9]{20}$`).MatchString(id) {
		t.Fatalf("workspace create -q printed %q", r.stdout)
	}
	// A flag whose capability the server does not list (its node serves no
	// Volumes) sends nothing.
	kibo(t, args(c, "workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "--volume", "vol-abcdefghijklmnopqrst", "--mount-path", "/data")...).want(t, ExitUnavailable)
	if r := kibo(t, args(c, "workspace", "list", "-o", "name", "--include-deleted")...).want(t, ExitOK); r.stdout != id+"\n" {
		t.Errorf("workspaces after the refused create: %q, want only %s", r.stdout, id)
	}

	r = kibo(t, args(c, "workspace", "labels", id, "tier=prod", "team-")...).want(t, ExitOK)
	if !regexp.MustCompile(`Labels:\s+tier=prod\n`).MatchString(r.stdout) || !regexp.MustCompile(`Labels revision:\s+2\n`).MatchString(r.stdout) {
		t.Errorf("workspace labels:\n%s", r.stdout)
	}
	if r := kibo(t, args(c, "workspace", "list", "-l", "tier=prod", "-o", "name")...).want(t, ExitOK); r.stdout != id+"\n" {
		t.Errorf("workspace list -l tier=prod printed %q", r.stdout)
	}
	kibo(t, args(c, "workspace", "annotations", id, "--expected-revision", "9", "a=b")...).want(t, 10)

	r = kibo(t, args(c, "workspace", "stop", id, "--expected-expiration-revision", "current")...).want(t, ExitOK)
	if !regexp.MustCompile(`State:\s+stopped\n`).MatchString(r.stdout) {
		t.Errorf("workspace stop:\n%s", r.stdout)
	}
	// Stopping again is refused, and explains itself from the detail's
	// observed_workspace.
	r = kibo(t, args(c, "workspace", "stop", id, "--expected-expiration-revision", "current")...).want(t, 9)
	if !strings.Contains(r.stderr, "error: failed_precondition STATE_CONFLICT") || !strings.Contains(r.stderr, "is already STOPPED; nothing to do") {
		t.Errorf("second stop: stderr:\n%s", r.stderr)
	}
	// The policy: NONE at revision 1 from the creation. A STOPPED Workspace
	// records a new one when the server serves policies (its node runs
	// Workspace networks); otherwise set sends nothing.
	r = kibo(t, args(c, "workspace", "network-policy", "get", id)...).want(t, ExitOK)
	if !regexp.MustCompile(`Mode:\s+none\n`).MatchString(r.stdout) || !regexp.MustCompile(`Revision:\s+1\n`).MatchString(r.stdout) {
		t.Errorf("workspace network-policy get:\n%s", r.stdout)
	}
	set := args(c, "workspace", "network-policy", "set", id, "--mode", "public-internet", "--deny", "198.51.100.0/24", "--expected-revision", "current")
	if strings.Contains(kibo(t, args(c, "server", "info")...).stdout, capability.WorkspaceNetworkPolicy+"\n") {
		r = kibo(t, set...).want(t, ExitOK)
		if !regexp.MustCompile(`Revision:\s+2\n`).MatchString(r.stdout) || !strings.Contains(r.stdout, "198.51.100.0/24") {
			t.Errorf("workspace network-policy set on a STOPPED workspace:\n%s", r.stdout)
		}
		kibo(t, args(set[:len(set)-1], "1")...).want(t, 10)
	} else {
		kibo(t, set...).want(t, ExitUnavailable)
	}
	r = kibo(t, args(c, "workspace", "start", id, "--expected-expiration-revision", "current", "--wait")...).want(t, ExitOK)
	if !regexp.MustCompile(`State:\s+available\n`).MatchString(r.stdout) {
		t.Errorf("workspace start --wait:\n%s", r.stdout)
	}
	r = kibo(t, args(c, "workspace", "delete", id, "--expected-expiration-revision", "current")...).want(t, ExitOK)
	if !regexp.MustCompile(`State:\s+deleted\n`).MatchString(r.stdout) || !strings.Contains(r.stdout, "Command:") {
		t.Errorf("workspace delete:\n%s", r.stdout)
	}
	kibo(t, args(c, "workspace", "delete", id, "--expected-expiration-revision", "current")...).want(t, 9)
}
