package netguard

import (
	"context"
	"net"
)

// Dialer dials host:port endpoints through a Checker: it calls Resolve once
// and then dials only the checked literal addresses, each tried in order
// with Dialer until one connects.
type Dialer struct {
	// Checker validates and resolves the endpoint; nil means a zero Checker
	// (no allow-list, net.DefaultResolver).
	Checker *Checker
	// Dialer makes the connections. Its own Resolver is never consulted,
	// since only IP literals are dialed.
	Dialer net.Dialer
	// DialFunc, when set, makes the connections instead of Dialer (a
	// user-space network stack, or a test recording what would be dialed).
	// It is called only with a checked literal "ip:port" or "[ip]:port",
	// never with a name.
	DialFunc func(ctx context.Context, network, address string) (net.Conn, error)
}

// DialContext connects to hostport on network, which must be one of "tcp",
// "tcp4", "tcp6", "udp", "udp4" or "udp6". Endpoint failures are the
// *fault.Error values of Checker.Resolve (the field is "address"). Addresses
// of the wrong family for a tcp4/tcp6/udp4/udp6 network are skipped; when
// none is left the result is a *net.AddrError. When every dial fails the
// error of the first attempt is returned.
func (d *Dialer) DialContext(ctx context.Context, network, hostport string) (net.Conn, error) {
	var want4, want6 bool
	switch network {
	case "tcp", "udp":
		want4, want6 = true, true
	case "tcp4", "udp4":
		want4 = true
	case "tcp6", "udp6":
		want6 = true
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: net.UnknownNetworkError(network)}
	}
	addrs, err := d.Checker.Resolve(ctx, "address", hostport)
	if err != nil {
		return nil, err
	}
	var firstErr error
	tried := false
	for _, ap := range addrs {
		if a := ap.Addr(); a.Is4() && !want4 || a.Is6() && !want6 {
			continue
		}
		tried = true
		var conn net.Conn
		var err error
		if d.DialFunc != nil {
			conn, err = d.DialFunc(ctx, network, ap.String())
		} else {
			conn, err = d.Dialer.DialContext(ctx, network, ap.String())
		}
		if err == nil {
			return conn, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if !tried {
		return nil, &net.OpError{Op: "dial", Net: network,
			Err: &net.AddrError{Err: "no suitable address found", Addr: hostport}}
	}
	return nil, firstErr
}

// Compile-time check that *net.Resolver satisfies Resolver.
var _ Resolver = (*net.Resolver)(nil)
