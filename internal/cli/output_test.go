package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
)

// lines splits output into its lines.
func lines(s string) []string {
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// TestOutputName: -o name prints the IDs of the objects, one per line, for
// get, list and create of every kind; -q on create is the same.
func TestOutputName(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{Enrollment: true})
	c := conn(e)

	eg := kibo(t, args(c, "egress", "create", "--address", "127.0.0.1:1080", "-o", "name")...).want(t, ExitOK)
	if !regexp.MustCompile(`^eg-[a-z0-9]{20}\n$`).MatchString(eg.stdout) {
		t.Fatalf("egress create -o name printed %q", eg.stdout)
	}
	egID := strings.TrimSpace(eg.stdout)
	q := kibo(t, args(c, "egress", "create", "--address", "127.0.0.1:1081", "-q")...).want(t, ExitOK)
	if !regexp.MustCompile(`^eg-[a-z0-9]{20}\n$`).MatchString(q.stdout) {
		t.Errorf("egress create -q printed %q", q.stdout)
	}
	if !printedID.MatchString(q.stderr) {
		t.Errorf("egress create -q: no command-id line on stderr: %q", q.stderr)
	}
	rs := kibo(t, args(c, "resolver", "create", "--udp", "127.0.0.1:53", "-q")...).want(t, ExitOK)
	rsID := strings.TrimSpace(rs.stdout)
	if !strings.HasPrefix(rsID, "rs-") || strings.Contains(rsID, "\n") {
		t.Errorf("resolver create -q printed %q", rs.stdout)
	}

	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"egress", "get", egID, "-o", "name"}, []string{egID}},
		{[]string{"egress", "list", "-o", "name"}, []string{egID, strings.TrimSpace(q.stdout)}},
		{[]string{"egress", "list", "-o", "name", "--page-size", "1", "--all"}, []string{egID, strings.TrimSpace(q.stdout)}},
		{[]string{"egress", "labels", egID, "a=b", "-o", "name"}, []string{egID}},
		{[]string{"resolver", "get", rsID, "-o", "name"}, []string{rsID}},
		{[]string{"resolver", "list", "-o", "name"}, []string{rsID}},
		{[]string{"resolver", "delete", rsID, "-o", "name"}, []string{rsID}},
	} {
		r := kibo(t, args(c, tt.args...)...).want(t, ExitOK)
		if diff := cmp.Diff(tt.want, lines(r.stdout)); diff != "" {
			t.Errorf("kibo %s (-want +got):\n%s", strings.Join(tt.args, " "), diff)
		}
	}

	// Enrollments: the create's token would be lost, so -o name is refused
	// there before anything is sent; get and list print the ID.
	kibo(t, args(c, "enrollment", "create", "-o", "name")...).want(t, ExitUsage)
	en := kibo(t, args(c, "enrollment", "create", "-o", "json")...).want(t, ExitOK)
	enID := enrollmentID.FindString(en.stdout)
	r := kibo(t, args(c, "enrollment", "list", "-o", "name")...).want(t, ExitOK)
	if diff := cmp.Diff([]string{enID}, lines(r.stdout)); diff != "" {
		t.Errorf("enrollment list -o name (-want +got):\n%s", diff)
	}
	r = kibo(t, args(c, "enrollment", "get", enID, "-o", "name")...).want(t, ExitOK)
	if r.stdout != enID+"\n" {
		t.Errorf("enrollment get -o name printed %q", r.stdout)
	}

	// Commands that name no object, and -q with another format.
	for _, a := range [][]string{
		{"server", "info", "-o", "name"},
		{"version", "-o", "name"},
		{"profile", "show", "-o", "name"},
		{"egress", "create", "--address", "127.0.0.1:1080", "-q", "-o", "json"},
		{"egress", "list", "-o", "xml"},
	} {
		kibo(t, args(c, a...)...).want(t, ExitUsage)
	}
}

func TestWorkspaceOutputName(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.WorkspaceCreate, capability.WorkspaceStop)
	f.ws.script = []ctrlv1.WorkspaceCommandStatus{processing, completed}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "-q"}, fakeWorkspaceID + "\n"},
		{[]string{"workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "-q", "--wait"}, fakeWorkspaceID + "\n"},
		{[]string{"workspace", "get", fakeWorkspaceID, "-o", "name"}, fakeWorkspaceID + "\n"},
		{[]string{"workspace", "list", "-o", "name"}, fakeWorkspaceID + "\nws-bbbbbbbbbbbbbbbbbbbb\n"},
		{[]string{"workspace", "stop", fakeWorkspaceID, "--expected-expiration-revision", "1", "-o", "name"}, fakeWorkspaceID + "\n"},
		{[]string{"workspace", "command", "my/cmd", "-o", "name"}, "my/cmd\n"},
	} {
		r := kibo(t, args(f.conn(), tt.args...)...).want(t, ExitOK)
		if r.stdout != tt.want {
			t.Errorf("kibo %s printed %q, want %q", strings.Join(tt.args, " "), r.stdout, tt.want)
		}
	}
	// -q only exists on create.
	kibo(t, args(f.conn(), "workspace", "get", fakeWorkspaceID, "-q")...).want(t, ExitUsage)
}

// TestLabelSelector: -l and --label-selector become the API's exact-match
// map; what the API cannot express is a usage error, and nothing is sent.
func TestLabelSelector(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.WorkspaceCreate)
	tests := []struct {
		args []string
		want map[string]string // nil: usage error
	}{
		{[]string{"-l", "team=ml"}, map[string]string{"team": "ml"}},
		{[]string{"-l", "team=ml,tier=prod"}, map[string]string{"team": "ml", "tier": "prod"}},
		{[]string{"--label-selector", "team=ml", "-l", "tier==prod"}, map[string]string{"team": "ml", "tier": "prod"}},
		{[]string{"-l", "team = ml , tier=prod"}, map[string]string{"team": "ml", "tier": "prod"}},
		{[]string{"-l", "team=ml", "-l", "team=ml"}, map[string]string{"team": "ml"}},
		{[]string{"-l", "empty="}, map[string]string{"empty": ""}},
		{[]string{"-l", "kibotos.io/owner=me"}, map[string]string{"kibotos.io/owner": "me"}},
		{[]string{"-l", "team!=ml"}, nil},
		{[]string{"-l", "team in (ml,web)"}, nil},
		{[]string{"-l", "team notin (ml)"}, nil},
		{[]string{"-l", "team"}, nil},
		{[]string{"-l", "!team"}, nil},
		{[]string{"-l", "=ml"}, nil},
		{[]string{"-l", "team=ml,"}, nil},
		{[]string{"-l", "team=ml", "-l", "team=web"}, nil},
		{[]string{"-l", "team=ml,team=web"}, nil},
		{[]string{"-l", "a=b=c"}, nil},
	}
	for _, tt := range tests {
		before := len(f.ws.requests())
		sent := len(f.requests())
		r := kibo(t, args(f.conn(), append([]string{"workspace", "list"}, tt.args...)...)...)
		if tt.want == nil {
			r.want(t, ExitUsage)
			if len(f.requests()) != sent {
				t.Errorf("%q: a usage error sent a request", tt.args)
			}
			continue
		}
		r.want(t, ExitOK)
		got := f.ws.requests()
		if len(got) != before+1 {
			t.Fatalf("%q: ListWorkspaces received %d times, want 1", tt.args, len(got)-before)
		}
		if diff := cmp.Diff(tt.want, got[len(got)-1].(*ctrlv1.ListWorkspacesRequest).GetLabelSelector()); diff != "" {
			t.Errorf("%q: label_selector (-want +got):\n%s", tt.args, diff)
		}
	}
}

// TestLabelSelectorEveryList: every list with labels has -l, and a real
// server selects with it.
func TestLabelSelectorEveryList(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	c := conn(e)
	want := createEgress(t, e, "--label", "team=net", "--label", "tier=prod")
	createEgress(t, e, "--label", "team=net")
	r := kibo(t, args(c, "egress", "list", "-o", "name", "-l", "team=net,tier=prod")...).want(t, ExitOK)
	if r.stdout != want+"\n" {
		t.Errorf("egress list -l team=net,tier=prod printed %q, want %s", r.stdout, want)
	}
	r = kibo(t, args(c, "resolver", "list", "-o", "name", "-l", "team=net")...).want(t, ExitOK)
	if r.stdout != "" {
		t.Errorf("resolver list printed %q", r.stdout)
	}
	for _, c := range commands() {
		if c.Name() != "list" || c.Parent().Name() == "enrollment" {
			continue
		}
		if f := c.Flags().ShorthandLookup("l"); f == nil || f.Name != "label-selector" {
			t.Errorf("%s has no -l/--label-selector", c.CommandPath())
		}
	}
}
