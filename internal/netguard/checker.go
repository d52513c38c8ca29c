package netguard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/fault"
)

// ResolveTimeout bounds a name resolution when the caller's context has no
// deadline.
const ResolveTimeout = 5 * time.Second

// Resolver looks up the addresses of a host name. *net.Resolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Checker decides whether endpoints may be dialed. The zero value (and a nil
// *Checker) forbids every special-purpose address and resolves names with
// net.DefaultResolver.
type Checker struct {
	// Allow is the operator allow-list: addresses inside any of these
	// prefixes are permitted even when special-purpose. Addresses are
	// unmapped before matching, so IPv4 ranges must be written as IPv4
	// (ParseAllowList does this for ::ffff:a.b.c.d/n entries). Default none.
	Allow []netip.Prefix
	// Resolver resolves host names; nil means net.DefaultResolver.
	Resolver Resolver
}

// ParseAllowList parses a comma-separated list of CIDR prefixes and single
// addresses (taken as /32 or /128), as given in an operator flag. Spaces
// around entries are ignored; an empty or all-space string is an empty
// list. Prefixes must have no host bits set, zones are rejected, and
// IPv4-mapped entries (::ffff:a.b.c.d or ::ffff:a.b.c.d/n with n >= 96) are
// converted to their IPv4 form. Errors are invalid_argument naming the
// offending entry.
func ParseAllowList(s string) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			return nil, fault.Invalid("", "allow-list has an empty entry")
		}
		var p netip.Prefix
		if strings.IndexByte(entry, '/') >= 0 {
			var err error
			p, err = netip.ParsePrefix(entry)
			if err != nil {
				return nil, fault.Invalid("", "allow-list entry %s is not a valid CIDR prefix", echo(entry))
			}
			if p.Masked() != p {
				return nil, fault.Invalid("", "allow-list entry %s has host bits set; did you mean %s?", echo(entry), p.Masked())
			}
		} else {
			a, err := netip.ParseAddr(entry)
			if err != nil || a.Zone() != "" {
				return nil, fault.Invalid("", "allow-list entry %s is not a valid IP address or CIDR prefix", echo(entry))
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, unmapPrefix(p))
	}
	return out, nil
}

// unmapPrefix turns an IPv4-mapped IPv6 prefix of at least /96 into the
// equivalent IPv4 prefix; other prefixes are returned masked.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96).Masked()
	}
	return p.Masked()
}

// forbidden reports the special-purpose range of a valid addr when it is
// not allow-listed. Matching uses the unmapped address without zone.
func (c *Checker) forbidden(addr netip.Addr) (Range, bool) {
	r, special := Classify(addr)
	if !special {
		return Range{}, false
	}
	if c != nil {
		a := addr.Unmap().WithZone("")
		for _, p := range c.Allow {
			if unmapPrefix(p).Contains(a) {
				return Range{}, false
			}
		}
	}
	return r, true
}

// CheckAddr returns nil when addr may be dialed: it is not special-purpose
// (see Classify), or it is inside the allow-list. addr is unmapped first and
// its zone ignored. A forbidden address is invalid_argument with Reason
// ENDPOINT_FORBIDDEN on field; the zero Addr is invalid_argument.
func (c *Checker) CheckAddr(field string, addr netip.Addr) error {
	if !addr.IsValid() {
		return fault.Invalid(field, "invalid IP address")
	}
	r, forbidden := c.forbidden(addr)
	if !forbidden {
		return nil
	}
	return fault.InvalidReason(fault.ReasonEndpointForbidden, field,
		"%s is a special-purpose address (%s, %s, %s) and may not be used as an endpoint",
		addr, r.Name, r.Prefix, r.Ref)
}

// CheckEndpoint validates hostport with ParseHostPort and checks that it may
// be dialed: a literal with CheckAddr, a name by resolving it once and
// checking every address returned (one forbidden address rejects the
// endpoint). Failures are as documented on Resolve.
func (c *Checker) CheckEndpoint(ctx context.Context, field, hostport string) error {
	_, err := c.Resolve(ctx, field, hostport)
	return err
}

// Resolve is the dial-time form of CheckEndpoint. It resolves hostport once,
// checks every address and returns the checked addresses (unmapped, without
// zone, in the resolver's order, duplicates removed) with the port, so that
// the caller dials exactly these and a second resolution cannot rebind the
// name. A name that IsLocalhost is not resolved: it stands for 127.0.0.1 and
// ::1, and Resolve returns those of the two that are allow-listed; with
// neither allow-listed (the default) it is forbidden.
//
// Failures, all *fault.Error on field:
//   - malformed hostport: invalid_argument (INVALID_ARGUMENT);
//   - a literal or any resolved address that is special-purpose and not
//     allow-listed: invalid_argument (ENDPOINT_FORBIDDEN). For names the
//     message does not repeat the resolved addresses;
//   - a name that does not exist (DNS "not found") or has no addresses:
//     invalid_argument (INVALID_ARGUMENT);
//   - any other resolution failure (timeout, temporary DNS failure,
//     cancelled context, ...): unavailable (UNAVAILABLE), retryable.
//
// If ctx has no deadline, resolution is bounded by ResolveTimeout.
func (c *Checker) Resolve(ctx context.Context, field, hostport string) ([]netip.AddrPort, error) {
	host, port, err := ParseHostPort(field, hostport)
	if err != nil {
		return nil, err
	}
	if a, perr := netip.ParseAddr(host); perr == nil {
		if err := c.CheckAddr(field, a); err != nil {
			return nil, err
		}
		return []netip.AddrPort{netip.AddrPortFrom(a.Unmap(), port)}, nil
	}

	if IsLocalhost(host) {
		// RFC 6761 §6.3: localhost names are loopback, whatever a DNS
		// server (asked for "localhost." or "x.localhost") would answer.
		var out []netip.AddrPort
		for _, a := range localhostAddrs {
			if _, forbidden := c.forbidden(a); !forbidden {
				out = append(out, netip.AddrPortFrom(a, port))
			}
		}
		if len(out) == 0 {
			return nil, fault.InvalidReason(fault.ReasonEndpointForbidden, field,
				"host %s is a loopback name and may not be used as an endpoint", echo(host))
		}
		return out, nil
	}

	var r Resolver = net.DefaultResolver
	if c != nil && c.Resolver != nil {
		r = c.Resolver
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ResolveTimeout)
		defer cancel()
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound && !dnsErr.IsTemporary && !dnsErr.IsTimeout {
			return nil, fault.Invalid(field, "host %s does not resolve", echo(host))
		}
		e := fault.Unavailable(fault.ReasonUnavailable, "resolving host %s failed temporarily; try again later", echo(host))
		e.Field = field
		return nil, e
	}
	if len(addrs) == 0 {
		return nil, fault.Invalid(field, "host %s does not resolve to any address", echo(host))
	}
	out := make([]netip.AddrPort, 0, len(addrs))
	seen := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		if !a.IsValid() {
			return nil, fault.Invalid(field, "host %s resolves to an invalid address", echo(host))
		}
		if _, forbidden := c.forbidden(a); forbidden {
			return nil, fault.InvalidReason(fault.ReasonEndpointForbidden, field,
				"host %s resolves to a special-purpose address and may not be used as an endpoint", echo(host))
		}
		a = a.Unmap().WithZone("") // dial exactly the literal that was checked
		if !seen[a] {
			seen[a] = true
			out = append(out, netip.AddrPortFrom(a, port))
		}
	}
	return out, nil
}

// localhostAddrs are the addresses a localhost name stands for.
var localhostAddrs = [2]netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}

// IsLocalhost reports whether the DNS name host is "localhost" or a name
// under it, in any letter case, with or without a trailing dot. RFC 6761
// §6.3 reserves these names for loopback; Resolve does not ask a resolver
// about them, since a DNS server asked for "localhost." or
// "app.localhost" may answer anything, while local resolvers (/etc/hosts,
// systemd-resolved, browsers) answer loopback.
func IsLocalhost(host string) bool {
	h := strings.TrimSuffix(host, ".")
	const l = "localhost"
	return strings.EqualFold(h, l) ||
		len(h) > len(l)+1 && h[len(h)-len(l)-1] == '.' && strings.EqualFold(h[len(h)-len(l):], l)
}
