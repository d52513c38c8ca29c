package netpolicy

import (
	"fmt"
	"net/netip"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// Verdict is what happens to a new connection.
type Verdict int

// Verdicts. The zero value refuses.
const (
	// Refuse: the connection is not admitted (a TCP RST at its SYN).
	Refuse Verdict = iota
	// Direct: the node dials the destination itself (through its checked
	// dialer, which still refuses special-purpose ranges).
	Direct
	// ViaEgress: the node connects through Decision.EgressID.
	ViaEgress
)

func (v Verdict) String() string {
	switch v {
	case Refuse:
		return "refuse"
	case Direct:
		return "direct"
	case ViaEgress:
		return "via egress"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Decision is the verdict on one destination.
type Decision struct {
	Verdict Verdict
	// EgressID is the Egress of a ViaEgress verdict, "" otherwise.
	EgressID string
}

// route is a compiled EgressRoute.
type route struct {
	egressID     string
	destinations []destination
}

// Policy is a compiled, valid policy; its methods never fail. A nil
// *Policy is NONE. It is immutable and safe for concurrent use.
type Policy struct {
	revision uint64
	mode     ctrlv1.NetworkMode
	allow    []destination
	deny     []destination
	routes   []route
}

// Compile validates p (field "network_policy") and compiles it. A nil p is
// NONE.
func Compile(p *ctrlv1.NetworkPolicy) (*Policy, error) {
	if err := Validate("network_policy", p); err != nil {
		return nil, err
	}
	out := &Policy{revision: p.GetRevision(), mode: p.GetMode()}
	if out.mode == ctrlv1.NetworkMode_NETWORK_MODE_UNSPECIFIED {
		out.mode = ctrlv1.NetworkMode_NETWORK_MODE_NONE
	}
	out.allow = mustList(p.GetAllow())
	out.deny = mustList(p.GetDeny())
	for _, r := range p.GetEgresses() {
		out.routes = append(out.routes, route{egressID: r.GetEgressId(), destinations: mustList(r.GetDestinations())})
	}
	return out, nil
}

// mustList parses destinations Validate accepted.
func mustList(ds []*ctrlv1.Destination) []destination {
	out := make([]destination, 0, len(ds))
	for _, d := range ds {
		pd, err := parseDestination("", d)
		if err != nil {
			panic("netpolicy: a validated destination does not parse: " + err.Error())
		}
		out = append(out, pd)
	}
	return out
}

// Mode is the policy's mode, NONE for UNSPECIFIED or a nil Policy.
func (p *Policy) Mode() ctrlv1.NetworkMode {
	if p == nil {
		return ctrlv1.NetworkMode_NETWORK_MODE_NONE
	}
	return p.mode
}

// Revision is the revision the compiled policy carried.
func (p *Policy) Revision() uint64 {
	if p == nil {
		return 0
	}
	return p.revision
}

// rules are the steps of Decide, so that a test can show each one decides
// something (TestRulesAreLoadBearing).
type rules uint8

const (
	ruleMode       rules = 1 << iota // mode other than PUBLIC_INTERNET refuses
	ruleDeny                         // a covering deny entry refuses
	ruleAllow                        // a non-empty allow that covers nothing refuses
	ruleFirstRoute                   // the first covering route wins (else the last)
	allRules       = ruleMode | ruleDeny | ruleAllow | ruleFirstRoute
)

// Decide returns the verdict on a new connection to dst (the package doc
// gives the rules). An IPv4-mapped IPv6 dst is decided as the IPv4 address
// it maps.
func (p *Policy) Decide(dst netip.AddrPort) Decision {
	return p.decide(dst, allRules)
}

func (p *Policy) decide(dst netip.AddrPort, r rules) Decision {
	if p == nil || !dst.Addr().IsValid() {
		return Decision{Verdict: Refuse}
	}
	if r&ruleMode != 0 && p.mode != ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET {
		return Decision{Verdict: Refuse}
	}
	a, port := dst.Addr().Unmap().WithZone(""), dst.Port()
	if r&ruleDeny != 0 && anyCovers(p.deny, a, port) {
		return Decision{Verdict: Refuse}
	}
	if r&ruleAllow != 0 && len(p.allow) > 0 && !anyCovers(p.allow, a, port) {
		return Decision{Verdict: Refuse}
	}
	found := -1
	for i, rt := range p.routes {
		if anyCovers(rt.destinations, a, port) {
			found = i
			if r&ruleFirstRoute != 0 {
				break
			}
		}
	}
	if found >= 0 {
		return Decision{Verdict: ViaEgress, EgressID: p.routes[found].egressID}
	}
	return Decision{Verdict: Direct}
}

func anyCovers(ds []destination, a netip.Addr, port uint16) bool {
	for _, d := range ds {
		if d.covers(a, port) {
			return true
		}
	}
	return false
}
