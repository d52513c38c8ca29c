package cli

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
)

var (
	infoPath   = ctrlv1connect.ServerInfoServiceGetServerInfoProcedure
	createPath = ctrlv1connect.EgressServiceCreateEgressProcedure
)

func TestCommandIDRejectedBeforeSending(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"", "has space", "-leading-dash", "a:b", strings.Repeat("x", 129), "expiration/ws-1/1", "host-memory/n1", "guest-shutdown/ws-1"} {
		t.Run(id, func(t *testing.T) {
			f := newFake(t, capability.EgressManage)
			r := kibo(t, args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080", "--command-id", id)...).want(t, ExitUsage)
			if !strings.Contains(r.stderr, "error: --command-id:") {
				t.Errorf("stderr %q does not explain the --command-id", r.stderr)
			}
			if printedID.MatchString(r.stderr) {
				t.Errorf("stderr %q announces an ID that is not sent", r.stderr)
			}
			if got := f.requests(); len(got) != 0 {
				t.Errorf("the server received %v, want nothing", got)
			}
		})
	}
}

var printedID = regexp.MustCompile(`(?m)^command-id: (\S+)$`)

func TestCommandIDPrintedAndSent(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.EgressManage)
	r := kibo(t, args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080")...).want(t, ExitOK)
	m := printedID.FindStringSubmatch(r.stderr)
	if m == nil {
		t.Fatalf("stderr %q has no command-id line", r.stderr)
	}
	if err := kibotos.ValidateCommandID(m[1]); err != nil {
		t.Errorf("generated command ID %q: %v", m[1], err)
	}
	if diff := cmp.Diff([]string{m[1]}, f.commandIDs()); diff != "" {
		t.Errorf("command IDs sent (-printed +sent):\n%s", diff)
	}

	kibo(t, args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080", "--command-id", "mine/1")...).want(t, ExitOK)
	if got := f.commandIDs(); got[len(got)-1] != "mine/1" {
		t.Errorf("sent command ID %q, want mine/1", got[len(got)-1])
	}
}

func TestMissingCapabilitySendsNothing(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.ResolverManage, "egress.manage.v2", "EGRESS.MANAGE")
	r := kibo(t, args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080")...).want(t, ExitUnavailable)
	if !strings.Contains(r.stderr, `capability "egress.manage"`) {
		t.Errorf("stderr %q does not name the capability", r.stderr)
	}
	if diff := cmp.Diff([]string{infoPath}, f.requests()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	if len(f.commandIDs()) != 0 {
		t.Errorf("CreateEgress reached the server")
	}
	// A read needs the capability too.
	kibo(t, args(f.conn(), "egress", "list")...).want(t, ExitUnavailable)
	// Only the commands that need the missing capability fail.
	kibo(t, args(f.conn(), "server", "info")...).want(t, ExitOK)
}

func TestRetryResendsTheSameCommandID(t *testing.T) {
	t.Parallel()
	for _, given := range []string{"", "retry/me/1"} {
		t.Run("command-id="+given, func(t *testing.T) {
			f := newFake(t, capability.EgressManage)
			f.failures = []error{
				connect.NewError(connect.CodeUnavailable, errors.New("connection reset")), // no detail: result unknown
				detailed(connect.CodeUnavailable, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE, Retryable: true, Message: "store unavailable"}),
			}
			a := args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080", "--retry")
			if given != "" {
				a = append(a, "--command-id", given)
			}
			r := kibo(t, a...).want(t, ExitOK)
			ids := f.commandIDs()
			if len(ids) != 3 {
				t.Fatalf("CreateEgress received %d times, want 3; stderr:\n%s", len(ids), r.stderr)
			}
			m := printedID.FindAllStringSubmatch(r.stderr, -1)
			if len(m) != 1 {
				t.Fatalf("stderr prints %d command IDs, want 1:\n%s", len(m), r.stderr)
			}
			want := m[0][1]
			if given != "" && want != given {
				t.Errorf("printed command ID %q, want %q", want, given)
			}
			for i, id := range ids {
				if id != want {
					t.Errorf("attempt %d carried command ID %q, want %q", i+1, id, want)
				}
			}
			if n := strings.Count(r.stderr, "resending in"); n != 2 {
				t.Errorf("stderr reports %d resends, want 2:\n%s", n, r.stderr)
			}
		})
	}
}

func TestRetryStopsOnSettledFailure(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.EgressManage)
	f.failures = []error{detailed(connect.CodeFailedPrecondition, &ctrlv1.ErrorDetail{
		Reason: ctrlv1.FailureReason_FAILURE_REASON_CONFLICT, Retryable: true, CommandSettled: true, Message: "settled",
	})}
	r := kibo(t, args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080", "--retry")...).want(t, 9)
	if n := len(f.commandIDs()); n != 1 {
		t.Errorf("CreateEgress received %d times, want 1", n)
	}
	if !strings.Contains(r.stderr, "error: failed_precondition CONFLICT: settled (retryable: yes, settled: yes)") {
		t.Errorf("stderr:\n%s", r.stderr)
	}
}

func TestRetryBounds(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.EgressManage)
	for range 5 {
		f.failures = append(f.failures, connect.NewError(connect.CodeUnavailable, errors.New("down")))
	}
	kibo(t, args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080", "--retry", "--retry-max", "2")...).want(t, ExitUnavailable)
	if n := len(f.commandIDs()); n != 2 {
		t.Errorf("CreateEgress received %d times, want 2", n)
	}
	kibo(t, args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080", "--retry", "--retry-max", "0")...).want(t, ExitUsage)
}

func TestNoRetryWithoutTheFlag(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.EgressManage)
	f.failures = []error{connect.NewError(connect.CodeUnavailable, errors.New("down"))}
	kibo(t, args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080")...).want(t, ExitUnavailable)
	if n := len(f.commandIDs()); n != 1 {
		t.Errorf("CreateEgress received %d times, want 1", n)
	}
}

func TestPasswordInput(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.EgressManage)
	// The password never appears in the output: the fake echoes the spec
	// back, but kibo prints no password field in tables.
	r := kiboWith(t, testEnv(t), "s3cret\n", args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080", "--username", "u", "--password-stdin")...).want(t, ExitOK)
	if strings.Contains(r.stdout, "s3cret") {
		t.Errorf("stdout shows the password:\n%s", r.stdout)
	}
	kiboWith(t, testEnv(t), "", args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080", "--password-stdin")...).want(t, ExitUsage)
	kibo(t, args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080", "--password-file", t.TempDir()+"/nope")...).want(t, ExitLocal)
	kibo(t, args(f.conn(), "egress", "create", "--address", "127.0.0.1:1080", "--password-file", "x", "--password-stdin")...).want(t, ExitUsage)
}
