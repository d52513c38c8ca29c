package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/socks5"
)

// Bounds of the DNS server of one workspace.
const (
	// MaxDNSQuery is the largest query accepted (UDP datagram or TCP message);
	// larger ones are dropped (UDP) or end the connection (TCP).
	MaxDNSQuery = 4096
	// MaxDNSInFlight bounds the queries being forwarded at once; beyond it the
	// answer is SERVFAIL at once.
	MaxDNSInFlight = 64
	// MaxDNSTCPConns bounds the workspace's TCP connections to the DNS server;
	// beyond it a new one is closed.
	MaxDNSTCPConns = 16
	// DNSTimeout bounds forwarding one query (resolving and dialing the Resolver
	// included); the answer is then SERVFAIL.
	DNSTimeout = 5 * time.Second
	// dnsTCPIdle ends a TCP connection that sends no query for that long.
	dnsTCPIdle = 10 * time.Second
	// maxUDPAnswer caps the EDNS size an answer over UDP is truncated to.
	maxUDPAnswer = 4096
)

// dnsServer answers the workspace at DNSAddr.
type dnsServer struct {
	n      *Network
	udp    net.PacketConn
	tcp    net.Listener
	sem    chan struct{} // queries being forwarded
	tcpSem chan struct{} // TCP connections
	// assocLock serializes establishing UDP associations (a channel: waiting for it
	// honours a query's context).
	assocLock chan struct{}
	wg        sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	tcpConns map[net.Conn]struct{}
	assocs   map[string]*association // by Egress id
}

func startDNS(n *Network) (*dnsServer, error) {
	udp, err := n.st.ListenUDP(DNSAddr.Port())
	if err != nil {
		return nil, err
	}
	tcp, err := n.st.ListenTCP(DNSAddr.Port())
	if err != nil {
		udp.Close()
		return nil, err
	}
	d := &dnsServer{
		n:         n,
		udp:       udp,
		tcp:       tcp,
		sem:       make(chan struct{}, MaxDNSInFlight),
		tcpSem:    make(chan struct{}, MaxDNSTCPConns),
		assocLock: make(chan struct{}, 1),
		tcpConns:  make(map[net.Conn]struct{}),
		assocs:    make(map[string]*association),
	}
	d.wg.Add(2)
	go d.serveUDP()
	go d.serveTCP()
	return d, nil
}

// close stops serving and waits for every goroutine of the server; the Network's
// context is cancelled first, which ends the queries being forwarded.
func (d *dnsServer) close() {
	d.mu.Lock()
	d.closed = true
	conns := make([]net.Conn, 0, len(d.tcpConns))
	for c := range d.tcpConns {
		conns = append(conns, c)
	}
	assocs := make([]*association, 0, len(d.assocs))
	for id, a := range d.assocs {
		assocs = append(assocs, a)
		delete(d.assocs, id)
	}
	d.mu.Unlock()
	d.udp.Close()
	d.tcp.Close()
	for _, c := range conns {
		c.Close()
	}
	for _, a := range assocs {
		a.pc.Close()
	}
	d.wg.Wait()
}

// configured drops the UDP associations the configuration c no longer sends DNS
// through in the same Egress revision.
func (d *dnsServer) configured(c *config) {
	var stale []*association
	d.mu.Lock()
	for id, a := range d.assocs {
		if e := c.egresses[id]; id != c.dnsVia || e == nil || e.revision != a.revision {
			stale = append(stale, a)
			delete(d.assocs, id)
		}
	}
	d.mu.Unlock()
	for _, a := range stale {
		a.pc.Close()
	}
}

// dropAssociation ends the UDP association through the Egress id, if any.
func (d *dnsServer) dropAssociation(id string) {
	d.mu.Lock()
	a := d.assocs[id]
	delete(d.assocs, id)
	d.mu.Unlock()
	if a != nil {
		a.pc.Close()
	}
}

func (d *dnsServer) serveUDP() {
	defer d.wg.Done()
	buf := make([]byte, MaxDNSQuery+1)
	for {
		nr, from, err := d.udp.ReadFrom(buf)
		if err != nil {
			d.mu.Lock()
			closed := d.closed
			d.mu.Unlock()
			if !closed {
				d.n.log.Warn("DNS server: UDP read failed; no more UDP queries", "error", err)
			}
			return
		}
		ua, ok := from.(*net.UDPAddr)
		if !ok || nr > MaxDNSQuery || ua.AddrPort().Addr().Unmap() != WorkspaceAddr {
			continue
		}
		q := new(dns.Msg)
		if q.Unpack(buf[:nr]) != nil {
			continue
		}
		select {
		case d.sem <- struct{}{}:
		default:
			d.writeUDP(failure(q, dns.RcodeServerFailure), q, from)
			continue
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			r := d.n.answer(q, true)
			<-d.sem
			d.writeUDP(r, q, from)
		}()
	}
}

// writeUDP sends r, truncated to what the query said it can take.
func (d *dnsServer) writeUDP(r, q *dns.Msg, to net.Addr) {
	size := dns.MinMsgSize
	if opt := q.IsEdns0(); opt != nil {
		size = int(opt.UDPSize())
	}
	r.Truncate(min(max(size, dns.MinMsgSize), maxUDPAnswer))
	out, err := r.Pack()
	if err != nil {
		return
	}
	d.udp.WriteTo(out, to)
}

func (d *dnsServer) serveTCP() {
	defer d.wg.Done()
	for {
		c, err := d.tcp.Accept()
		if err != nil {
			return
		}
		select {
		case d.tcpSem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			c.Close()
			return
		}
		d.tcpConns[c] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go d.serveConn(c)
	}
}

// serveConn answers the queries of one TCP connection, one after the other.
func (d *dnsServer) serveConn(c net.Conn) {
	defer func() {
		c.Close()
		d.mu.Lock()
		delete(d.tcpConns, c)
		d.mu.Unlock()
		<-d.tcpSem
		d.wg.Done()
	}()
	var hdr [2]byte
	buf := make([]byte, MaxDNSQuery)
	for {
		c.SetReadDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		size := int(binary.BigEndian.Uint16(hdr[:]))
		if size > MaxDNSQuery {
			return
		}
		if _, err := io.ReadFull(c, buf[:size]); err != nil {
			return
		}
		q := new(dns.Msg)
		if q.Unpack(buf[:size]) != nil {
			return
		}
		var r *dns.Msg
		select {
		case d.sem <- struct{}{}:
			r = d.n.answer(q, false)
			<-d.sem
		default:
			r = failure(q, dns.RcodeServerFailure)
		}
		out, err := r.Pack()
		if err != nil || len(out) > dns.MaxMsgSize {
			return
		}
		c.SetWriteDeadline(time.Now().Add(DNSTimeout))
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(out))), out...)); err != nil {
			return
		}
	}
}

// failure is an answer of rcode to q.
func failure(q *dns.Msg, rcode int) *dns.Msg {
	return new(dns.Msg).SetRcode(q, rcode)
}

// answer forwards q as the current configuration says and returns the answer.
func (n *Network) answer(q *dns.Msg, udp bool) *dns.Msg {
	if q.Response || len(q.Question) != 1 {
		return failure(q, dns.RcodeFormatError)
	}
	if q.Opcode != dns.OpcodeQuery {
		return failure(q, dns.RcodeNotImplemented)
	}
	n.mu.Lock()
	c := n.cur
	n.mu.Unlock()
	if c.policy.Mode() != ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET || c.resolver == nil {
		return failure(q, dns.RcodeRefused)
	}
	ctx, cancel := context.WithTimeout(n.ctx, DNSTimeout)
	defer cancel()
	up := q.Copy()
	up.Id = dns.Id()
	r, err := n.dns.forward(ctx, c, up)
	if err != nil {
		n.log.Debug("DNS query failed", "resolver", c.resolver.id, "via", c.dnsVia, "error", err)
		return failure(q, dns.RcodeServerFailure)
	}
	if !r.Response || len(r.Question) != 1 || !sameQuestion(r.Question[0], q.Question[0]) {
		return failure(q, dns.RcodeServerFailure)
	}
	r.Id = q.Id
	return r
}

func sameQuestion(a, b dns.Question) bool {
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && strings.EqualFold(a.Name, b.Name)
}

// forward sends m to c's Resolver: its address resolved and checked now, each
// address tried in order until one answers.
func (d *dnsServer) forward(ctx context.Context, c *config, m *dns.Msg) (*dns.Msg, error) {
	n := d.n
	var e *egress
	if c.dnsVia != "" {
		if e = c.egresses[c.dnsVia]; e == nil {
			return nil, fmt.Errorf("egress %s of the DNS configuration is not configured", c.dnsVia)
		}
		if c.resolver.network == "udp" && !e.udp {
			return nil, fmt.Errorf("egress %s does not carry UDP", e.id)
		}
	}
	addrs, err := n.checker.Resolve(ctx, "resolver "+c.resolver.id+" address", c.resolver.address)
	if err != nil {
		return nil, err
	}
	var firstErr error
	for _, a := range addrs {
		r, err := d.exchange(ctx, c.resolver.network, e, a, m)
		if err == nil {
			return r, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

// exchange sends m to the Resolver address a over network, directly (e nil) or
// through e, and returns the answer with m's ID.
func (d *dnsServer) exchange(ctx context.Context, network string, e *egress, a netip.AddrPort, m *dns.Msg) (*dns.Msg, error) {
	n := d.n
	var conn net.Conn
	var err error
	switch {
	case e == nil:
		conn, err = n.socket(ctx, network, a)
	case network == "tcp":
		conn, err = n.proxy(ctx, e)
		if err == nil {
			cl := e.client
			if _, err = cl.Connect(ctx, conn, socks5.AddrFromAddrPort(a)); err != nil {
				conn.Close()
				err = fmt.Errorf("egress %s: %w", e.id, err)
			}
		}
	default:
		as, err := d.association(ctx, e)
		if err != nil {
			return nil, err
		}
		return as.exchange(ctx, m, a)
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	cl := dns.Client{Timeout: DNSTimeout, UDPSize: dns.MaxMsgSize}
	r, _, err := cl.ExchangeWithConnContext(ctx, m, &dns.Conn{Conn: conn})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// association is a UDP ASSOCIATE of an Egress that carries the workspace's UDP
// queries; answers are matched to queries by their (rewritten, unique) IDs.
type association struct {
	egress   string
	revision uint64
	pc       *socks5.PacketConn

	mu       sync.Mutex
	waiting  map[uint16]*waiter
	lastRecv time.Time
}

type waiter struct {
	to netip.AddrPort
	ch chan *dns.Msg
}

var errAssociationEnded = errors.New("the egress's UDP association ended")

// association returns the live association of e's revision, establishing it when
// there is none.
func (d *dnsServer) association(ctx context.Context, e *egress) (*association, error) {
	select {
	case d.assocLock <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-d.assocLock }()
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, net.ErrClosed
	}
	old := d.assocs[e.id]
	if old != nil && old.revision == e.revision && !old.ended() {
		d.mu.Unlock()
		return old, nil
	}
	delete(d.assocs, e.id)
	d.mu.Unlock()
	if old != nil {
		old.pc.Close()
	}

	n := d.n
	control, err := n.proxy(ctx, e)
	if err != nil {
		return nil, err
	}
	cl := e.client
	pc, err := cl.Associate(ctx, control, func(ctx context.Context, relay netip.AddrPort) (net.Conn, error) {
		if err := n.checker.CheckAddr("egress "+e.id+" UDP relay", relay.Addr()); err != nil {
			return nil, err
		}
		return n.socket(ctx, "udp", relay)
	})
	if err != nil {
		control.Close()
		return nil, fmt.Errorf("egress %s: %w", e.id, err)
	}
	a := &association{egress: e.id, revision: e.revision, pc: pc, waiting: make(map[uint16]*waiter)}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		pc.Close()
		return nil, net.ErrClosed
	}
	d.assocs[e.id] = a
	d.wg.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.wg.Done()
		a.read()
	}()
	n.log.Debug("DNS: UDP association established", "egress", e.id, "revision", e.revision)
	return a, nil
}

func (a *association) ended() bool {
	select {
	case <-a.pc.Done():
		return true
	default:
		return false
	}
}

// read hands the relay's answers to the queries waiting for them until the
// association ends.
func (a *association) read() {
	defer a.pc.Close()
	buf := make([]byte, dns.MaxMsgSize)
	for {
		nr, src, err := a.pc.ReadFromAddr(buf)
		if err != nil {
			return
		}
		m := new(dns.Msg)
		if m.Unpack(buf[:nr]) != nil {
			continue
		}
		from, ok := src.AddrPort()
		a.mu.Lock()
		a.lastRecv = time.Now()
		w := a.waiting[m.Id]
		if w != nil && ok && from == w.to {
			delete(a.waiting, m.Id)
		} else {
			w = nil
		}
		a.mu.Unlock()
		if w != nil {
			w.ch <- m
		}
	}
}

// exchange sends m (its ID replaced by one unique on the association) to to and
// waits for the answer.
func (a *association) exchange(ctx context.Context, m *dns.Msg, to netip.AddrPort) (*dns.Msg, error) {
	w := &waiter{to: to, ch: make(chan *dns.Msg, 1)}
	a.mu.Lock()
	id := dns.Id()
	for a.waiting[id] != nil {
		id = dns.Id()
	}
	a.waiting[id] = w
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		if a.waiting[id] == w {
			delete(a.waiting, id)
		}
		a.mu.Unlock()
	}()
	m.Id = id
	out, err := m.Pack()
	if err != nil {
		return nil, err
	}
	sent := time.Now()
	if _, err := a.pc.WriteToAddr(out, socks5.AddrFromAddrPort(to)); err != nil {
		return nil, err
	}
	select {
	case r := <-w.ch:
		return r, nil
	case <-a.pc.Done():
		return nil, errAssociationEnded
	case <-ctx.Done():
		// Nothing at all came back since: the association is taken for dead, the next
		// query establishes another.
		a.mu.Lock()
		silent := a.lastRecv.Before(sent)
		a.mu.Unlock()
		if silent && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			a.pc.Close()
		}
		return nil, ctx.Err()
	}
}
