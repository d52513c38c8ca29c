package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// The network-policy commands: "workspace network-policy get" reads a
// Workspace's expected policy and its status; "set" replaces the whole
// policy (UpdateWorkspaceNetworkPolicy), built from flags or read from a
// YAML or JSON file.

func (a *app) workspaceNetworkPolicy() *cobra.Command {
	cmd := group("network-policy", "Show or replace a Workspace's network policy",
		`Show a Workspace's network policy and how far its node applied it (get), or
replace the whole policy (set). get needs the capability of GetWorkspace
(workspace.create), set the capability workspace.network_policy; a server that
does not list it makes the command exit 14 without sending anything.`)
	cmd.AddCommand(a.networkPolicyGet(), a.networkPolicySet())
	return cmd
}

func (a *app) networkPolicyGet() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "get WORKSPACE_ID",
		Short: "Show a Workspace's network policy and its status",
		Long: `Show the network policy a Workspace is expected to have (network_policy, with its
revision) and network_policy_status: the revision its running execution applies,
PENDING, APPLIED, FAILED or UNKNOWN, the revision of each Egress that new
connections leave through, and the message of a failure (GetWorkspace).

The table writes destinations as set's flags take them. -o json and -o yaml
print the Workspace with only workspace_id, network_policy and
network_policy_status, in the API's JSON; set --file reads that document back
(its revision and status are ignored).`,
		Example: "  kibo workspace network-policy get ws-0123456789abcdefghij\n  kibo workspace network-policy get ws-0123456789abcdefghij -o yaml > policy.yaml",
	})
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		ws, err := workspaces.get(ctx, s.client.WorkspaceService, args[0])
		if err != nil {
			return err
		}
		return a.print(policyView(ws), nonEmpty(ws.GetWorkspaceId()), func(w io.Writer) { networkPolicyDetail(w, ws) })
	})
	return procedure(cmd, workspaces.getProc)
}

// policyView is the part of ws that network-policy get prints.
func policyView(ws *ctrlv1.Workspace) *ctrlv1.Workspace {
	return &ctrlv1.Workspace{
		WorkspaceId:         ws.GetWorkspaceId(),
		NetworkPolicy:       ws.GetNetworkPolicy(),
		NetworkPolicyStatus: ws.GetNetworkPolicyStatus(),
	}
}

func (a *app) networkPolicySet() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "set WORKSPACE_ID (--mode MODE [--allow ...] [--deny ...] [--egress ...] [--resolver ID [--dns-via-egress ID]] | --file FILE) [flags]",
		Short: "Replace a Workspace's network policy",
		Long: wrap(`Replace the whole network policy of a Workspace (UpdateWorkspaceNetworkPolicy): what the flags or the file leave out is not kept from the current policy.

The policy comes from flags or from --file. With flags, --mode is required; --allow, --deny and --egress repeat. A destination is CIDR[:PORT[-PORT]]: a prefix without host bits (203.0.113.0/24, 2001:db8::/32; one address is /32 or /128) and a port or an inclusive port range from 1 to 65535; without a port it covers every port. --egress EGRESS_ID=DEST,DEST... sends new TCP connections to those destinations through the Egress; the first --egress whose destinations cover a connection wins, in the order given. --resolver forwards the Workspace's DNS queries to a Resolver, and --dns-via-egress sends them through an Egress (a udp Resolver needs the Egress's udp_enabled). --file reads the API's NetworkPolicy as JSON or YAML (told apart by the content; - is standard input), or a document with a networkPolicy key such as "network-policy get -o yaml" prints; its revision is ignored.

--expected-revision N sends the network_policy.revision you read: when the policy changed meanwhile the call is aborted (exit 10) and nothing changes, even when the content is equal. "current" makes kibo read the revision once, before the first attempt, and never again. Without it the policy is replaced whatever its revision. Equal content keeps the revision.

On an AVAILABLE Workspace the call returns once its node applied the change or failed it, at most one minute; past that, or when the node is unreachable, it fails with a retryable TIMED_OUT (exit 4) or NODE_UNREACHABLE (exit 14) and the policy status is UNKNOWN until the node reports: resend the same command ID (--retry does). A STOPPED Workspace only records the policy for its next start; other states refuse it (failed_precondition, exit 9).

--drain-seconds (0-3600; when absent the server uses 600) is how long a connection whose path the change moves (direct to an Egress or back, or through an Egress the policy no longer uses for its destination) keeps running before it is closed; 0 closes it at once. A connection the new mode, allow or deny no longer admits ends at once regardless.`, 80),
		Example: `  kibo workspace network-policy set ws-0123456789abcdefghij --mode public-internet --deny 198.51.100.0/24 --expected-revision current
  kibo workspace network-policy set ws-0123456789abcdefghij --mode public-internet --allow 0.0.0.0/0:443 \
      --egress eg-0123456789abcdefghij=203.0.113.0/24,192.0.2.10/32:8000-8099 --drain-seconds 30
  kibo workspace network-policy set ws-0123456789abcdefghij --file policy.yaml --expected-revision 3`,
	})
	pf := addPolicyFlags(cmd)
	expected := &revisionFlag{}
	var drain uint32
	f := cmd.Flags()
	f.Var(expected, "expected-revision", "the network_policy.revision you read, or current: read it once before sending; absent or 0: no check")
	f.Uint32Var(&drain, "drain-seconds", 600, "how long connections whose path the change moves keep running, 0-3600; 0 closes them at once; sent only when given")
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceUpdateWorkspaceNetworkPolicyProcedure, func(ctx context.Context, wr *writing, args []string) error {
		np, err := pf.policy(cmd, a.stdin)
		if err != nil {
			return err
		}
		id := args[0]
		req := &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{Metadata: wr.meta(), WorkspaceId: id, ExpectedRevision: expected.n, NetworkPolicy: np}
		if cmd.Flags().Changed("drain-seconds") {
			req.DrainSeconds = &drain
		}
		var read uint64 // the revision read and sent with current
		if expected.current {
			wr.before(func(ctx context.Context, s *session) error {
				ws, err := workspaces.get(ctx, s.client.WorkspaceService, id)
				if err != nil {
					return err
				}
				read = ws.GetNetworkPolicy().GetRevision()
				req.ExpectedRevision = read
				return nil
			}, workspaces.getProc)
		}
		res, _, err := send(ctx, wr, workspaces.client, ctrlv1connect.WorkspaceServiceClient.UpdateWorkspaceNetworkPolicy, req)
		if err != nil {
			return policyHint(err, wr.id, id, read)
		}
		ws := res.GetWorkspace()
		return a.print(res, nonEmpty(ws.GetWorkspaceId()), func(w io.Writer) {
			networkPolicyDetail(w, ws)
			commandLine(w, res.GetCommand())
		})
	})
}

// policyHint explains the failures of a policy change people act on: a
// revision that changed after kibo read it (read, 0 when none was read), and
// a change whose outcome the node has not reported yet. The exit code stays
// the error's.
func policyHint(err error, commandID, id string, read uint64) error {
	d, _ := kibotos.Detail(err)
	switch {
	case connect.CodeOf(err) == connect.CodeAborted && read != 0:
		return withHint(err, fmt.Sprintf("the network policy of workspace %s changed after kibo read it (revision %d); nothing was changed: read it again (kibo workspace network-policy get %s) and decide", id, read, id))
	case d.GetCommandSettled():
		return err
	case d.GetReason() == ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT || d.GetReason() == ctrlv1.FailureReason_FAILURE_REASON_NODE_UNREACHABLE:
		return withHint(err, fmt.Sprintf("the node has not reported the change yet; it may still apply: resend the same command (--command-id %s; --retry does) or follow the policy status with kibo workspace network-policy get %s", commandID, id))
	}
	return err
}

// policyFlags build a NetworkPolicy from flags, or read it from a file.
type policyFlags struct {
	file                  string
	mode                  string
	allow, deny, egresses []string
	resolver, viaEgress   string
}

// policyFlagNames are the flags that build a policy; --file excludes them.
var policyFlagNames = []string{"mode", "allow", "deny", "egress", "resolver", "dns-via-egress"}

func addPolicyFlags(cmd *cobra.Command) *policyFlags {
	p := &policyFlags{}
	f := cmd.Flags()
	f.StringVar(&p.file, "file", "", "read the complete policy from this file, the API's NetworkPolicy as JSON or YAML (- reads standard input); its revision is ignored")
	f.StringVar(&p.mode, "mode", "", "network mode: none (loopback only) or public-internet (required unless --file)")
	f.StringArrayVar(&p.allow, "allow", nil, "admit only these destinations, CIDR[:PORT[-PORT]] (repeatable; none given: every public destination)")
	f.StringArrayVar(&p.deny, "deny", nil, "never admit these destinations, CIDR[:PORT[-PORT]] (repeatable; deny wins over allow)")
	f.StringArrayVar(&p.egresses, "egress", nil, "EGRESS_ID=CIDR[:PORT[-PORT]],...: send new TCP connections to these destinations through the Egress (repeatable; the first that covers a connection wins)")
	f.StringVar(&p.resolver, "resolver", "", "forward the Workspace's DNS queries to this Resolver")
	f.StringVar(&p.viaEgress, "dns-via-egress", "", "with --resolver: send the DNS queries through this Egress (a udp Resolver needs the Egress's udp_enabled)")
	_ = cmd.MarkFlagFilename("file", "json", "yaml", "yml")
	_ = cmd.RegisterFlagCompletionFunc("mode", enumCompletion(ctrlv1.NetworkMode_value, "NETWORK_MODE_"))
	return p
}

// policy returns the policy of the flags, or of --file (read from stdin
// when it is "-"). Every malformed flag is a usage error, found before
// anything is sent.
func (p *policyFlags) policy(cmd *cobra.Command, stdin io.Reader) (*ctrlv1.NetworkPolicy, error) {
	var given []string
	for _, name := range policyFlagNames {
		if cmd.Flags().Changed(name) {
			given = append(given, "--"+name)
		}
	}
	if cmd.Flags().Changed("file") {
		if len(given) > 0 {
			return nil, usagef("--file holds the complete policy: it does not combine with %s", strings.Join(given, ", "))
		}
		return readPolicyFile("file", p.file, stdin)
	}
	if len(given) == 0 {
		return nil, usagef("give the complete new policy: --mode none|public-internet (with --allow, --deny, --egress, --resolver, --dns-via-egress as needed) or --file FILE")
	}
	return buildPolicy(p.mode, p.allow, p.deny, p.egresses, p.resolver, p.viaEgress)
}

// buildPolicy builds the policy of the flags' values; errors are usage
// errors that name the flag and the value.
func buildPolicy(mode string, allow, deny, egresses []string, resolver, via string) (*ctrlv1.NetworkPolicy, error) {
	if mode == "" {
		return nil, usagef("--mode none|public-internet is required: the flags give the complete new policy")
	}
	m, err := parseEnum(ctrlv1.NetworkMode_value, "NETWORK_MODE_", mode, "--mode")
	if err != nil {
		return nil, err
	}
	np := &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode(m)}
	for _, s := range allow {
		d, err := parseDestination(s)
		if err != nil {
			return nil, usagef("--allow %q: %v", s, err)
		}
		np.Allow = append(np.Allow, d)
	}
	for _, s := range deny {
		d, err := parseDestination(s)
		if err != nil {
			return nil, usagef("--deny %q: %v", s, err)
		}
		np.Deny = append(np.Deny, d)
	}
	for _, s := range egresses {
		r, err := parseEgressRoute(s)
		if err != nil {
			return nil, usagef("--egress %q: %v", s, err)
		}
		np.Egresses = append(np.Egresses, r)
	}
	switch {
	case via != "" && resolver == "":
		return nil, usagef("--dns-via-egress needs --resolver: it says how the queries reach the Resolver")
	case resolver != "":
		np.Dns = &ctrlv1.DnsConfig{ResolverId: resolver, ViaEgressId: via}
	}
	return np, nil
}

// parseEgressRoute parses EGRESS_ID=DEST,DEST... (DEST as parseDestination).
func parseEgressRoute(s string) (*ctrlv1.EgressRoute, error) {
	id, dests, ok := strings.Cut(s, "=")
	id = strings.TrimSpace(id)
	switch {
	case !ok:
		return nil, errors.New("want EGRESS_ID=CIDR[:PORT[-PORT]],... (the destinations this Egress carries)")
	case id == "":
		return nil, errors.New("no Egress ID before '='")
	case strings.TrimSpace(dests) == "":
		return nil, fmt.Errorf("no destinations after %q: want %s=CIDR[:PORT[-PORT]],... (every address: 0.0.0.0/0,::/0)", id+"=", id)
	}
	r := &ctrlv1.EgressRoute{EgressId: id}
	for d := range strings.SplitSeq(dests, ",") {
		if strings.TrimSpace(d) == "" {
			return nil, errors.New("an empty destination between commas")
		}
		dest, err := parseDestination(d)
		if err != nil {
			return nil, fmt.Errorf("destination %q: %w", strings.TrimSpace(d), err)
		}
		r.Destinations = append(r.Destinations, dest)
	}
	return r, nil
}

// parseDestination parses CIDR[:PORT[-PORT]]: an IPv4 or IPv6 prefix
// without host bits, not IPv4-mapped ("[2001:db8::/32]:443" brackets one that takes a port,
// though "2001:db8::/32:443" is not ambiguous either), then optionally a
// port or an inclusive range, 1 to 65535. No port: every port (0-0 on the
// wire).
func parseDestination(s string) (*ctrlv1.Destination, error) {
	s = strings.TrimSpace(s)
	var cidr, ports string
	hasPort := false
	if rest, ok := strings.CutPrefix(s, "["); ok {
		inner, after, ok := strings.Cut(rest, "]")
		if !ok {
			return nil, errors.New("'[' without ']'")
		}
		cidr = inner
		if after != "" {
			ports, hasPort = strings.CutPrefix(after, ":")
			if !hasPort {
				return nil, fmt.Errorf("%q after ']': want :PORT or :PORT-PORT", after)
			}
		}
	} else {
		slash := strings.IndexByte(s, '/')
		if slash < 0 {
			return nil, errors.New("want CIDR[:PORT[-PORT]] such as 203.0.113.0/24:443; one address is ADDR/32 (IPv4) or ADDR/128 (IPv6)")
		}
		cidr = s
		if i := strings.IndexByte(s[slash:], ':'); i >= 0 {
			cidr, ports, hasPort = s[:slash+i], s[slash+i+1:], true
		}
	}
	prefix, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("CIDR %q: %s", cidr, prefixProblem(err))
	}
	if prefix.Addr().Is4In6() {
		hint := ""
		if prefix.Bits() >= 96 {
			hint = fmt.Sprintf(": write %s", netip.PrefixFrom(prefix.Addr().Unmap(), prefix.Bits()-96).Masked())
		}
		return nil, fmt.Errorf("CIDR %s is an IPv4-mapped IPv6 prefix, which never matches (IPv4 destinations are matched by IPv4 prefixes)%s", cidr, hint)
	}
	if m := prefix.Masked(); m != prefix {
		return nil, fmt.Errorf("CIDR %s has host bits set: the prefix is %s", cidr, m)
	}
	d := &ctrlv1.Destination{Cidr: prefix.String()}
	if !hasPort {
		return d, nil
	}
	if ports == "" {
		return nil, errors.New("no port after ':': want PORT or PORT-PORT, or no ':' for every port")
	}
	lo, hi, isRange := strings.Cut(ports, "-")
	first, err := parsePort(lo)
	if err != nil {
		return nil, err
	}
	last := first
	if isRange {
		if last, err = parsePort(hi); err != nil {
			return nil, err
		}
		if first > last {
			return nil, fmt.Errorf("port range %d-%d: the first port is greater than the last", first, last)
		}
	}
	d.PortMin, d.PortMax = first, last
	return d, nil
}

// parsePort parses one port, 1 to 65535.
func parsePort(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	switch {
	case err != nil:
		return 0, fmt.Errorf("port %q: want a number from 1 to 65535", s)
	case n == 0:
		return 0, errors.New("port 0: leave the port out to cover every port")
	case n > 65535:
		return 0, fmt.Errorf("port %d: want a number from 1 to 65535", n)
	}
	return uint32(n), nil
}

// prefixProblem is what netip says is wrong with a prefix, without its
// "netip.ParsePrefix(...): " preamble.
func prefixProblem(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "): "); i >= 0 {
		msg = msg[i+3:]
	}
	return msg
}

// formatDestination writes d as the flags take it: CIDR, CIDR:PORT or
// CIDR:PORT-PORT (IPv6 prefixes with a port in brackets).
func formatDestination(d *ctrlv1.Destination) string {
	lo, hi := d.GetPortMin(), d.GetPortMax()
	if lo == 0 && hi == 0 {
		return d.GetCidr()
	}
	cidr := d.GetCidr()
	if strings.Contains(cidr, ":") {
		cidr = "[" + cidr + "]"
	}
	if lo == hi {
		return fmt.Sprintf("%s:%d", cidr, lo)
	}
	return fmt.Sprintf("%s:%d-%d", cidr, lo, hi)
}

// maxPolicyFile bounds a policy file: far above any policy the server
// accepts.
const maxPolicyFile = 4 << 20

// readPolicyFile reads the policy of the file named by --flag ("-":
// stdin); see parsePolicy.
func readPolicyFile(flag, path string, stdin io.Reader) (*ctrlv1.NetworkPolicy, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(io.LimitReader(stdin, maxPolicyFile+1))
		if err != nil {
			return nil, fmt.Errorf("--%s -: read standard input: %w", flag, err)
		}
	} else if data, err = readFile(flag, path); err != nil {
		return nil, err
	}
	if len(data) > maxPolicyFile {
		return nil, usagef("--%s %s: larger than %d MiB; a policy is far smaller", flag, path, maxPolicyFile>>20)
	}
	np, err := parsePolicy(data)
	if err != nil {
		return nil, usagef("--%s %s: %v", flag, path, err)
	}
	return np, nil
}

// parsePolicy reads a NetworkPolicy in the API's JSON, or the same as YAML
// (a document that does not start with '{'), converted to JSON first so
// that both follow protojson's rules: field names as the API spells them
// (lowerCamelCase or the proto names), enum values by name, unknown fields
// refused. A document with a networkPolicy key is a Workspace, as
// "network-policy get -o json|yaml" prints it: its policy is taken. The
// revision is cleared: the server assigns it.
func parsePolicy(data []byte) (*ctrlv1.NetworkPolicy, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, errors.New("empty: want a NetworkPolicy as JSON or YAML")
	}
	j := trimmed
	if trimmed[0] != '{' {
		var doc any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			return nil, fmt.Errorf("not YAML: %v", err)
		}
		v, err := jsonValue(doc)
		if err != nil {
			return nil, err
		}
		if _, ok := v.(map[string]any); !ok {
			return nil, errors.New("want a mapping with the NetworkPolicy's fields (mode, allow, deny, egresses, dns)")
		}
		if j, err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(j, &keys); err != nil {
		return nil, fmt.Errorf("not JSON: %v", err)
	}
	_, camel := keys["networkPolicy"]
	_, snake := keys["network_policy"]
	var np *ctrlv1.NetworkPolicy
	if camel || snake {
		ws := &ctrlv1.Workspace{}
		if err := protojson.Unmarshal(j, ws); err != nil {
			return nil, fmt.Errorf("a Workspace document: %v", plainProtoError(err))
		}
		np = ws.GetNetworkPolicy()
	} else {
		np = &ctrlv1.NetworkPolicy{}
		if err := protojson.Unmarshal(j, np); err != nil {
			return nil, plainProtoError(err)
		}
	}
	if np == nil {
		np = &ctrlv1.NetworkPolicy{}
	}
	np.Revision = 0
	return np, nil
}

// plainProtoError drops protojson's "proto: " prefix and its
// non-breaking spaces, which it adds to keep its messages unstable.
func plainProtoError(err error) error {
	msg := strings.ReplaceAll(err.Error(), "\u00a0", " ")
	return errors.New(strings.TrimPrefix(msg, "proto: "))
}

// jsonValue converts what the YAML decoder returned into values
// encoding/json encodes: mappings need string keys.
func jsonValue(v any) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			t[k] = c
		}
		return t, nil
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("key %v: want a field name", k)
			}
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		for i, e := range t {
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			t[i] = c
		}
		return t, nil
	}
	return v, nil
}

// networkPolicyDetail renders a Workspace's policy and its status for
// people; lists have one entry per line, written as the flags take them.
func networkPolicyDetail(w io.Writer, ws *ctrlv1.Workspace) {
	np := ws.GetNetworkPolicy()
	row(w, "Workspace ID:", ws.GetWorkspaceId())
	row(w, "Mode:", enumName(np.GetMode().String(), "NETWORK_MODE_"))
	row(w, "Revision:", np.GetRevision())
	// What an empty list means, in the mode that admits connections.
	allNote, directNote := "-", "-"
	if np.GetMode() == ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET {
		allNote, directNote = "- (every public destination)", "- (every connection leaves directly)"
	}
	rows(w, "Allow:", destinations(np.GetAllow()), allNote)
	rows(w, "Deny:", destinations(np.GetDeny()), "-")
	var routes []string
	for _, r := range np.GetEgresses() {
		routes = append(routes, r.GetEgressId()+"="+strings.Join(destinations(r.GetDestinations()), ","))
	}
	rows(w, "Egresses:", routes, directNote)
	row(w, "DNS:", dnsSummary(np.GetDns()))
	st := ws.GetNetworkPolicyStatus()
	row(w, "Status:", policyStatus(st))
	rows(w, "Egress revisions:", egressRevisions(st), "-")
	row(w, "Status message:", orDash(oneLine(st.GetMessage())))
}

// policyStatus is "applied (applied revision 3)".
func policyStatus(st *ctrlv1.NetworkPolicyStatus) string {
	return fmt.Sprintf("%s (applied revision %d)", enumName(st.GetState().String(), "NETWORK_POLICY_STATE_"), st.GetAppliedRevision())
}

// egressRevisions are the status's Egresses, "eg-… revision 2" each.
func egressRevisions(st *ctrlv1.NetworkPolicyStatus) []string {
	var out []string
	for _, e := range st.GetEgresses() {
		out = append(out, fmt.Sprintf("%s revision %d", e.GetEgressId(), e.GetAppliedRevision()))
	}
	return out
}

func dnsSummary(d *ctrlv1.DnsConfig) string {
	if d.GetResolverId() == "" {
		return "- (no Resolver: queries are refused)"
	}
	if v := d.GetViaEgressId(); v != "" {
		return "resolver " + d.GetResolverId() + " via egress " + v
	}
	return "resolver " + d.GetResolverId()
}

func destinations(ds []*ctrlv1.Destination) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = formatDestination(d)
	}
	return out
}

// rows writes key with the first value, then one row per further value;
// none writes none.
func rows(w io.Writer, key string, values []string, none string) {
	if len(values) == 0 {
		row(w, key, none)
		return
	}
	for i, v := range values {
		if i > 0 {
			key = ""
		}
		row(w, key, v)
	}
}
