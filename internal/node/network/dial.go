package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/kibotos/kibotos/internal/socks5"
)

// socket opens one of the node's sockets for the workspace to a checked literal,
// marked with Config.Mark.
func (n *Network) socket(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error) {
	if n.cfg.dial != nil {
		return n.cfg.dial(ctx, network, addr)
	}
	d := net.Dialer{}
	if n.cfg.Mark != 0 {
		d.Control = markControl(n.cfg.Mark)
	}
	return d.DialContext(ctx, network, addr.String())
}

// target is the destination dialed for dst (tests map stand-ins to loopback).
func (n *Network) target(dst netip.AddrPort) netip.AddrPort {
	if n.cfg.rewrite != nil {
		return n.cfg.rewrite(dst)
	}
	return dst
}

// dialDirect dials a destination decide has checked.
func (n *Network) dialDirect(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	return n.socket(ctx, "tcp", n.target(dst))
}

// dialEgress connects to dst through e: SOCKS5 CONNECT, inside TLS when e says so.
func (n *Network) dialEgress(ctx context.Context, e *egress, dst netip.AddrPort) (net.Conn, error) {
	c, err := n.proxy(ctx, e)
	if err != nil {
		return nil, err
	}
	cl := e.client
	if _, err := cl.Connect(ctx, c, socks5.AddrFromAddrPort(n.target(dst))); err != nil {
		c.Close()
		return nil, fmt.Errorf("egress %s: %w", e.id, err)
	}
	return c, nil
}

// proxy opens a connection to e's endpoint: its address resolved once, every address
// checked, the checked literals tried in order; then TLS when e has it.
func (n *Network) proxy(ctx context.Context, e *egress) (net.Conn, error) {
	addrs, err := n.checker.Resolve(ctx, "egress "+e.id+" address", e.address)
	if err != nil {
		return nil, err
	}
	var c net.Conn
	var firstErr error
	for _, a := range addrs {
		if c, err = n.socket(ctx, "tcp", a); err == nil {
			break
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if c == nil {
		if firstErr == nil {
			firstErr = errors.New("no address")
		}
		return nil, fmt.Errorf("egress %s: dialing its endpoint: %w", e.id, firstErr)
	}
	if !e.tls {
		return c, nil
	}
	tc, err := socks5.TLSClient(ctx, c, e.sni, e.ca)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("egress %s: %w", e.id, err)
	}
	return tc, nil
}
