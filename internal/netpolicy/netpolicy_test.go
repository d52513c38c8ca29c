package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

const (
	public = ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET
	none   = ctrlv1.NetworkMode_NETWORK_MODE_NONE
	egA    = "eg-aaaaaaaaaaaaaaaaaaaa"
	egB    = "eg-bbbbbbbbbbbbbbbbbbbb"
	rsA    = "rs-aaaaaaaaaaaaaaaaaaaa"
)

// dst is a Destination: "cidr" or "cidr lo-hi".
func dst(s string) *ctrlv1.Destination {
	cidr, ports, ok := strings.Cut(s, " ")
	d := &ctrlv1.Destination{Cidr: cidr}
	if ok {
		_, _ = fmt.Sscanf(ports, "%d-%d", &d.PortMin, &d.PortMax)
	}
	return d
}

func dsts(ss ...string) []*ctrlv1.Destination {
	out := make([]*ctrlv1.Destination, len(ss))
	for i, s := range ss {
		out[i] = dst(s)
	}
	return out
}

func many(n int, cidr string) []*ctrlv1.Destination {
	out := make([]*ctrlv1.Destination, n)
	for i := range out {
		out[i] = dst(cidr)
	}
	return out
}

func routes(n int) []*ctrlv1.EgressRoute {
	out := make([]*ctrlv1.EgressRoute, n)
	for i := range out {
		out[i] = &ctrlv1.EgressRoute{EgressId: egA, Destinations: dsts("203.0.113.0/24")}
	}
	return out
}

// TestValidate: every syntax rule, each refusal with its kind and field.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		p     *ctrlv1.NetworkPolicy
		kind  fault.Kind // meaningful when field != ""
		field string     // "" when valid
	}{
		{"nil is NONE", nil, 0, ""},
		{"empty", &ctrlv1.NetworkPolicy{}, 0, ""},
		{"NONE", &ctrlv1.NetworkPolicy{Mode: none}, 0, ""},
		{"NONE keeps lists", &ctrlv1.NetworkPolicy{Mode: none, Allow: dsts("203.0.113.0/24")}, 0, ""},
		{"full", &ctrlv1.NetworkPolicy{Mode: public, Revision: 7,
			Allow:    dsts("0.0.0.0/0", "::/0 443-443"),
			Deny:     dsts("203.0.113.7/32 1-65535", "2001:db8::/32"),
			Egresses: []*ctrlv1.EgressRoute{{EgressId: egA, Destinations: dsts("198.51.100.0/24 80-80")}},
			Dns:      &ctrlv1.DnsConfig{ResolverId: rsA, ViaEgressId: egB}}, 0, ""},
		{"unknown mode", &ctrlv1.NetworkPolicy{Mode: 9}, fault.KindInvalidArgument, "network_policy.mode"},
		{"cidr missing", &ctrlv1.NetworkPolicy{Allow: dsts("")}, fault.KindInvalidArgument, "network_policy.allow[0].cidr"},
		{"cidr garbage", &ctrlv1.NetworkPolicy{Allow: dsts("10.0.0.0/8", "nope")}, fault.KindInvalidArgument, "network_policy.allow[1].cidr"},
		{"bare address", &ctrlv1.NetworkPolicy{Allow: dsts("203.0.113.7")}, fault.KindInvalidArgument, "network_policy.allow[0].cidr"},
		{"bits too long", &ctrlv1.NetworkPolicy{Allow: dsts("203.0.113.0/33")}, fault.KindInvalidArgument, "network_policy.allow[0].cidr"},
		{"octal spelling", &ctrlv1.NetworkPolicy{Deny: dsts("010.0.0.0/8")}, fault.KindInvalidArgument, "network_policy.deny[0].cidr"},
		{"host bits v4", &ctrlv1.NetworkPolicy{Deny: dsts("203.0.113.7/24")}, fault.KindInvalidArgument, "network_policy.deny[0].cidr"},
		{"host bits v6", &ctrlv1.NetworkPolicy{Deny: dsts("2001:db8::1/32")}, fault.KindInvalidArgument, "network_policy.deny[0].cidr"},
		{"zone", &ctrlv1.NetworkPolicy{Deny: dsts("fe80::%eth0/64")}, fault.KindInvalidArgument, "network_policy.deny[0].cidr"},
		{"v4-mapped", &ctrlv1.NetworkPolicy{Deny: dsts("::ffff:203.0.113.0/120")}, fault.KindInvalidArgument, "network_policy.deny[0].cidr"},
		{"v4-mapped short", &ctrlv1.NetworkPolicy{Deny: dsts("::ffff:0.0.0.0/80")}, fault.KindInvalidArgument, "network_policy.deny[0].cidr"},
		{"port_min 0 with a max", &ctrlv1.NetworkPolicy{Allow: dsts("0.0.0.0/0 0-80")}, fault.KindInvalidArgument, "network_policy.allow[0].port_min"},
		{"port_max 0 with a min", &ctrlv1.NetworkPolicy{Allow: dsts("0.0.0.0/0 80-0")}, fault.KindInvalidArgument, "network_policy.allow[0].port_max"},
		{"ports out of order", &ctrlv1.NetworkPolicy{Allow: dsts("0.0.0.0/0 443-80")}, fault.KindInvalidArgument, "network_policy.allow[0].port_max"},
		{"port_max too big", &ctrlv1.NetworkPolicy{Allow: dsts("0.0.0.0/0 1-65536")}, fault.KindInvalidArgument, "network_policy.allow[0].port_max"},
		{"port_min too big", &ctrlv1.NetworkPolicy{Allow: dsts("0.0.0.0/0 70000-70001")}, fault.KindInvalidArgument, "network_policy.allow[0].port_min"},
		{"one port", &ctrlv1.NetworkPolicy{Allow: dsts("0.0.0.0/0 65535-65535")}, 0, ""},
		{"allow at the limit", &ctrlv1.NetworkPolicy{Allow: many(MaxAllow, "10.0.0.0/8")}, 0, ""},
		{"allow past the limit", &ctrlv1.NetworkPolicy{Allow: many(MaxAllow+1, "10.0.0.0/8")}, fault.KindInvalidArgument, "network_policy.allow"},
		{"deny past the limit", &ctrlv1.NetworkPolicy{Deny: many(MaxDeny+1, "10.0.0.0/8")}, fault.KindInvalidArgument, "network_policy.deny"},
		{"routes at the limit", &ctrlv1.NetworkPolicy{Egresses: routes(MaxRoutes)}, 0, ""},
		{"routes past the limit", &ctrlv1.NetworkPolicy{Egresses: routes(MaxRoutes + 1)}, fault.KindInvalidArgument, "network_policy.egresses"},
		{"route destinations past the limit", &ctrlv1.NetworkPolicy{Egresses: []*ctrlv1.EgressRoute{{EgressId: egA, Destinations: many(MaxRouteDestinations+1, "::/0")}}},
			fault.KindInvalidArgument, "network_policy.egresses[0].destinations"},
		{"route without destinations", &ctrlv1.NetworkPolicy{Egresses: []*ctrlv1.EgressRoute{{EgressId: egA}}}, fault.KindInvalidArgument, "network_policy.egresses[0].destinations"},
		{"route destination bad", &ctrlv1.NetworkPolicy{Egresses: []*ctrlv1.EgressRoute{{EgressId: egA, Destinations: dsts("::/0", "1.2.3.4/8")}}},
			fault.KindInvalidArgument, "network_policy.egresses[0].destinations[1].cidr"},
		{"route without egress", &ctrlv1.NetworkPolicy{Egresses: []*ctrlv1.EgressRoute{{Destinations: dsts("::/0")}}}, fault.KindInvalidArgument, "network_policy.egresses[0].egress_id"},
		{"route egress of another kind", &ctrlv1.NetworkPolicy{Egresses: []*ctrlv1.EgressRoute{routes(1)[0], {EgressId: rsA, Destinations: dsts("::/0")}}},
			fault.KindNotFound, "network_policy.egresses[1].egress_id"},
		{"route egress too long", &ctrlv1.NetworkPolicy{Egresses: []*ctrlv1.EgressRoute{{EgressId: "eg-" + strings.Repeat("a", 80), Destinations: dsts("::/0")}}},
			fault.KindNotFound, "network_policy.egresses[0].egress_id"},
		{"resolver of another kind", &ctrlv1.NetworkPolicy{Dns: &ctrlv1.DnsConfig{ResolverId: egA}}, fault.KindNotFound, "network_policy.dns.resolver_id"},
		{"via egress of another kind", &ctrlv1.NetworkPolicy{Dns: &ctrlv1.DnsConfig{ResolverId: rsA, ViaEgressId: rsA}}, fault.KindNotFound, "network_policy.dns.via_egress_id"},
		{"via egress without resolver", &ctrlv1.NetworkPolicy{Dns: &ctrlv1.DnsConfig{ViaEgressId: egA}}, fault.KindInvalidArgument, "network_policy.dns.via_egress_id"},
		{"empty dns", &ctrlv1.NetworkPolicy{Dns: &ctrlv1.DnsConfig{}}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate("network_policy", tc.p)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want valid", err)
				}
				if _, err := Compile(tc.p); err != nil {
					t.Fatalf("Compile = %v after Validate accepted", err)
				}
				return
			}
			fe, ok := fault.As(err)
			if !ok || fe.Kind != tc.kind || fe.Field != tc.field {
				t.Fatalf("Validate = %v, want %v on %s", err, tc.kind, tc.field)
			}
			if _, err := Compile(tc.p); err == nil {
				t.Fatalf("Compile accepted what Validate refuses")
			}
		})
	}
}

// TestValidateMessages: refusals say how to fix the input.
func TestValidateMessages(t *testing.T) {
	for cidr, want := range map[string]string{
		"203.0.113.7/24":         "the prefix is 203.0.113.0/24",
		"::ffff:203.0.113.0/120": "write it as 203.0.113.0/24",
		"fe80::%eth0/64":         "zone",
	} {
		err := Validate("p", &ctrlv1.NetworkPolicy{Allow: dsts(cidr)})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate(%s) = %v, want a message with %q", cidr, err, want)
		}
	}
	long := strings.Repeat("x", 10000)
	if err := Validate("p", &ctrlv1.NetworkPolicy{Allow: dsts(long)}); err == nil || len(err.Error()) > 300 {
		t.Errorf("Validate(long cidr) = %d bytes of message, want a bounded one", len(err.Error()))
	}
}

// TestEqual: content equality; the revision, UNSPECIFIED versus NONE, nil
// versus empty, and the spelling of a cidr do not matter; anything else
// does.
func TestEqual(t *testing.T) {
	base := func() *ctrlv1.NetworkPolicy {
		return &ctrlv1.NetworkPolicy{Revision: 3, Mode: public, Allow: dsts("2001:db8::/32"),
			Egresses: []*ctrlv1.EgressRoute{{EgressId: egA, Destinations: dsts("203.0.113.0/24")}, {EgressId: egB, Destinations: dsts("::/0")}},
			Dns:      &ctrlv1.DnsConfig{ResolverId: rsA}}
	}
	for _, tc := range []struct {
		name string
		a, b *ctrlv1.NetworkPolicy
		want bool
	}{
		{"nil nil", nil, nil, true},
		{"nil empty", nil, &ctrlv1.NetworkPolicy{}, true},
		{"nil NONE", nil, &ctrlv1.NetworkPolicy{Mode: none, Revision: 4}, true},
		{"empty dns", &ctrlv1.NetworkPolicy{Dns: &ctrlv1.DnsConfig{}}, nil, true},
		{"nil public", nil, &ctrlv1.NetworkPolicy{Mode: public}, false},
		{"revision ignored", base(), func() *ctrlv1.NetworkPolicy { p := base(); p.Revision = 9; return p }(), true},
		{"cidr spelling", base(), func() *ctrlv1.NetworkPolicy { p := base(); p.Allow[0].Cidr = "2001:DB8:0::/32"; return p }(), true},
		{"cidr differs", base(), func() *ctrlv1.NetworkPolicy { p := base(); p.Allow[0].Cidr = "2001:db9::/32"; return p }(), false},
		{"ports differ", base(), func() *ctrlv1.NetworkPolicy { p := base(); p.Allow[0].PortMin, p.Allow[0].PortMax = 1, 65535; return p }(), false},
		{"route order", base(), func() *ctrlv1.NetworkPolicy {
			p := base()
			p.Egresses[0], p.Egresses[1] = p.Egresses[1], p.Egresses[0]
			return p
		}(), false},
		{"dns differs", base(), func() *ctrlv1.NetworkPolicy { p := base(); p.Dns.ViaEgressId = egA; return p }(), false},
		{"deny added", base(), func() *ctrlv1.NetworkPolicy { p := base(); p.Deny = dsts("0.0.0.0/0"); return p }(), false},
	} {
		if got := Equal(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: Equal = %v, want %v", tc.name, got, tc.want)
		}
		if got := Equal(tc.b, tc.a); got != tc.want {
			t.Errorf("%s: Equal (swapped) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNormalize: what ctrl stores, without touching its argument.
func TestNormalize(t *testing.T) {
	in := &ctrlv1.NetworkPolicy{Revision: 5, Allow: dsts("2001:DB8::/32 80-80"), Dns: &ctrlv1.DnsConfig{}}
	keep := proto.CloneOf(in)
	got := Normalize(in)
	want := &ctrlv1.NetworkPolicy{Mode: none, Allow: dsts("2001:db8::/32 80-80")}
	if !proto.Equal(got, want) {
		t.Errorf("Normalize = %v, want %v", got, want)
	}
	if !proto.Equal(in, keep) {
		t.Errorf("Normalize changed its argument: %v", in)
	}
	if got := Normalize(nil); !proto.Equal(got, &ctrlv1.NetworkPolicy{Mode: none}) {
		t.Errorf("Normalize(nil) = %v", got)
	}
}

// TestReferences: each target once per kind, udp only when asked, stable
// order.
func TestReferences(t *testing.T) {
	p := &ctrlv1.NetworkPolicy{Mode: public,
		Egresses: []*ctrlv1.EgressRoute{{EgressId: egB, Destinations: dsts("::/0")}, {EgressId: egA, Destinations: dsts("::/0")}, {EgressId: egB, Destinations: dsts("::/0")}},
		Dns:      &ctrlv1.DnsConfig{ResolverId: rsA, ViaEgressId: egA}}
	want := []store.Reference{{Kind: store.RefEgress, TargetID: egA}, {Kind: store.RefEgress, TargetID: egB}, {Kind: store.RefResolver, TargetID: rsA}}
	if got := References(p, false); !slices.Equal(got, want) {
		t.Errorf("References(tcp) = %v, want %v", got, want)
	}
	want = []store.Reference{{Kind: store.RefEgress, TargetID: egA}, {Kind: store.RefEgress, TargetID: egB},
		{Kind: store.RefEgressUDP, TargetID: egA}, {Kind: store.RefResolver, TargetID: rsA}}
	if got := References(p, true); !slices.Equal(got, want) {
		t.Errorf("References(udp) = %v, want %v", got, want)
	}
	if got := References(&ctrlv1.NetworkPolicy{Dns: &ctrlv1.DnsConfig{ResolverId: rsA}}, true); !slices.Equal(got, []store.Reference{{Kind: store.RefResolver, TargetID: rsA}}) {
		t.Errorf("References(resolver without via) = %v", got)
	}
	if got := References(nil, true); len(got) != 0 {
		t.Errorf("References(nil) = %v, want none", got)
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// decideCase is one destination and the decision it must get.
type decideCase struct {
	name string
	p    *ctrlv1.NetworkPolicy
	dst  string
	want Decision
}

var (
	refuse = Decision{Verdict: Refuse}
	direct = Decision{Verdict: Direct}
	viaA   = Decision{Verdict: ViaEgress, EgressID: egA}
	viaB   = Decision{Verdict: ViaEgress, EgressID: egB}
)

func decideCases() []decideCase {
	open := &ctrlv1.NetworkPolicy{Mode: public}
	allowWeb := &ctrlv1.NetworkPolicy{Mode: public, Allow: dsts("203.0.113.0/24 80-80", "2001:db8::/32 443-443")}
	denyWins := &ctrlv1.NetworkPolicy{Mode: public, Allow: dsts("203.0.113.0/24"), Deny: dsts("203.0.113.128/25 22-22")}
	twoRoutes := &ctrlv1.NetworkPolicy{Mode: public, Egresses: []*ctrlv1.EgressRoute{
		{EgressId: egA, Destinations: dsts("198.51.100.0/24 443-443")},
		{EgressId: egB, Destinations: dsts("198.51.100.0/24", "2001:db8::/32")},
	}}
	routeAndDeny := &ctrlv1.NetworkPolicy{Mode: public, Allow: dsts("198.51.100.0/24"), Deny: dsts("198.51.100.66/32"),
		Egresses: []*ctrlv1.EgressRoute{{EgressId: egA, Destinations: dsts("0.0.0.0/0")}}}
	return []decideCase{
		{"NONE refuses", &ctrlv1.NetworkPolicy{Mode: none, Allow: dsts("0.0.0.0/0")}, "203.0.113.1:80", refuse},
		{"UNSPECIFIED is NONE", &ctrlv1.NetworkPolicy{}, "203.0.113.1:80", refuse},
		{"nil is NONE", nil, "203.0.113.1:80", refuse},
		{"public admits", open, "203.0.113.1:80", direct},
		{"public admits v6", open, "[2001:db8::1]:443", direct},
		{"allow admits", allowWeb, "203.0.113.9:80", direct},
		{"allow-only: other port", allowWeb, "203.0.113.9:81", refuse},
		{"allow-only: other address", allowWeb, "198.51.100.1:80", refuse},
		{"allow v6", allowWeb, "[2001:db8::5]:443", direct},
		{"allow v4-mapped dst", allowWeb, "[::ffff:203.0.113.9]:80", direct},
		{"deny wins", denyWins, "203.0.113.200:22", refuse},
		{"deny port only", denyWins, "203.0.113.200:23", direct},
		{"deny outside", denyWins, "203.0.113.1:22", direct},
		{"deny v4-mapped dst", denyWins, "[::ffff:203.0.113.200]:22", refuse},
		{"first route wins", twoRoutes, "198.51.100.7:443", viaA},
		{"second route", twoRoutes, "198.51.100.7:80", viaB},
		{"second route v6", twoRoutes, "[2001:db8::9]:22", viaB},
		{"no route", twoRoutes, "203.0.113.1:443", direct},
		{"v6 prefix never covers v4", &ctrlv1.NetworkPolicy{Mode: public, Allow: dsts("::/0")}, "203.0.113.1:80", refuse},
		{"v4 prefix never covers v6", &ctrlv1.NetworkPolicy{Mode: public, Allow: dsts("0.0.0.0/0")}, "[2001:db8::1]:80", refuse},
		{"route under allow", routeAndDeny, "198.51.100.7:443", viaA},
		{"route does not admit past allow", routeAndDeny, "203.0.113.1:443", refuse},
		{"route does not admit past deny", routeAndDeny, "198.51.100.66:443", refuse},
		{"zoned dst", open, "[fe80::1%eth0]:80", direct},
	}
}

// TestDecide: the verdict on destinations under each rule.
func TestDecide(t *testing.T) {
	for _, tc := range decideCases() {
		pol, err := Compile(tc.p)
		if err != nil {
			t.Fatalf("%s: Compile = %v", tc.name, err)
		}
		if got := pol.Decide(ap(tc.dst)); got != tc.want {
			t.Errorf("%s: Decide(%s) = %+v, want %+v", tc.name, tc.dst, got, tc.want)
		}
	}
	var nilPolicy *Policy
	if got := nilPolicy.Decide(ap("203.0.113.1:80")); got != refuse {
		t.Errorf("nil Policy: Decide = %+v, want refuse", got)
	}
	pol, _ := Compile(&ctrlv1.NetworkPolicy{Mode: public})
	if got := pol.Decide(netip.AddrPort{}); got != refuse {
		t.Errorf("Decide(invalid address) = %+v, want refuse", got)
	}
}

// TestRulesAreLoadBearing: the table of TestDecide fails when any one rule
// of Decide is left out (the last matching route winning instead of the
// first, deny ignored, allow ignored, mode ignored), so the table really
// tests each rule.
func TestRulesAreLoadBearing(t *testing.T) {
	for _, rule := range []struct {
		name string
		r    rules
	}{{"mode", ruleMode}, {"deny wins", ruleDeny}, {"allow only", ruleAllow}, {"first route", ruleFirstRoute}} {
		failed := 0
		for _, tc := range decideCases() {
			pol, err := Compile(tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if pol.decide(ap(tc.dst), allRules&^rule.r) != tc.want {
				failed++
			}
		}
		if failed == 0 {
			t.Errorf("without the %s rule every case still passes: the table does not test it", rule.name)
		}
	}
}

// TestPolicyAccessors: Mode and Revision of compiled policies.
func TestPolicyAccessors(t *testing.T) {
	pol, err := Compile(&ctrlv1.NetworkPolicy{Revision: 4})
	if err != nil {
		t.Fatal(err)
	}
	if pol.Mode() != none || pol.Revision() != 4 {
		t.Errorf("Compile(UNSPECIFIED, rev 4): Mode = %v, Revision = %d", pol.Mode(), pol.Revision())
	}
	var nilPolicy *Policy
	if nilPolicy.Mode() != none || nilPolicy.Revision() != 0 {
		t.Errorf("nil Policy: Mode = %v, Revision = %d", nilPolicy.Mode(), nilPolicy.Revision())
	}
	for v, want := range map[Verdict]string{Refuse: "refuse", Direct: "direct", ViaEgress: "via egress", 7: "Verdict(7)"} {
		if v.String() != want {
			t.Errorf("Verdict(%d).String() = %q, want %q", int(v), v.String(), want)
		}
	}
}
