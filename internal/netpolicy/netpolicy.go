// Package netpolicy is the one statement of what a Workspace's network
// policy (kibotos.ctrl.v1.NetworkPolicy) means. ctrl uses it to validate,
// compare and record a policy's references; the node uses Compile and
// Decide on every new connection. It is pure: no I/O, no clock.
//
// Syntax (Validate):
//
//   - mode is UNSPECIFIED (which is NONE), NONE or PUBLIC_INTERNET.
//   - A Destination's cidr parses with net/netip.ParsePrefix: an IPv4 or
//     IPv6 prefix with its length ("203.0.113.0/24", "2001:db8::/32"), no
//     bits set past the length ("203.0.113.7/24" is refused, naming
//     203.0.113.0/24), no IPv6 zone, and no IPv4-mapped IPv6 prefix
//     ("::ffff:203.0.113.0/120" is refused, naming 203.0.113.0/24): an IPv4
//     destination is matched by IPv4 prefixes only, so an IPv6 prefix never
//     covers an IPv4 destination, even "::/0".
//   - Ports: port_min = port_max = 0 is every port; otherwise
//     1 ≤ port_min ≤ port_max ≤ 65535.
//   - At most MaxAllow entries in allow, MaxDeny in deny, MaxRoutes egress
//     routes, each with 1 to MaxRouteDestinations destinations.
//   - egress_id (required in a route), dns.resolver_id and
//     dns.via_egress_id (optional) are IDs as the Egress and Resolver
//     services check them (internal/ids): one that cannot exist (another
//     kind's prefix, too long) is not_found naming the field.
//     dns.via_egress_id without dns.resolver_id is invalid.
//
// Every refusal is a *fault.Error naming the offending field, for example
// "network_policy.allow[3].cidr".
//
// Meaning (Policy.Decide), for a new connection to dst:
//
//  1. mode other than PUBLIC_INTERNET: Refuse.
//  2. a deny entry covers dst: Refuse (deny wins over allow).
//  3. allow is non-empty and no allow entry covers dst: Refuse.
//  4. the first egress route with a destination covering dst: ViaEgress,
//     through that route's Egress (routes do not admit: allow and deny
//     apply first).
//  5. otherwise Direct.
//
// Special-purpose ranges (loopback, private, link-local, ...) are not
// decided here: the node's dialer refuses them for Direct connections
// whatever the policy says (internal/netguard, with the operator's
// allow-list).
package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/store"
)

// Limits of a policy.
const (
	MaxAllow             = 256
	MaxDeny              = 256
	MaxRoutes            = 16
	MaxRouteDestinations = 256
)

// ID prefixes of the objects a policy references (the Egress and Resolver
// services assign them).
const (
	EgressIDPrefix   = "eg-"
	ResolverIDPrefix = "rs-"
)

// Validate checks a policy's syntax; field names the policy in the request
// ("network_policy"). A nil policy is NONE. It looks nothing up: whether
// the referenced Egresses and Resolver exist is the caller's check.
func Validate(field string, p *ctrlv1.NetworkPolicy) error {
	if p == nil {
		return nil
	}
	switch p.GetMode() {
	case ctrlv1.NetworkMode_NETWORK_MODE_UNSPECIFIED, ctrlv1.NetworkMode_NETWORK_MODE_NONE,
		ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET:
	default:
		return fault.Invalid(field+".mode", "unknown network mode %d", p.GetMode())
	}
	if err := validateList(field+".allow", p.GetAllow(), MaxAllow); err != nil {
		return err
	}
	if err := validateList(field+".deny", p.GetDeny(), MaxDeny); err != nil {
		return err
	}
	if n := len(p.GetEgresses()); n > MaxRoutes {
		return fault.Invalid(field+".egresses", "%d egress routes, at most %d are allowed", n, MaxRoutes)
	}
	for i, r := range p.GetEgresses() {
		f := fmt.Sprintf("%s.egresses[%d]", field, i)
		if err := validateID(f+".egress_id", EgressIDPrefix, "egress", r.GetEgressId()); err != nil {
			return err
		}
		if len(r.GetDestinations()) == 0 {
			return fault.Invalid(f+".destinations", "an egress route needs at least one destination")
		}
		if err := validateList(f+".destinations", r.GetDestinations(), MaxRouteDestinations); err != nil {
			return err
		}
	}
	dns := p.GetDns()
	if id := dns.GetResolverId(); id != "" {
		if err := validateID(field+".dns.resolver_id", ResolverIDPrefix, "resolver", id); err != nil {
			return err
		}
	}
	if id := dns.GetViaEgressId(); id != "" {
		if dns.GetResolverId() == "" {
			return fault.Invalid(field+".dns.via_egress_id", "via_egress_id needs a resolver_id: there are no queries to send through the egress")
		}
		if err := validateID(field+".dns.via_egress_id", EgressIDPrefix, "egress", id); err != nil {
			return err
		}
	}
	return nil
}

// validateID checks an ID as the Egress and Resolver services do, naming
// field in a not_found as well.
func validateID(field, prefix, noun, id string) error {
	err := ids.Validate(field, prefix, noun, id)
	if fe, ok := fault.As(err); ok && fe.Field == "" {
		c := *fe
		c.Field = field
		return &c
	}
	return err
}

func validateList(field string, ds []*ctrlv1.Destination, limit int) error {
	if len(ds) > limit {
		return fault.Invalid(field, "%d entries, at most %d are allowed", len(ds), limit)
	}
	for i, d := range ds {
		if _, err := parseDestination(fmt.Sprintf("%s[%d]", field, i), d); err != nil {
			return err
		}
	}
	return nil
}

// destination is a parsed Destination: a prefix and an inclusive port
// range.
type destination struct {
	prefix    netip.Prefix
	lo, hi    uint16
	everyPort bool
}

func (d destination) covers(a netip.Addr, port uint16) bool {
	return d.prefix.Contains(a) && (d.everyPort || (d.lo <= port && port <= d.hi))
}

func parseDestination(field string, d *ctrlv1.Destination) (destination, error) {
	p, err := parseCIDR(field+".cidr", d.GetCidr())
	if err != nil {
		return destination{}, err
	}
	out := destination{prefix: p}
	lo, hi := d.GetPortMin(), d.GetPortMax()
	switch {
	case lo == 0 && hi == 0:
		out.everyPort = true
	case lo == 0:
		return destination{}, fault.Invalid(field+".port_min", "port_min is 0 with port_max %d: use 0-0 for every port, or a range from 1", hi)
	case lo > 65535:
		return destination{}, fault.Invalid(field+".port_min", "port_min %d is not a port (1 to 65535)", lo)
	case hi > 65535:
		return destination{}, fault.Invalid(field+".port_max", "port_max %d is not a port (1 to 65535)", hi)
	case hi < lo:
		return destination{}, fault.Invalid(field+".port_max", "port_max %d is less than port_min %d", hi, lo)
	default:
		out.lo, out.hi = uint16(lo), uint16(hi)
	}
	return out, nil
}

// maxShown bounds how much of a caller's string an error message repeats.
const maxShown = 64

func parseCIDR(field, s string) (netip.Prefix, error) {
	shown := s
	if len(shown) > maxShown {
		shown = shown[:maxShown] + "…"
	}
	if s == "" {
		return netip.Prefix{}, fault.Invalid(field, "cidr is required (for example 203.0.113.0/24 or 2001:db8::/32)")
	}
	if strings.Contains(s, "%") {
		return netip.Prefix{}, fault.Invalid(field, "%q has an IPv6 zone; a destination cannot have one", shown)
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fault.Invalid(field, "%q is not a CIDR prefix (for example 203.0.113.0/24 or 2001:db8::/32)", shown)
	}
	if p.Addr().Is4In6() {
		hint := ""
		if p.Bits() >= 96 {
			hint = fmt.Sprintf(": write it as %s", netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked())
		}
		return netip.Prefix{}, fault.Invalid(field, "%q is an IPv4-mapped IPv6 prefix, which never matches%s", shown, hint)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fault.Invalid(field, "%q has host bits set past /%d; the prefix is %s", shown, p.Bits(), m)
	}
	return p, nil
}

// Normalize returns the form of p ctrl stores: a copy with revision 0,
// mode UNSPECIFIED written NONE, each cidr in its canonical spelling
// ("2001:DB8::/32" becomes "2001:db8::/32"), and an empty dns left out. A
// nil p is the NONE policy. p should be valid; a cidr that does not parse
// is kept as it is.
func Normalize(p *ctrlv1.NetworkPolicy) *ctrlv1.NetworkPolicy {
	out := &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}
	if p == nil {
		return out
	}
	out = proto.CloneOf(p)
	out.Revision = 0
	if out.GetMode() == ctrlv1.NetworkMode_NETWORK_MODE_UNSPECIFIED {
		out.Mode = ctrlv1.NetworkMode_NETWORK_MODE_NONE
	}
	canon := func(ds []*ctrlv1.Destination) {
		for _, d := range ds {
			if pr, err := netip.ParsePrefix(d.GetCidr()); err == nil {
				d.Cidr = pr.String()
			}
		}
	}
	canon(out.GetAllow())
	canon(out.GetDeny())
	for _, r := range out.GetEgresses() {
		canon(r.GetDestinations())
	}
	if out.GetDns().GetResolverId() == "" && out.GetDns().GetViaEgressId() == "" {
		out.Dns = nil
	}
	return out
}

// Equal reports whether a and b say the same: revisions are ignored, nil
// is NONE, UNSPECIFIED is NONE, an empty dns is no dns, and cidrs compare
// by value, not spelling. Order matters (the first matching route wins).
func Equal(a, b *ctrlv1.NetworkPolicy) bool {
	return proto.Equal(Normalize(a), Normalize(b))
}

// References returns the references p makes, each once, in a stable
// order: RefEgress for every route's Egress and for dns.via_egress_id,
// RefEgressUDP for dns.via_egress_id when the Resolver is udp
// (udpResolver, which the caller looked up), RefResolver for
// dns.resolver_id.
func References(p *ctrlv1.NetworkPolicy, udpResolver bool) []store.Reference {
	var out []store.Reference
	add := func(k store.RefKind, id string) {
		r := store.Reference{Kind: k, TargetID: id}
		if id != "" && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	for _, r := range p.GetEgresses() {
		add(store.RefEgress, r.GetEgressId())
	}
	dns := p.GetDns()
	add(store.RefEgress, dns.GetViaEgressId())
	if udpResolver {
		add(store.RefEgressUDP, dns.GetViaEgressId())
	}
	add(store.RefResolver, dns.GetResolverId())
	slices.SortFunc(out, func(x, y store.Reference) int {
		if c := strings.Compare(string(x.Kind), string(y.Kind)); c != 0 {
			return c
		}
		return strings.Compare(x.TargetID, y.TargetID)
	})
	return out
}
