package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
)

var updatePolicyPath = ctrlv1connect.WorkspaceServiceUpdateWorkspaceNetworkPolicyProcedure

func dest(cidr string, lo, hi uint32) *ctrlv1.Destination {
	return &ctrlv1.Destination{Cidr: cidr, PortMin: lo, PortMax: hi}
}

func TestParseDestination(t *testing.T) {
	t.Parallel()
	ok := []struct {
		in   string
		want *ctrlv1.Destination
	}{
		{"203.0.113.0/24", dest("203.0.113.0/24", 0, 0)},
		{" 10.0.0.0/8 ", dest("10.0.0.0/8", 0, 0)},
		{"0.0.0.0/0", dest("0.0.0.0/0", 0, 0)},
		{"192.0.2.10/32:443", dest("192.0.2.10/32", 443, 443)},
		{"192.0.2.0/24:8000-8099", dest("192.0.2.0/24", 8000, 8099)},
		{"192.0.2.0/24:1-65535", dest("192.0.2.0/24", 1, 65535)},
		{"192.0.2.0/24:80-80", dest("192.0.2.0/24", 80, 80)},
		{"::/0", dest("::/0", 0, 0)},
		{"2001:DB8::/32", dest("2001:db8::/32", 0, 0)},
		{"2001:db8::/32:443", dest("2001:db8::/32", 443, 443)},
		{"[2001:db8::/32]:443-444", dest("2001:db8::/32", 443, 444)},
		{"[2001:db8::1/128]", dest("2001:db8::1/128", 0, 0)},
	}
	for _, tt := range ok {
		got, err := parseDestination(tt.in)
		if err != nil {
			t.Errorf("parseDestination(%q): %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
			t.Errorf("parseDestination(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
	bad := []struct{ in, want string }{
		{"", "want CIDR[:PORT[-PORT]] such as 203.0.113.0/24:443; one address is ADDR/32 (IPv4) or ADDR/128 (IPv6)"},
		{"203.0.113.7", "want CIDR[:PORT[-PORT]]"},
		{"203.0.113.7:80", "want CIDR[:PORT[-PORT]]"},
		{"10.0.0.1/8", "CIDR 10.0.0.1/8 has host bits set: the prefix is 10.0.0.0/8"},
		{"2001:db8::1/32", "CIDR 2001:db8::1/32 has host bits set: the prefix is 2001:db8::/32"},
		{"10.0.0.0/33", `CIDR "10.0.0.0/33": prefix length out of range`},
		{"300.0.0.0/8", `CIDR "300.0.0.0/8": `},
		{"example.com/24", `CIDR "example.com/24": `},
		{"fe80::/10%eth0", `CIDR "fe80::/10%eth0": `},
		{"::ffff:203.0.113.0/120", "CIDR ::ffff:203.0.113.0/120 is an IPv4-mapped IPv6 prefix, which never matches (IPv4 destinations are matched by IPv4 prefixes): write 203.0.113.0/24"},
		{"[::ffff:0:0/96]:443", "is an IPv4-mapped IPv6 prefix, which never matches (IPv4 destinations are matched by IPv4 prefixes): write 0.0.0.0/0"},
		{"10.0.0.0/8:", "no port after ':': want PORT or PORT-PORT, or no ':' for every port"},
		{"10.0.0.0/8:0", "port 0: leave the port out to cover every port"},
		{"10.0.0.0/8:0-0", "port 0: leave the port out to cover every port"},
		{"10.0.0.0/8:65536", "port 65536: want a number from 1 to 65535"},
		{"10.0.0.0/8:1-70000", "port 70000: want a number from 1 to 65535"},
		{"10.0.0.0/8:80-70", "port range 80-70: the first port is greater than the last"},
		{"10.0.0.0/8:http", `port "http": want a number from 1 to 65535`},
		{"10.0.0.0/8:80-", `port "": want a number from 1 to 65535`},
		{"10.0.0.0/8:-80", `port "": want a number from 1 to 65535`},
		{"10.0.0.0/8:+80", `port "+80": want a number from 1 to 65535`},
		{"10.0.0.0/8:80:90", `port "80:90": want a number from 1 to 65535`},
		{"[2001:db8::/32", "'[' without ']'"},
		{"[2001:db8::/32]443", `"443" after ']': want :PORT or :PORT-PORT`},
	}
	for _, tt := range bad {
		_, err := parseDestination(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseDestination(%q) = %v, want an error containing %q", tt.in, err, tt.want)
		}
	}
}

func TestParseEgressRoute(t *testing.T) {
	t.Parallel()
	got, err := parseEgressRoute("eg-1=203.0.113.0/24, 192.0.2.10/32:8000-8099,2001:db8::/32:443")
	if err != nil {
		t.Fatal(err)
	}
	want := &ctrlv1.EgressRoute{EgressId: "eg-1", Destinations: []*ctrlv1.Destination{
		dest("203.0.113.0/24", 0, 0), dest("192.0.2.10/32", 8000, 8099), dest("2001:db8::/32", 443, 443),
	}}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("parseEgressRoute (-want +got):\n%s", diff)
	}
	for _, tt := range []struct{ in, want string }{
		{"eg-1", "want EGRESS_ID=CIDR[:PORT[-PORT]],... (the destinations this Egress carries)"},
		{"=10.0.0.0/8", "no Egress ID before '='"},
		{"eg-1=", `no destinations after "eg-1=": want eg-1=CIDR[:PORT[-PORT]],... (every address: 0.0.0.0/0,::/0)`},
		{"eg-1=10.0.0.0/8,", "an empty destination between commas"},
		{"eg-1=10.0.0.0/8,,10.1.0.0/16", "an empty destination between commas"},
		{"eg-1=10.0.0.1/8", `destination "10.0.0.1/8": CIDR 10.0.0.1/8 has host bits set`},
		{"eg-1=10.0.0.0/8:99999", `destination "10.0.0.0/8:99999": port 99999`},
	} {
		_, err := parseEgressRoute(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseEgressRoute(%q) = %v, want an error containing %q", tt.in, err, tt.want)
		}
	}
}

func TestFormatDestination(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"203.0.113.0/24", "192.0.2.10/32:443", "192.0.2.0/24:8000-8099", "::/0", "[2001:db8::/32]:443", "[2001:db8::/32]:1-1024"} {
		d, err := parseDestination(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := formatDestination(d); got != in {
			t.Errorf("formatDestination(parseDestination(%q)) = %q", in, got)
		}
	}
}

// TestNetworkPolicySetUsage: every malformed command line exits 2 with a
// message naming the flag and what is wrong, and nothing is sent, not even
// GetServerInfo.
func TestNetworkPolicySetUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good.json", `{"mode": "NETWORK_MODE_NONE"}`)
	set := []string{"workspace", "network-policy", "set", fakeWorkspaceID}
	tests := []struct {
		args []string
		want string
	}{
		{nil, "error: give the complete new policy: --mode none|public-internet (with --allow, --deny, --egress, --resolver, --dns-via-egress as needed) or --file FILE"},
		{[]string{"--allow", "10.0.0.0/8"}, "error: --mode none|public-internet is required: the flags give the complete new policy"},
		{[]string{"--mode", "lan"}, `error: --mode "lan": want one of none, public-internet`},
		{[]string{"--mode", "none", "--file", good}, "error: --file holds the complete policy: it does not combine with --mode"},
		{[]string{"--file", good, "--egress", "eg-1=0.0.0.0/0", "--resolver", "rs-1"}, "it does not combine with --egress, --resolver"},
		{[]string{"--mode", "public-internet", "--allow", "10.0.0.1/8"}, `error: --allow "10.0.0.1/8": CIDR 10.0.0.1/8 has host bits set: the prefix is 10.0.0.0/8`},
		{[]string{"--mode", "public-internet", "--allow", "10.0.0.0/8", "--allow", "1.2.3.4"}, `error: --allow "1.2.3.4": want CIDR[:PORT[-PORT]]`},
		{[]string{"--mode", "public-internet", "--deny", "10.0.0.0/8:80-70"}, `error: --deny "10.0.0.0/8:80-70": port range 80-70: the first port is greater than the last`},
		{[]string{"--mode", "public-internet", "--deny", "10.0.0.0/8:0"}, `error: --deny "10.0.0.0/8:0": port 0: leave the port out to cover every port`},
		{[]string{"--mode", "public-internet", "--egress", "eg-1"}, `error: --egress "eg-1": want EGRESS_ID=CIDR[:PORT[-PORT]],...`},
		{[]string{"--mode", "public-internet", "--egress", "eg-1=10.0.0.0/8:70000"}, `error: --egress "eg-1=10.0.0.0/8:70000": destination "10.0.0.0/8:70000": port 70000: want a number from 1 to 65535`},
		{[]string{"--mode", "public-internet", "--dns-via-egress", "eg-1"}, "error: --dns-via-egress needs --resolver"},
		{[]string{"--mode", "none", "--expected-revision", "latest"}, `"latest": want a revision number or current`},
		{[]string{"--mode", "none", "--drain-seconds", "-1"}, `invalid argument "-1" for "--drain-seconds"`},
		{[]string{"--file", file("empty.yaml", " \n")}, "empty: want a NetworkPolicy as JSON or YAML"},
		{[]string{"--file", file("unknown.json", `{"mode": "NETWORK_MODE_NONE", "allowed": []}`)}, `unknown field "allowed"`},
		{[]string{"--file", file("unknown.yaml", "mode: NETWORK_MODE_NONE\nalowe: []\n")}, `unknown field "alowe"`},
		{[]string{"--file", file("enum.yaml", "mode: public-internet\n")}, `invalid value for enum field mode: "public-internet"`},
		{[]string{"--file", file("list.yaml", "- mode: NETWORK_MODE_NONE\n")}, "want a mapping with the NetworkPolicy's fields"},
		{[]string{"--file", file("bad.yaml", "mode: [unclosed\n")}, "not YAML:"},
		{[]string{"--file", file("bad.json", `{"mode": `)}, "not JSON:"},
		{[]string{"--file", file("port.json", `{"allow": [{"cidr": "10.0.0.0/8", "portMin": -1}]}`)}, "invalid value for uint32 field portMin"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			f := newFake(t, capability.WorkspaceCreate, capability.WorkspaceNetworkPolicy)
			r := kibo(t, args(f.conn(), args(set, tt.args...)...)...).want(t, ExitUsage)
			if !strings.Contains(r.stderr, tt.want) {
				t.Errorf("stderr lacks %q:\n%s", tt.want, r.stderr)
			}
			if got := f.requests(); len(got) != 0 {
				t.Errorf("the server received %v, want nothing", got)
			}
		})
	}
	f := newFake(t, capability.WorkspaceNetworkPolicy)
	kibo(t, args(f.conn(), "workspace", "network-policy", "set", "--mode", "none")...).want(t, ExitUsage)
	kibo(t, args(f.conn(), "workspace", "network-policy", "get")...).want(t, ExitUsage)
	kibo(t, args(f.conn(), "workspace", "network-policy", "set", fakeWorkspaceID, "--file", filepath.Join(dir, "missing.yaml"))...).want(t, ExitLocal)
	if got := f.requests(); len(got) != 0 {
		t.Errorf("the server received %v, want nothing", got)
	}
}

// TestNetworkPolicySet: the flags build the request, in order; the
// expected revision is the number given, the one read once with current,
// or 0 (no check) without the flag; drain_seconds is sent only when given.
func TestNetworkPolicySet(t *testing.T) {
	t.Parallel()
	u32 := func(n uint32) *uint32 { return &n }
	full := &ctrlv1.NetworkPolicy{
		Mode:  ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET,
		Allow: []*ctrlv1.Destination{dest("0.0.0.0/0", 443, 443), dest("::/0", 0, 0)},
		Deny:  []*ctrlv1.Destination{dest("198.51.100.0/24", 0, 0)},
		Egresses: []*ctrlv1.EgressRoute{
			{EgressId: "eg-b", Destinations: []*ctrlv1.Destination{dest("203.0.113.0/24", 0, 0)}},
			{EgressId: "eg-a", Destinations: []*ctrlv1.Destination{dest("0.0.0.0/0", 0, 0), dest("2001:db8::/32", 1, 1024)}},
		},
		Dns: &ctrlv1.DnsConfig{ResolverId: "rs-1", ViaEgressId: "eg-a"},
	}
	none := &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}
	tests := []struct {
		name string
		args []string
		gets int // GetWorkspace calls
		want *ctrlv1.UpdateWorkspaceNetworkPolicyRequest
	}{
		{
			name: "every flag, no check, server's drain",
			args: []string{"--mode", "public-internet", "--allow", "0.0.0.0/0:443", "--allow", "::/0", "--deny", "198.51.100.0/24",
				"--egress", "eg-b=203.0.113.0/24", "--egress", "eg-a=0.0.0.0/0,2001:db8::/32:1-1024", "--resolver", "rs-1", "--dns-via-egress", "eg-a"},
			want: &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{WorkspaceId: fakeWorkspaceID, NetworkPolicy: full},
		},
		{
			name: "revision given, drain 0",
			args: []string{"--mode", "none", "--expected-revision", "4", "--drain-seconds", "0"},
			want: &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 4, NetworkPolicy: none, DrainSeconds: u32(0)},
		},
		{
			name: "current revision read once",
			args: []string{"--mode", "none", "--expected-revision", "current", "--drain-seconds", "30"},
			gets: 1,
			want: &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 7, NetworkPolicy: none, DrainSeconds: u32(30)},
		},
		{
			name: "resolver without egress",
			args: []string{"--mode", "public-internet", "--resolver", "rs-1", "--drain-seconds", "3600"},
			want: &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{WorkspaceId: fakeWorkspaceID, DrainSeconds: u32(3600), NetworkPolicy: &ctrlv1.NetworkPolicy{
				Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET, Dns: &ctrlv1.DnsConfig{ResolverId: "rs-1"},
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, capability.WorkspaceCreate, capability.WorkspaceNetworkPolicy)
			f.ws.current = &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID, NetworkPolicy: &ctrlv1.NetworkPolicy{Revision: 7}}
			r := kibo(t, args(f.conn(), args([]string{"workspace", "network-policy", "set", fakeWorkspaceID, "--command-id", "np/1"}, tt.args...)...)...).want(t, ExitOK)
			got := f.ws.requests()
			if len(got) != 1 {
				t.Fatalf("requests %v, want one UpdateWorkspaceNetworkPolicy", got)
			}
			req := got[0].(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest)
			if req.GetMetadata().GetCommandId() != "np/1" {
				t.Errorf("command ID %q, want np/1", req.GetMetadata().GetCommandId())
			}
			req.Metadata = nil
			if diff := cmp.Diff(tt.want, req, protocmp.Transform()); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if n := f.count(getWorkspacePath); n != tt.gets {
				t.Errorf("GetWorkspace called %d times, want %d", n, tt.gets)
			}
			if !strings.Contains(r.stderr, "command-id: np/1\n") {
				t.Errorf("stderr:\n%s", r.stderr)
			}
			if !regexp.MustCompile(`Status:\s+applied \(applied revision \d+\)\n`).MatchString(r.stdout) || !strings.Contains(r.stdout, "np/1 (completed)") {
				t.Errorf("stdout:\n%s", r.stdout)
			}
		})
	}
}

// TestNetworkPolicySetOutput pins the table of set (the policy, its status
// and the command) and prints the Workspace ID with -o name.
func TestNetworkPolicySetOutput(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.WorkspaceNetworkPolicy)
	set := []string{"workspace", "network-policy", "set", fakeWorkspaceID, "--command-id", "np/out", "--mode", "public-internet",
		"--allow", "0.0.0.0/0:443", "--egress", "eg-a=203.0.113.0/24,[2001:db8::/32]:443", "--resolver", "rs-1"}
	r := kibo(t, args(f.conn(), set...)...).want(t, ExitOK)
	golden(t, "network_policy_set.golden", r.stdout)
	r = kibo(t, args(f.conn(), args(set, "-o", "name")...)...).want(t, ExitOK)
	if r.stdout != fakeWorkspaceID+"\n" {
		t.Errorf("-o name printed %q", r.stdout)
	}
}

// TestNetworkPolicySetCAS: a revision mismatch after current is never
// followed by a second read or a resend; a result the node has not reported
// is resent with the same command ID and request under --retry.
func TestNetworkPolicySetCAS(t *testing.T) {
	t.Parallel()
	mismatch := detailed(connect.CodeAborted, &ctrlv1.ErrorDetail{
		Reason: ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, CommandSettled: true, Message: "network_policy.revision is 8, not 7",
	})
	timedOut := detailed(connect.CodeUnavailable, &ctrlv1.ErrorDetail{
		Reason: ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT, Retryable: true, Message: "the node has not confirmed the policy within 1m0s",
	})
	unreachable := detailed(connect.CodeUnavailable, &ctrlv1.ErrorDetail{
		Reason: ctrlv1.FailureReason_FAILURE_REASON_NODE_UNREACHABLE, Retryable: true, Message: "node n1 is unreachable",
	})
	tests := []struct {
		name    string
		args    []string
		fail    []error
		code    int
		updates int
		gets    int
		hint    string
	}{
		{name: "aborted after current", args: []string{"--expected-revision", "current", "--retry"}, fail: []error{mismatch}, code: 10, updates: 1, gets: 1,
			hint: "hint: the network policy of workspace ws-abcdefghijklmnopqrst changed after kibo read it (revision 7); nothing was changed: read it again (kibo workspace network-policy get ws-abcdefghijklmnopqrst) and decide"},
		{name: "aborted with a number", args: []string{"--expected-revision", "7"}, fail: []error{mismatch}, code: 10, updates: 1},
		{name: "timed out", fail: []error{timedOut}, code: 4, updates: 1,
			hint: "hint: the node has not reported the change yet; it may still apply: resend the same command (--command-id np/cas; --retry does) or follow the policy status with kibo workspace network-policy get ws-abcdefghijklmnopqrst"},
		{name: "node unreachable", fail: []error{unreachable}, code: 14, updates: 1, hint: "hint: the node has not reported the change yet"},
		{name: "resent until known", args: []string{"--retry", "--expected-revision", "current", "--drain-seconds", "5"}, fail: []error{timedOut, unreachable, unavailable}, updates: 4, gets: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, capability.WorkspaceCreate, capability.WorkspaceNetworkPolicy)
			f.ws.current = &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID, NetworkPolicy: &ctrlv1.NetworkPolicy{Revision: 7}}
			f.ws.fail = map[string][]error{"UpdateWorkspaceNetworkPolicy": tt.fail}
			a := args([]string{"workspace", "network-policy", "set", fakeWorkspaceID, "--command-id", "np/cas", "--mode", "public-internet"}, tt.args...)
			r := kibo(t, args(f.conn(), a...)...).want(t, tt.code)
			if n := f.count(getWorkspacePath); n != tt.gets {
				t.Errorf("GetWorkspace called %d times, want %d", n, tt.gets)
			}
			got := f.ws.requests()
			if len(got) != tt.updates {
				t.Fatalf("UpdateWorkspaceNetworkPolicy received %d times, want %d", len(got), tt.updates)
			}
			for _, req := range got[1:] {
				if !proto.Equal(req, got[0]) {
					t.Errorf("a resend differs from the first attempt:\n%v\n%v", got[0], req)
				}
			}
			if tt.hint != "" && !strings.Contains(r.stderr, tt.hint) {
				t.Errorf("stderr lacks %q:\n%s", tt.hint, r.stderr)
			}
			if tt.hint == "" && strings.Contains(r.stderr, "hint:") {
				t.Errorf("stderr has a hint:\n%s", r.stderr)
			}
		})
	}
}

// TestNetworkPolicyCapabilities: set needs workspace.network_policy, and
// with current the capability of GetWorkspace too; get only the latter.
// Missing, they exit 14 after GetServerInfo alone.
func TestNetworkPolicyCapabilities(t *testing.T) {
	t.Parallel()
	set := []string{"workspace", "network-policy", "set", fakeWorkspaceID, "--mode", "none"}
	for _, tt := range []struct {
		caps []string
		args []string
		want string
	}{
		{[]string{capability.WorkspaceCreate}, set, `capability "workspace.network_policy" is not offered by the server (WorkspaceService/UpdateWorkspaceNetworkPolicy needs it); nothing was sent`},
		{[]string{capability.WorkspaceNetworkPolicy}, args(set, "--expected-revision", "current"), `capability "workspace.create" is not offered by the server (WorkspaceService/GetWorkspace needs it)`},
		{[]string{capability.WorkspaceNetworkPolicy}, []string{"workspace", "network-policy", "get", fakeWorkspaceID}, `capability "workspace.create"`},
	} {
		f := newFake(t, tt.caps...)
		r := kibo(t, args(f.conn(), tt.args...)...).want(t, ExitUnavailable)
		if !strings.Contains(r.stderr, tt.want) || printedID.MatchString(r.stderr) {
			t.Errorf("%v: stderr:\n%s", tt.args, r.stderr)
		}
		if diff := cmp.Diff([]string{infoPath}, f.requests()); diff != "" {
			t.Errorf("%v: requests (-want +got):\n%s", tt.args, diff)
		}
	}
	// Without current, set needs nothing but workspace.network_policy.
	f := newFake(t, capability.WorkspaceNetworkPolicy)
	kibo(t, args(f.conn(), args(set, "--expected-revision", "3")...)...).want(t, ExitOK)
}

// applied is a Workspace whose policy uses every field, applied but for
// one Egress, with a message.
func applied() *ctrlv1.Workspace {
	return &ctrlv1.Workspace{
		WorkspaceId: fakeWorkspaceID, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE,
		NetworkPolicy: &ctrlv1.NetworkPolicy{
			Revision: 3, Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET,
			Allow: []*ctrlv1.Destination{dest("0.0.0.0/0", 443, 443), dest("0.0.0.0/0", 8000, 8099)},
			Deny:  []*ctrlv1.Destination{dest("198.51.100.0/24", 0, 0)},
			Egresses: []*ctrlv1.EgressRoute{
				{EgressId: "eg-aaaaaaaaaaaaaaaaaaaa", Destinations: []*ctrlv1.Destination{dest("203.0.113.0/24", 0, 0), dest("2001:db8::/32", 443, 443)}},
				{EgressId: "eg-bbbbbbbbbbbbbbbbbbbb", Destinations: []*ctrlv1.Destination{dest("0.0.0.0/0", 0, 0)}},
			},
			Dns: &ctrlv1.DnsConfig{ResolverId: "rs-aaaaaaaaaaaaaaaaaaaa", ViaEgressId: "eg-aaaaaaaaaaaaaaaaaaaa"},
		},
		NetworkPolicyStatus: &ctrlv1.NetworkPolicyStatus{
			AppliedRevision: 2, State: ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_FAILED,
			Egresses: []*ctrlv1.EgressStatus{{EgressId: "eg-aaaaaaaaaaaaaaaaaaaa", AppliedRevision: 4}, {EgressId: "eg-bbbbbbbbbbbbbbbbbbbb", AppliedRevision: 1}},
			Message:  "egress eg-bbbbbbbbbbbbbbbbbbbb:\n host proxy.example does not resolve",
		},
		Labels: map[string]string{"team": "net"}, LabelsRevision: 2,
	}
}

// TestNetworkPolicyGet pins get's table and its JSON and YAML (the
// Workspace with its policy and status alone); -o name is the ID.
func TestNetworkPolicyGet(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.WorkspaceCreate)
	f.ws.current = applied()
	get := []string{"workspace", "network-policy", "get", fakeWorkspaceID}
	golden(t, "network_policy_get.golden", kibo(t, args(f.conn(), get...)...).want(t, ExitOK).stdout)
	golden(t, "network_policy_get_json.golden", kibo(t, args(f.conn(), args(get, "-o", "json")...)...).want(t, ExitOK).stdout)
	golden(t, "network_policy_get_yaml.golden", kibo(t, args(f.conn(), args(get, "-o", "yaml")...)...).want(t, ExitOK).stdout)
	if r := kibo(t, args(f.conn(), args(get, "-o", "name")...)...).want(t, ExitOK); r.stdout != fakeWorkspaceID+"\n" {
		t.Errorf("-o name printed %q", r.stdout)
	}
	// An empty policy (a Workspace created without one).
	f.ws.current = &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID}
	golden(t, "network_policy_get_empty.golden", kibo(t, args(f.conn(), get...)...).want(t, ExitOK).stdout)
}

// TestNetworkPolicyFile: --file reads JSON and YAML, with lowerCamelCase or
// proto field names, from a file or standard input, and the document get
// prints; the revision in it is never sent.
func TestNetworkPolicyFile(t *testing.T) {
	t.Parallel()
	want := proto.CloneOf(applied().GetNetworkPolicy())
	want.Revision = 0
	dir := t.TempDir()
	f := newFake(t, capability.WorkspaceCreate, capability.WorkspaceNetworkPolicy)
	f.ws.current = applied()
	get := []string{"workspace", "network-policy", "get", fakeWorkspaceID}
	fromJSON := kibo(t, args(f.conn(), args(get, "-o", "json")...)...).want(t, ExitOK).stdout
	fromYAML := kibo(t, args(f.conn(), args(get, "-o", "yaml")...)...).want(t, ExitOK).stdout

	const yamlPolicy = `# the policy of applied(), as a person writes it
revision: 9
mode: NETWORK_MODE_PUBLIC_INTERNET
allow:
  - {cidr: 0.0.0.0/0, portMin: 443, portMax: 443}
  - cidr: 0.0.0.0/0
    port_min: 8000
    port_max: 8099
deny:
  - cidr: 198.51.100.0/24
egresses:
  - egressId: eg-aaaaaaaaaaaaaaaaaaaa
    destinations:
      - cidr: 203.0.113.0/24
      - {cidr: "2001:db8::/32", portMin: 443, portMax: 443}
  - egress_id: eg-bbbbbbbbbbbbbbbbbbbb
    destinations: [{cidr: 0.0.0.0/0}]
dns:
  resolverId: rs-aaaaaaaaaaaaaaaaaaaa
  viaEgressId: eg-aaaaaaaaaaaaaaaaaaaa
`
	jsonPolicy := `{"revision": "9", "mode": "NETWORK_MODE_PUBLIC_INTERNET",
  "allow": [{"cidr": "0.0.0.0/0", "portMin": 443, "portMax": 443}, {"cidr": "0.0.0.0/0", "portMin": 8000, "portMax": 8099}],
  "deny": [{"cidr": "198.51.100.0/24"}],
  "egresses": [{"egressId": "eg-aaaaaaaaaaaaaaaaaaaa", "destinations": [{"cidr": "203.0.113.0/24"}, {"cidr": "2001:db8::/32", "portMin": 443, "portMax": 443}]},
               {"egressId": "eg-bbbbbbbbbbbbbbbbbbbb", "destinations": [{"cidr": "0.0.0.0/0"}]}],
  "dns": {"resolverId": "rs-aaaaaaaaaaaaaaaaaaaa", "viaEgressId": "eg-aaaaaaaaaaaaaaaaaaaa"}}`
	for _, tt := range []struct {
		name, content string
		stdin         bool
	}{
		{name: "policy.yaml", content: yamlPolicy},
		{name: "policy.json", content: jsonPolicy},
		{name: "policy.json", content: "\n  " + jsonPolicy, stdin: true},
		{name: "get.json", content: fromJSON},
		{name: "get.yaml", content: fromYAML},
		{name: "get.yaml", content: fromYAML, stdin: true},
	} {
		t.Run(tt.name+map[bool]string{true: " on stdin"}[tt.stdin], func(t *testing.T) {
			path, stdin := "-", tt.content
			if !tt.stdin {
				path, stdin = filepath.Join(dir, tt.name), ""
				if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			f := newFake(t, capability.WorkspaceNetworkPolicy)
			kiboWith(t, testEnv(t), stdin, args(f.conn(), "workspace", "network-policy", "set", fakeWorkspaceID, "--file", path)...).want(t, ExitOK)
			got := f.ws.requests()
			if len(got) != 1 {
				t.Fatalf("requests %v", got)
			}
			if diff := cmp.Diff(want, got[0].(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest).GetNetworkPolicy(), protocmp.Transform()); diff != "" {
				t.Errorf("policy sent (-want +got):\n%s", diff)
			}
		})
	}

	// workspace create --network-policy-file reads the same formats.
	path := filepath.Join(dir, "create.yaml")
	if err := os.WriteFile(path, []byte(yamlPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	f = newFake(t, capability.WorkspaceCreate, capability.WorkspaceNetworkPolicy)
	kibo(t, args(f.conn(), "workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "--network-policy-file", path)...).want(t, ExitOK)
	if got := f.ws.requests(); len(got) != 1 || !proto.Equal(got[0].(*ctrlv1.CreateWorkspaceRequest).GetNetworkPolicy(), want) {
		t.Errorf("CreateWorkspace requests %v", got)
	}
}

// TestWorkspaceGetPolicyStatus: workspace get shows the policy status with
// the applied revision of each Egress and the message, on one line.
func TestWorkspaceGetPolicyStatus(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.WorkspaceCreate)
	f.ws.current = applied()
	r := kibo(t, args(f.conn(), "workspace", "get", fakeWorkspaceID)...).want(t, ExitOK)
	for _, re := range []string{
		`\nNetwork policy:\s+public_internet \(revision 3\)\n`,
		`\nPolicy status:\s+failed \(applied revision 2\)\n`,
		`\nPolicy egresses:\s+eg-aaaaaaaaaaaaaaaaaaaa revision 4\n\s+eg-bbbbbbbbbbbbbbbbbbbb revision 1\n`,
		`\nPolicy message:\s+egress eg-bbbbbbbbbbbbbbbbbbbb: host proxy.example does not resolve\n`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("stdout does not match %s:\n%s", re, r.stdout)
		}
	}
	// Without Egresses or a message, neither row.
	f.ws.current = &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID}
	r = kibo(t, args(f.conn(), "workspace", "get", fakeWorkspaceID)...).want(t, ExitOK)
	if strings.Contains(r.stdout, "Policy egresses:") || strings.Contains(r.stdout, "Policy message:") {
		t.Errorf("stdout:\n%s", r.stdout)
	}
}
