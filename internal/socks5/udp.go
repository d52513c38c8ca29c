package socks5

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// maxUDPHeaderLen is the longest RFC 1928 UDP request header: RSV RSV FRAG and
// a domain address.
const maxUDPHeaderLen = 3 + 1 + 1 + MaxNameLen + 2

// parseUDP parses the header of a datagram from the relay: the fragment number,
// the address and the payload (a sub-slice of b).
func parseUDP(b []byte) (frag byte, a Addr, payload []byte, err error) {
	if len(b) < 3 {
		return 0, Addr{}, nil, fmt.Errorf("%w: short UDP header", ErrProtocol)
	}
	if b[0] != 0 || b[1] != 0 {
		return 0, Addr{}, nil, fmt.Errorf("%w: UDP header reserved bytes not zero", ErrProtocol)
	}
	a, n, err := parseAddr(b[3:])
	if err != nil {
		return 0, Addr{}, nil, err
	}
	return b[2], a, b[3+n:], nil
}

// appendUDP appends the header for dst (FRAG 0) and the payload.
func appendUDP(b []byte, dst Addr, payload []byte) ([]byte, error) {
	b, err := appendAddr(append(b, 0, 0, 0), dst)
	if err != nil {
		return nil, err
	}
	return append(b, payload...), nil
}

// Associate runs the handshake and a UDP ASSOCIATE over control (a connection
// to the proxy the caller dialed). The proxy names its relay; dial connects a
// UDP socket to it (the caller's place to check the address; a relay given as
// the unspecified address means the proxy's own address, control's remote IP).
// The returned PacketConn adds and strips the RFC 1928 UDP header. Its life is
// control's: it is closed when the proxy closes control, and closing it closes
// control.
func (c *Client) Associate(ctx context.Context, control net.Conn, dial func(ctx context.Context, relay netip.AddrPort) (net.Conn, error)) (*PacketConn, error) {
	var relay Addr
	err := c.withDeadline(ctx, control, func() error {
		if err := c.negotiate(control); err != nil {
			return err
		}
		var err error
		// 0.0.0.0:0: the client's UDP address is not known before the relay is.
		relay, err = request(control, cmdAssociate, Addr{IP: netip.IPv4Unspecified()})
		return err
	})
	if err != nil {
		return nil, err
	}
	ap, ok := relay.AddrPort()
	if !ok {
		return nil, fmt.Errorf("%w: UDP relay given as a host name", ErrProtocol)
	}
	if ap.Port() == 0 {
		return nil, fmt.Errorf("%w: UDP relay port 0", ErrProtocol)
	}
	if ap.Addr().IsUnspecified() {
		remote, err := netip.ParseAddrPort(control.RemoteAddr().String())
		if err != nil {
			return nil, fmt.Errorf("socks5: proxy address %q: %w", control.RemoteAddr(), err)
		}
		ap = netip.AddrPortFrom(remote.Addr().Unmap(), ap.Port())
	}
	udp, err := dial(ctx, ap)
	if err != nil {
		return nil, err
	}
	p := &PacketConn{control: control, udp: udp, relay: ap, done: make(chan struct{})}
	go p.watch()
	return p, nil
}

// PacketConn is a UDP association: datagrams to and from any destination
// through the proxy's relay. Fragmented datagrams (FRAG ≠ 0) and malformed ones
// are dropped. It implements net.PacketConn; addresses are Addr values (a
// *net.UDPAddr is accepted by WriteTo too).
type PacketConn struct {
	control net.Conn
	udp     net.Conn
	relay   netip.AddrPort

	rmu  sync.Mutex
	rbuf []byte
	wmu  sync.Mutex
	wbuf []byte

	once sync.Once
	done chan struct{}
}

// watch ties the association to the control connection: anything the proxy
// sends there is not part of the protocol, its close ends the association.
func (p *PacketConn) watch() {
	var b [64]byte
	for {
		if _, err := p.control.Read(b[:]); err != nil {
			p.Close()
			return
		}
	}
}

// Relay is the relay's address the datagrams go to.
func (p *PacketConn) Relay() netip.AddrPort { return p.relay }

// Done is closed when the association has ended.
func (p *PacketConn) Done() <-chan struct{} { return p.done }

// ReadFromAddr reads the next whole datagram of FRAG 0; n is the payload
// copied into b (a longer payload is truncated, like a UDP read).
func (p *PacketConn) ReadFromAddr(b []byte) (n int, src Addr, err error) {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	if p.rbuf == nil {
		p.rbuf = make([]byte, 65535)
	}
	for {
		m, err := p.udp.Read(p.rbuf)
		if err != nil {
			return 0, Addr{}, p.closedErr(err)
		}
		frag, a, payload, perr := parseUDP(p.rbuf[:m])
		if perr != nil || frag != 0 {
			continue // dropped: malformed or a fragment
		}
		return copy(b, payload), a, nil
	}
}

// ReadFrom implements net.PacketConn; addr is an Addr.
func (p *PacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := p.ReadFromAddr(b)
	if err != nil {
		return 0, nil, err
	}
	return n, a, nil
}

// WriteToAddr sends b to dst through the relay.
func (p *PacketConn) WriteToAddr(b []byte, dst Addr) (int, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	buf, err := appendUDP(p.wbuf[:0], dst, b)
	if err != nil {
		return 0, err
	}
	p.wbuf = buf
	if _, err := p.udp.Write(buf); err != nil {
		return 0, p.closedErr(err)
	}
	return len(b), nil
}

// WriteTo implements net.PacketConn for an Addr or a *net.UDPAddr.
func (p *PacketConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	switch a := addr.(type) {
	case Addr:
		return p.WriteToAddr(b, a)
	case *Addr:
		return p.WriteToAddr(b, *a)
	case *net.UDPAddr:
		return p.WriteToAddr(b, AddrFromAddrPort(a.AddrPort()))
	}
	return 0, fmt.Errorf("%w: address type %T", ErrInvalidRequest, addr)
}

func (p *PacketConn) closedErr(err error) error {
	select {
	case <-p.done:
		return net.ErrClosed
	default:
	}
	return err
}

// Close ends the association: the UDP socket and the control connection.
func (p *PacketConn) Close() error {
	var err error
	p.once.Do(func() {
		close(p.done)
		err = errors.Join(p.udp.Close(), p.control.Close())
		if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
			err = nil
		}
	})
	return err
}

// LocalAddr is the local address of the UDP socket.
func (p *PacketConn) LocalAddr() net.Addr { return p.udp.LocalAddr() }

// SetDeadline sets the UDP socket's deadlines.
func (p *PacketConn) SetDeadline(t time.Time) error { return p.udp.SetDeadline(t) }

// SetReadDeadline sets the UDP socket's read deadline.
func (p *PacketConn) SetReadDeadline(t time.Time) error { return p.udp.SetReadDeadline(t) }

// SetWriteDeadline sets the UDP socket's write deadline.
func (p *PacketConn) SetWriteDeadline(t time.Time) error { return p.udp.SetWriteDeadline(t) }

var _ net.PacketConn = (*PacketConn)(nil)
