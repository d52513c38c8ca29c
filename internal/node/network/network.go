// Package network is one workspace's network on the node, everything but attaching
// the link to the workspace: the user-space TCP/IP stack (internal/node/netstack) on
// the link, the workspace's NetworkPolicy deciding every new TCP connection at its
// SYN, the dials (direct, or through a SOCKS5 Egress), the drains when the policy or
// an Egress changes, and the DNS server the workspace's resolv.conf names.
//
// Addressing is the same for every workspace (IPv4 only for now): the workspace is
// WorkspaceAddr in WorkspacePrefix, the node's stack is Gateway, its default route,
// and DNSAddr (Gateway:53, UDP and TCP) answers its DNS queries.
//
// A new connection to dst is decided by the applied policy (internal/netpolicy):
// refused (a RST at once), direct, or through the Egress of the first route covering
// dst. A direct destination is checked by the Checker (special-purpose ranges refused
// unless the operator allow-listed them) and dialed as the literal the workspace gave.
// An Egress's endpoint is resolved once per dial by the Checker, every address
// checked and only the checked literals dialed (no DNS rebinding); then TLS when the
// Egress says so, and SOCKS5 CONNECT to dst with RFC 1929 credentials when set. Any
// failure is a RST. Every socket the node opens for the workspace carries Config.Mark
// (SO_MARK), which the kernel backstop matches.
//
// Drains: each live connection's path is direct or (Egress, revision). Apply re-decides
// every live connection when the policy changes: one the new policy no longer admits
// ends at once, one whose path moves (direct <-> Egress, another Egress, an Egress
// the configuration no longer holds) ends after the new configuration's drain_seconds.
// An Egress's new revision takes the new connections at once, and connections on an
// older revision end after that Egress's drain_seconds. A connection already draining
// keeps its deadline; CloseEgress ends every connection through an Egress at once.
//
// DNS: queries to DNSAddr are forwarded to the policy's Resolver (UDP or TCP, its
// address resolved by the Checker on every query), directly or through the policy's
// dns.via_egress_id Egress (UDP through one pooled UDP ASSOCIATE of that Egress,
// re-established when it ends; TCP through CONNECT). Without a Resolver, or in a mode
// other than PUBLIC_INTERNET, the answer is REFUSED. Queries are bounded in size
// (MaxDNSQuery), number in flight (MaxDNSInFlight, beyond it SERVFAIL), TCP
// connections (MaxDNSTCPConns) and time (DNSTimeout).
package network

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/stack"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/netpolicy"
	"github.com/kibotos/kibotos/internal/node/netstack"
)

// The addressing of every workspace's link.
var (
	// WorkspacePrefix is the workspace's address and its subnet.
	WorkspacePrefix = netip.MustParsePrefix("169.254.77.2/30")
	// WorkspaceAddr is the workspace's address.
	WorkspaceAddr = WorkspacePrefix.Addr()
	// Gateway is the node's address on the link, the workspace's default route.
	Gateway = netip.MustParseAddr("169.254.77.1")
	// DNSAddr is where the node answers the workspace's DNS queries (UDP and TCP).
	DNSAddr = netip.AddrPortFrom(Gateway, 53)
)

// Limits.
const (
	// DefaultDialTimeout bounds deciding and dialing one connection (Egress
	// handshakes included) when Config.DialTimeout is 0.
	DefaultDialTimeout = 10 * time.Second
	// MaxDrainSeconds is the longest drain a configuration may ask for.
	MaxDrainSeconds = 3600
)

// Config configures a Network.
type Config struct {
	// Checker checks direct destinations, Egress endpoints and Resolver addresses
	// (the operator allow-list) and resolves their names. nil is the zero Checker:
	// no allow-list, the system resolver.
	Checker *netguard.Checker
	// Mark is set as SO_MARK on every socket the node opens for the workspace; 0 sets
	// none (unprivileged tests).
	Mark uint32
	// Log receives the network's events; nil discards them. Passwords never appear.
	Log *slog.Logger
	// DialTimeout bounds deciding and dialing one connection; 0 is DefaultDialTimeout.
	DialTimeout time.Duration
	// Now is the clock of drain deadlines; nil is time.Now.
	Now func() time.Time

	// dial, in tests, opens the node's sockets instead of a marked net.Dialer; it is
	// only ever given checked literals.
	dial func(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error)
	// rewrite, in tests, maps the destination the workspace dialed (already decided
	// and checked) to the one dialed directly or asked of an Egress: gVisor drops
	// loopback destinations arriving on a link, so tests dial stand-ins for them.
	rewrite func(netip.AddrPort) netip.AddrPort
}

// Network is one workspace's network on the node.
type Network struct {
	cfg     Config
	log     *slog.Logger
	checker *netguard.Checker
	timeout time.Duration
	st      *netstack.Stack
	dns     *dnsServer

	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	cur     *config
	gen     uint64 // incremented by every Apply
	conns   map[*conn]struct{}
	timer   *time.Timer
	timerAt time.Time
}

// path is the route of a connection: direct (egress "") or an Egress revision.
type path struct {
	egress   string
	revision uint64
}

func (p path) String() string {
	if p.egress == "" {
		return "direct"
	}
	return fmt.Sprintf("egress %s revision %d", p.egress, p.revision)
}

// conn is a connection of the workspace, from its decision to its end. It is the
// netstack path of the connection.
type conn struct {
	dst  netip.AddrPort
	path path
	gen  uint64 // the configuration it was decided under

	// Guarded by Network.mu.
	up       net.Conn  // set when it is registered
	deadline time.Time // draining until then; zero: not draining
	closing  bool
}

// New starts the workspace's network on link with the configuration nc (nil: mode
// NONE): the stack and the DNS server. An invalid nc is an error and nothing runs.
func New(cfg Config, link stack.LinkEndpoint, nc *nodev1.NetworkConfig) (*Network, error) {
	c, err := compile(nc)
	if err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	checker := cfg.Checker
	if checker == nil {
		checker = &netguard.Checker{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Network{
		cfg:     cfg,
		log:     log,
		checker: checker,
		timeout: timeout,
		ctx:     ctx,
		cancel:  cancel,
		cur:     c,
		conns:   make(map[*conn]struct{}),
	}
	n.st, err = netstack.New(netstack.Config{
		Link:        link,
		Address:     WorkspacePrefix,
		Gateway:     Gateway,
		Decide:      n.decide,
		DialTimeout: timeout,
	})
	if err != nil {
		cancel()
		return nil, err
	}
	n.dns, err = startDNS(n)
	if err != nil {
		cancel()
		n.st.Close()
		return nil, err
	}
	return n, nil
}

// errRefused is the reason of every refusal (a RST; the workspace learns no more).
var errRefused = errors.New("network: refused")

// decide is the stack's Decide: the verdict of the current configuration on dst.
func (n *Network) decide(_ context.Context, dst netip.AddrPort) (netstack.Decision, error) {
	if WorkspacePrefix.Contains(dst.Addr()) {
		// The link itself: the node offers nothing there but DNS (bound, never
		// decided).
		return netstack.Decision{}, errRefused
	}
	n.mu.Lock()
	cur, gen := n.cur, n.gen
	n.mu.Unlock()
	p, e, err := cur.route(dst)
	if err != nil {
		n.log.Debug("connection refused", "dst", dst, "reason", err)
		return netstack.Decision{}, errRefused
	}
	if e == nil {
		if err := n.checker.CheckAddr("destination", dst.Addr()); err != nil {
			n.log.Debug("connection refused", "dst", dst, "reason", err)
			return netstack.Decision{}, errRefused
		}
	}
	c := &conn{dst: dst, path: p, gen: gen}
	return netstack.Decision{Path: c, Dial: func(ctx context.Context) (net.Conn, error) {
		return n.dialConn(ctx, c, e)
	}}, nil
}

// dialConn opens c's upstream and registers c. A configuration applied while it
// dialed decides again: a connection it would not route the same way is refused.
func (n *Network) dialConn(ctx context.Context, c *conn, e *egress) (net.Conn, error) {
	var up net.Conn
	var err error
	if e == nil {
		up, err = n.dialDirect(ctx, c.dst)
	} else {
		up, err = n.dialEgress(ctx, e, c.dst)
	}
	if err != nil {
		n.log.Debug("connection failed", "dst", c.dst, "path", c.path.String(), "error", err)
		return nil, err
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		up.Close()
		return nil, net.ErrClosed
	}
	if c.gen != n.gen {
		if p, _, err := n.cur.route(c.dst); err != nil || p != c.path {
			n.mu.Unlock()
			up.Close()
			return nil, errRefused
		}
		c.gen = n.gen
	}
	u := &upConn{Conn: up, n: n, c: c}
	c.up = u
	n.conns[c] = struct{}{}
	n.mu.Unlock()
	return u, nil
}

// upConn is a connection's upstream; closing it (the stack always does, at the end)
// forgets the connection.
type upConn struct {
	net.Conn
	n    *Network
	c    *conn
	once sync.Once
}

func (u *upConn) Close() error {
	if tc, ok := u.Conn.(*tls.Conn); ok {
		// At once: tls.Conn's Close may wait seconds to send its alert to a peer that
		// reads nothing (after a normal end the splice has sent it already).
		tc.NetConn().Close()
	}
	err := u.Conn.Close()
	u.once.Do(func() {
		u.n.mu.Lock()
		delete(u.n.conns, u.c)
		u.n.mu.Unlock()
	})
	return err
}

// SyscallConn is the upstream's socket when it is a plain one (not TLS): the stack
// then reads it directly, into a buffer taken only once it is readable.
func (u *upConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := u.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// CloseWrite half-closes the upstream (the stack needs it to pass a FIN on).
func (u *upConn) CloseWrite() error {
	if cw, ok := u.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("network: upstream cannot be half-closed")
}

// Apply makes nc the configuration: new connections follow it at once, live ones
// are kept, drained or ended as the package documentation says. An invalid nc is an
// error and the previous configuration stays.
func (n *Network) Apply(nc *nodev1.NetworkConfig) error {
	c, err := compile(nc)
	if err != nil {
		return err
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return net.ErrClosed
	}
	old := n.cur
	now := n.cfg.Now()
	policyChanged := old.revision != c.revision || !netpolicy.Equal(old.policyProto, c.policyProto)
	var kill []*conn
	drain := func(x *conn, d time.Duration) {
		if !x.deadline.IsZero() {
			return // already draining: its own deadline stays
		}
		if d <= 0 {
			kill = append(kill, x)
			return
		}
		x.deadline = now.Add(d)
	}
	for x := range n.conns {
		if x.closing {
			continue
		}
		if policyChanged {
			p, _, err := c.route(x.dst)
			switch {
			case errors.Is(err, errNotAdmitted):
				kill = append(kill, x)
				continue
			case err != nil || p.egress != x.path.egress:
				// Moved: another path, or an Egress the configuration no longer holds.
				drain(x, c.drain)
				continue
			}
		}
		if x.path.egress != "" {
			if e := c.egresses[x.path.egress]; e != nil && e.revision != x.path.revision {
				drain(x, e.drain)
			} else if e == nil {
				drain(x, c.drain)
			}
		}
	}
	for _, x := range kill {
		x.closing = true
	}
	n.cur = c
	n.gen++
	n.scheduleLocked(now)
	n.mu.Unlock()
	n.dns.configured(c)
	n.end(kill)
	if len(kill) > 0 {
		n.log.Info("network configuration applied", "revision", c.revision, "ended", len(kill))
	}
	return nil
}

// end closes connections at once (a RST toward the workspace).
func (n *Network) end(cs []*conn) {
	if len(cs) == 0 {
		return
	}
	set := make(map[*conn]bool, len(cs))
	for _, c := range cs {
		set[c] = true
	}
	n.st.CloseWhere(func(p any) bool { c, _ := p.(*conn); return set[c] })
	// One not registered with the stack yet ends when its splice reads the closed
	// upstream.
	for _, c := range cs {
		c.up.Close()
	}
}

// scheduleLocked arms the timer for the earliest drain deadline.
func (n *Network) scheduleLocked(now time.Time) {
	var next time.Time
	for c := range n.conns {
		if !c.closing && !c.deadline.IsZero() && (next.IsZero() || c.deadline.Before(next)) {
			next = c.deadline
		}
	}
	if next.IsZero() || n.closed {
		if n.timer != nil {
			n.timer.Stop()
		}
		n.timerAt = time.Time{}
		return
	}
	if n.timer != nil && n.timerAt.Equal(next) {
		return
	}
	d := max(next.Sub(now), 0)
	n.timerAt = next
	if n.timer == nil {
		n.timer = time.AfterFunc(d, n.expire)
	} else {
		n.timer.Reset(d)
	}
}

// expire ends the connections whose drain deadline passed.
func (n *Network) expire() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	now := n.cfg.Now()
	var due []*conn
	for c := range n.conns {
		if !c.closing && !c.deadline.IsZero() && !c.deadline.After(now) {
			c.closing = true
			due = append(due, c)
		}
	}
	n.timerAt = time.Time{}
	n.scheduleLocked(now)
	n.mu.Unlock()
	n.end(due)
	if len(due) > 0 {
		n.log.Info("drained connections ended", "count", len(due))
	}
}

// CloseEgress ends every connection through the Egress id at once, draining or not
// (DeleteEgress), and its DNS association; it returns how many connections.
func (n *Network) CloseEgress(id string) int {
	n.mu.Lock()
	var hit []*conn
	for c := range n.conns {
		if !c.closing && c.path.egress == id {
			c.closing = true
			hit = append(hit, c)
		}
	}
	n.scheduleLocked(n.cfg.Now())
	n.mu.Unlock()
	n.dns.dropAssociation(id)
	n.end(hit)
	return len(hit)
}

// Status is the applied configuration: the policy revision and the revision of each
// Egress new connections leave through (DNSConfigVersion is the caller's).
func (n *Network) Status() *nodev1.NetworkStatus {
	n.mu.Lock()
	c := n.cur
	n.mu.Unlock()
	st := &nodev1.NetworkStatus{AppliedRevision: c.revision}
	for _, id := range c.egressOrder {
		st.Egresses = append(st.Egresses, &ctrlv1.EgressStatus{EgressId: id, AppliedRevision: c.egresses[id].revision})
	}
	return st
}

// Conns is the number of live TCP connections the workspace has through the node.
func (n *Network) Conns() int { return n.st.Count() }

// Close ends everything: every connection, the DNS server, the stack; it returns
// once all of the network's goroutines have. The link's own resources (a TAP fd)
// stay the caller's.
func (n *Network) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	if n.timer != nil {
		n.timer.Stop()
	}
	n.mu.Unlock()
	n.cancel()
	n.dns.close()
	return n.st.Close()
}
