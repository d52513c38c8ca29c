// Package socks5 is a protocol-only SOCKS5 client: RFC 1928 method negotiation,
// CONNECT and UDP ASSOCIATE, RFC 1929 username/password, and a helper for
// SOCKS5 inside TLS.
//
// It never dials anything by itself: the caller dials the proxy (and, for UDP
// ASSOCIATE, the relay the proxy names), so that policy and dial-time checks of
// the addresses stay with the caller. Every read of a reply is bounded by the
// protocol's own sizes and by a deadline taken from the context (or Timeout).
// No error carries the password.
package socks5

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// Protocol constants of RFC 1928 and RFC 1929.
const (
	version5      = 0x05
	authVersion   = 0x01
	methodNone    = 0x00
	methodUserPwd = 0x02
	methodNoMatch = 0xff

	cmdConnect   = 0x01
	cmdAssociate = 0x03

	atypIPv4   = 0x01
	atypDomain = 0x03
	atypIPv6   = 0x04

	// MaxNameLen is the longest host name (and the longest username or
	// password) the protocol can carry: one length byte.
	MaxNameLen = 255
)

// DefaultTimeout bounds a handshake whose context has no deadline and whose
// Client sets no Timeout.
const DefaultTimeout = 30 * time.Second

// Errors of the handshake. Replies other than success are ReplyError values.
var (
	// ErrNoAcceptableMethod: the proxy accepted none of the offered methods.
	ErrNoAcceptableMethod = errors.New("socks5: proxy accepted no offered authentication method")
	// ErrAuthFailed: the proxy refused the username/password.
	ErrAuthFailed = errors.New("socks5: proxy refused the credentials")
	// ErrProtocol: the proxy's reply is not valid SOCKS5.
	ErrProtocol = errors.New("socks5: malformed reply from proxy")
	// ErrInvalidRequest: the request cannot be encoded (name or credential too long, no port...).
	ErrInvalidRequest = errors.New("socks5: invalid request")
)

// ReplyError is a non-success reply code of a CONNECT or UDP ASSOCIATE
// request (RFC 1928 §6). Compare with errors.Is against the Err* constants.
type ReplyError byte

// The reply codes of RFC 1928.
const (
	ErrGeneralFailure          ReplyError = 0x01
	ErrNotAllowed              ReplyError = 0x02
	ErrNetworkUnreachable      ReplyError = 0x03
	ErrHostUnreachable         ReplyError = 0x04
	ErrConnectionRefused       ReplyError = 0x05
	ErrTTLExpired              ReplyError = 0x06
	ErrCommandNotSupported     ReplyError = 0x07
	ErrAddressTypeNotSupported ReplyError = 0x08
)

func (e ReplyError) Error() string {
	var s string
	switch e {
	case ErrGeneralFailure:
		s = "general failure"
	case ErrNotAllowed:
		s = "connection not allowed by ruleset"
	case ErrNetworkUnreachable:
		s = "network unreachable"
	case ErrHostUnreachable:
		s = "host unreachable"
	case ErrConnectionRefused:
		s = "connection refused"
	case ErrTTLExpired:
		s = "TTL expired"
	case ErrCommandNotSupported:
		s = "command not supported"
	case ErrAddressTypeNotSupported:
		s = "address type not supported"
	default:
		s = "unassigned reply code 0x" + strconv.FormatUint(uint64(e), 16)
	}
	return "socks5: proxy replied: " + s
}

// Addr is a SOCKS5 address: an IP address or a host name, with a port.
// It implements net.Addr (network "socks5").
type Addr struct {
	IP   netip.Addr // valid for an address
	Name string     // set for a host name (then IP is the zero Addr)
	Port uint16
}

// AddrFromAddrPort is the Addr of an IP address and port.
func AddrFromAddrPort(ap netip.AddrPort) Addr {
	return Addr{IP: ap.Addr().Unmap(), Port: ap.Port()}
}

// HostAddr is the Addr of a host name or IP literal and a port.
func HostAddr(host string, port uint16) Addr {
	if ip, err := netip.ParseAddr(host); err == nil {
		return Addr{IP: ip.Unmap(), Port: port}
	}
	return Addr{Name: host, Port: port}
}

// Network implements net.Addr.
func (a Addr) Network() string { return "socks5" }

// String is host:port.
func (a Addr) String() string {
	host := a.Name
	if a.IP.IsValid() {
		host = a.IP.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(int(a.Port)))
}

// AddrPort is the IP address and port, ok false for a host name.
func (a Addr) AddrPort() (netip.AddrPort, bool) {
	if !a.IP.IsValid() {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a.IP, a.Port), true
}

// appendAddr appends ATYP, ADDR and PORT.
func appendAddr(b []byte, a Addr) ([]byte, error) {
	switch {
	case a.IP.IsValid() && a.Name != "":
		return nil, fmt.Errorf("%w: address has both an IP and a name", ErrInvalidRequest)
	case a.IP.Is4():
		ip := a.IP.As4()
		b = append(b, atypIPv4)
		b = append(b, ip[:]...)
	case a.IP.Is6():
		if a.IP.Zone() != "" {
			return nil, fmt.Errorf("%w: IPv6 zone not representable", ErrInvalidRequest)
		}
		ip := a.IP.As16()
		b = append(b, atypIPv6)
		b = append(b, ip[:]...)
	case a.Name != "":
		if len(a.Name) > MaxNameLen {
			return nil, fmt.Errorf("%w: host name longer than %d bytes", ErrInvalidRequest, MaxNameLen)
		}
		b = append(b, atypDomain, byte(len(a.Name)))
		b = append(b, a.Name...)
	default:
		return nil, fmt.Errorf("%w: empty address", ErrInvalidRequest)
	}
	return append(b, byte(a.Port>>8), byte(a.Port)), nil
}

// addrLen is the number of bytes of an address (ATYP to PORT included) whose
// first two bytes are b[0] (ATYP) and b[1]; 0 when the type is unknown.
func addrLen(atyp, first byte) int {
	switch atyp {
	case atypIPv4:
		return 1 + 4 + 2
	case atypIPv6:
		return 1 + 16 + 2
	case atypDomain:
		return 1 + 1 + int(first) + 2
	}
	return 0
}

// parseAddr parses ATYP, ADDR and PORT at the start of b; n is its length.
func parseAddr(b []byte) (a Addr, n int, err error) {
	if len(b) < 2 {
		return Addr{}, 0, fmt.Errorf("%w: short address", ErrProtocol)
	}
	n = addrLen(b[0], b[1])
	if n == 0 {
		return Addr{}, 0, fmt.Errorf("%w: unknown address type 0x%02x", ErrProtocol, b[0])
	}
	if len(b) < n {
		return Addr{}, 0, fmt.Errorf("%w: short address", ErrProtocol)
	}
	switch b[0] {
	case atypIPv4:
		a.IP = netip.AddrFrom4([4]byte(b[1:5]))
	case atypIPv6:
		a.IP = netip.AddrFrom16([16]byte(b[1:17]))
	case atypDomain:
		if b[1] == 0 {
			return Addr{}, 0, fmt.Errorf("%w: empty host name", ErrProtocol)
		}
		a.Name = string(b[2 : 2+int(b[1])])
	}
	a.Port = uint16(b[n-2])<<8 | uint16(b[n-1])
	return a, n, nil
}

// maxReplyLen is the longest CONNECT/ASSOCIATE reply: VER REP RSV, a domain
// address of 255 bytes, the port.
const maxReplyLen = 3 + 1 + 1 + MaxNameLen + 2

// parseReply parses a complete reply to CONNECT or UDP ASSOCIATE (the one
// parser of replies): the bound address on success, a ReplyError for a
// refusal, ErrProtocol for anything malformed. b must hold exactly one reply.
func parseReply(b []byte) (Addr, error) {
	if len(b) < 3 {
		return Addr{}, fmt.Errorf("%w: short reply", ErrProtocol)
	}
	if b[0] != version5 {
		return Addr{}, fmt.Errorf("%w: version 0x%02x", ErrProtocol, b[0])
	}
	if b[1] != 0 {
		return Addr{}, ReplyError(b[1])
	}
	a, n, err := parseAddr(b[3:])
	if err != nil {
		return Addr{}, err
	}
	if 3+n != len(b) {
		return Addr{}, fmt.Errorf("%w: reply of %d bytes, want %d", ErrProtocol, len(b), 3+n)
	}
	return a, nil
}

// readReply reads exactly one reply from r, never more than maxReplyLen bytes.
func readReply(r io.Reader) (Addr, error) {
	var buf [maxReplyLen]byte
	// VER REP RSV ATYP and the first address byte say how long the rest is.
	if _, err := io.ReadFull(r, buf[:5]); err != nil {
		if buf[0] == version5 && buf[1] != 0 {
			return Addr{}, ReplyError(buf[1]) // refused, then closed early
		}
		return Addr{}, readErr(err)
	}
	if buf[0] != version5 {
		return Addr{}, fmt.Errorf("%w: version 0x%02x", ErrProtocol, buf[0])
	}
	if buf[1] != 0 {
		return Addr{}, ReplyError(buf[1])
	}
	n := addrLen(buf[3], buf[4])
	if n == 0 {
		return Addr{}, fmt.Errorf("%w: unknown address type 0x%02x", ErrProtocol, buf[3])
	}
	if _, err := io.ReadFull(r, buf[5:3+n]); err != nil {
		return Addr{}, readErr(err)
	}
	return parseReply(buf[:3+n])
}

func readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: connection closed mid-reply", ErrProtocol)
	}
	return fmt.Errorf("socks5: reading reply: %w", err)
}

// Client holds what every request to one proxy needs.
type Client struct {
	// Username and Password for RFC 1929; both empty offers only "no
	// authentication". Each 1..255 bytes when set.
	Username string
	Password string
	// Timeout bounds a handshake when the context has no earlier deadline;
	// zero means DefaultTimeout.
	Timeout time.Duration
}

// Connect runs the handshake and a CONNECT to dst over conn (a connection to
// the proxy the caller dialed) and returns the address the proxy bound for it.
// On success conn carries the destination's bytes; on error the caller closes it.
func (c *Client) Connect(ctx context.Context, conn net.Conn, dst Addr) (Addr, error) {
	var bound Addr
	err := c.withDeadline(ctx, conn, func() error {
		if err := c.negotiate(conn); err != nil {
			return err
		}
		var err error
		bound, err = request(conn, cmdConnect, dst)
		return err
	})
	return bound, err
}

// request sends one request and reads its reply.
func request(conn net.Conn, cmd byte, dst Addr) (Addr, error) {
	b, err := appendAddr([]byte{version5, cmd, 0}, dst)
	if err != nil {
		return Addr{}, err
	}
	if _, err := conn.Write(b); err != nil {
		return Addr{}, fmt.Errorf("socks5: writing request: %w", err)
	}
	return readReply(conn)
}

// negotiate offers the methods and authenticates.
func (c *Client) negotiate(conn net.Conn) error {
	auth := c.Username != "" || c.Password != ""
	if auth {
		if len(c.Username) == 0 || len(c.Username) > MaxNameLen {
			return fmt.Errorf("%w: username must be 1 to %d bytes", ErrInvalidRequest, MaxNameLen)
		}
		if len(c.Password) == 0 || len(c.Password) > MaxNameLen {
			return fmt.Errorf("%w: password must be 1 to %d bytes", ErrInvalidRequest, MaxNameLen)
		}
	}
	hello := []byte{version5, 1, methodNone}
	if auth {
		hello = []byte{version5, 2, methodNone, methodUserPwd}
	}
	if _, err := conn.Write(hello); err != nil {
		return fmt.Errorf("socks5: writing greeting: %w", err)
	}
	var sel [2]byte
	if _, err := io.ReadFull(conn, sel[:]); err != nil {
		return readErr(err)
	}
	if sel[0] != version5 {
		return fmt.Errorf("%w: version 0x%02x", ErrProtocol, sel[0])
	}
	switch {
	case sel[1] == methodNone:
		return nil
	case sel[1] == methodUserPwd && auth:
	case sel[1] == methodNoMatch:
		return ErrNoAcceptableMethod
	default:
		return fmt.Errorf("%w: proxy chose method 0x%02x that was not offered", ErrProtocol, sel[1])
	}
	req := make([]byte, 0, 3+len(c.Username)+len(c.Password))
	req = append(req, authVersion, byte(len(c.Username)))
	req = append(req, c.Username...)
	req = append(req, byte(len(c.Password)))
	req = append(req, c.Password...)
	_, err := conn.Write(req)
	clear(req)
	if err != nil {
		return fmt.Errorf("socks5: writing credentials: %w", err)
	}
	var st [2]byte
	if _, err := io.ReadFull(conn, st[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return ErrAuthFailed // some proxies close without a status
		}
		return readErr(err)
	}
	if st[0] != authVersion {
		return fmt.Errorf("%w: authentication version 0x%02x", ErrProtocol, st[0])
	}
	if st[1] != 0 {
		return ErrAuthFailed
	}
	return nil
}

// withDeadline runs f with conn's deadline set from ctx (or the timeout) and
// cancellation of ctx interrupting it; the deadline is cleared afterwards.
func (c *Client) withDeadline(ctx context.Context, conn net.Conn, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return fmt.Errorf("socks5: setting deadline: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	err := f()
	if !stop() {
		// ctx ended while f ran: report that rather than the i/o timeout.
		if err == nil {
			err = ctx.Err()
		} else {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return err
	}
	if err != nil {
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			if cerr := ctx.Err(); cerr != nil {
				return fmt.Errorf("%w (%v)", cerr, err)
			}
			// The conn's deadline is ctx's, and may pass a moment
			// before ctx's own timer marks it done.
			if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
				return fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
			}
		}
		return err
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("socks5: clearing deadline: %w", err)
	}
	return nil
}
