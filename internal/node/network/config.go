package network

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/netip"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/netpolicy"
	"github.com/kibotos/kibotos/internal/socks5"
)

// maxCACert bounds an Egress's ca_cert (PEM), as the Egress service does.
const maxCACert = 64 << 10

// config is a compiled, valid NetworkConfig. It is immutable.
type config struct {
	policy      *netpolicy.Policy
	policyProto *ctrlv1.NetworkPolicy
	revision    uint64
	drain       time.Duration
	egresses    map[string]*egress
	egressOrder []string
	resolver    *resolver // nil: none
	dnsVia      string    // the Egress DNS goes through; "" direct
}

// egress is a compiled NetworkEgress.
type egress struct {
	id       string
	revision uint64
	drain    time.Duration
	address  string // host:port, checked syntax
	host     string
	client   socks5.Client
	tls      bool
	sni      string
	ca       []byte
	udp      bool
}

// resolver is a compiled NetworkResolver.
type resolver struct {
	id      string
	network string // "udp" or "tcp"
	address string // host:port, checked syntax
}

// errNotAdmitted: the policy refuses the destination. errNoEgress: the policy routes
// it through an Egress the configuration does not hold.
var (
	errNotAdmitted = errors.New("not admitted by the network policy")
	errNoEgress    = errors.New("routed through an egress the configuration does not hold")
)

// route is the path of a new connection to dst and its Egress (nil: direct).
func (c *config) route(dst netip.AddrPort) (path, *egress, error) {
	d := c.policy.Decide(dst)
	switch d.Verdict {
	case netpolicy.Direct:
		return path{}, nil, nil
	case netpolicy.ViaEgress:
		e := c.egresses[d.EgressID]
		if e == nil {
			return path{egress: d.EgressID}, nil, errNoEgress
		}
		return path{egress: e.id, revision: e.revision}, e, nil
	}
	return path{}, nil, errNotAdmitted
}

// compile checks and compiles nc; nil is mode NONE. Errors name the field of nc and
// never carry a password.
func compile(nc *nodev1.NetworkConfig) (*config, error) {
	pol, err := netpolicy.Compile(nc.GetPolicy())
	if err != nil {
		return nil, err
	}
	if s := nc.GetDrainSeconds(); s > MaxDrainSeconds {
		return nil, fault.Invalid("drain_seconds", "drain_seconds %d is more than %d", s, MaxDrainSeconds)
	}
	c := &config{
		policy:      pol,
		policyProto: nc.GetPolicy(),
		revision:    pol.Revision(),
		drain:       time.Duration(nc.GetDrainSeconds()) * time.Second,
		egresses:    make(map[string]*egress, len(nc.GetEgresses())),
		dnsVia:      nc.GetPolicy().GetDns().GetViaEgressId(),
	}
	for i, ne := range nc.GetEgresses() {
		field := fmt.Sprintf("egresses[%d]", i)
		e, err := compileEgress(field, ne)
		if err != nil {
			return nil, err
		}
		if c.egresses[e.id] != nil {
			return nil, fault.Invalid(field+".egress_id", "egress %s is listed twice", e.id)
		}
		c.egresses[e.id] = e
		c.egressOrder = append(c.egressOrder, e.id)
	}
	if nr := nc.GetResolver(); nr != nil {
		r, err := compileResolver(nr)
		if err != nil {
			return nil, err
		}
		c.resolver = r
	}
	return c, nil
}

func compileEgress(field string, ne *nodev1.NetworkEgress) (*egress, error) {
	if ne.GetEgressId() == "" {
		return nil, fault.Invalid(field+".egress_id", "egress_id is required")
	}
	if s := ne.GetDrainSeconds(); s > MaxDrainSeconds {
		return nil, fault.Invalid(field+".drain_seconds", "drain_seconds %d is more than %d", s, MaxDrainSeconds)
	}
	s5 := ne.GetSpec().GetSocks5()
	if s5 == nil {
		return nil, fault.Invalid(field+".spec", "egress %s has no socks5 endpoint", ne.GetEgressId())
	}
	host, _, err := netguard.ParseHostPort(field+".spec.socks5.address", s5.GetAddress())
	if err != nil {
		return nil, err
	}
	user, pass := s5.GetUsername(), s5.GetPassword()
	if user != "" || pass != "" {
		if len(user) == 0 || len(user) > socks5.MaxNameLen {
			return nil, fault.Invalid(field+".spec.socks5.username", "username must be 1 to %d bytes", socks5.MaxNameLen)
		}
		if len(pass) == 0 || len(pass) > socks5.MaxNameLen {
			return nil, fault.Invalid(field+".spec.socks5.password", "password must be 1 to %d bytes", socks5.MaxNameLen)
		}
	}
	e := &egress{
		id:       ne.GetEgressId(),
		revision: ne.GetRevision(),
		drain:    time.Duration(ne.GetDrainSeconds()) * time.Second,
		address:  s5.GetAddress(),
		host:     host,
		client:   socks5.Client{Username: user, Password: pass},
		udp:      ne.GetSpec().GetUdpEnabled(),
	}
	if t := s5.GetTls(); t != nil {
		e.tls = true
		e.sni = t.GetServerName()
		if e.sni == "" {
			e.sni = host
		}
		if ca := t.GetCaCert(); ca != "" {
			if len(ca) > maxCACert {
				return nil, fault.Invalid(field+".spec.socks5.tls.ca_cert", "ca_cert is more than %d bytes", maxCACert)
			}
			if !x509.NewCertPool().AppendCertsFromPEM([]byte(ca)) {
				return nil, fault.Invalid(field+".spec.socks5.tls.ca_cert", "ca_cert holds no PEM certificate")
			}
			e.ca = []byte(ca)
		}
	}
	return e, nil
}

func compileResolver(nr *nodev1.NetworkResolver) (*resolver, error) {
	r := &resolver{id: nr.GetResolverId()}
	switch {
	case nr.GetSpec().GetUdp() != nil:
		r.network, r.address = "udp", nr.GetSpec().GetUdp().GetAddress()
	case nr.GetSpec().GetTcp() != nil:
		r.network, r.address = "tcp", nr.GetSpec().GetTcp().GetAddress()
	default:
		return nil, fault.Invalid("resolver.spec", "resolver %s has neither a udp nor a tcp address", r.id)
	}
	if _, _, err := netguard.ParseHostPort("resolver.spec."+r.network+".address", r.address); err != nil {
		return nil, err
	}
	return r, nil
}
