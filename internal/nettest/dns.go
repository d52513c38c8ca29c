//go:build linux

package nettest

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// DNSServer is an authoritative DNS server inside a Peer, on port 53 over
// UDP and TCP, answering the names it was given (Set, SetSequence) with TTL
// 0 and every other name with NXDOMAIN. It records every query.
type DNSServer struct {
	Addr netip.AddrPort // the Peer's address, port 53

	udp, tcp *dns.Server

	mu      sync.Mutex
	names   map[string]*dnsName
	queries []Query
}

// dnsName is the configured answers of one name: successive A queries get
// successive steps, the last one repeated.
type dnsName struct {
	steps [][]netip.Addr
	next  int // the step the next A query gets
}

// Query is one question the server received.
type Query struct {
	Name string         // lower case, fully qualified ("x.test.")
	Type uint16         // dns.TypeA, dns.TypeAAAA, ...
	Net  string         // "udp" or "tcp"
	From netip.AddrPort // the client's address as the server saw it
	At   time.Time
}

// DNS starts a DNSServer inside the Peer on port 53 (UDP and TCP).
func (p *Peer) DNS() (*DNSServer, error) {
	ln, err := p.Listen(53)
	if err != nil {
		return nil, err
	}
	pc, err := p.ListenUDP(53)
	if err != nil {
		return nil, err
	}
	d := &DNSServer{Addr: netip.AddrPortFrom(p.Addr, 53), names: map[string]*dnsName{}}
	d.udp = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(d.serve("udp"))}
	d.tcp = &dns.Server{Listener: ln, Handler: dns.HandlerFunc(d.serve("tcp"))}
	started := make(chan struct{}, 2)
	for _, s := range []*dns.Server{d.udp, d.tcp} {
		s.NotifyStartedFunc = func() { started <- struct{}{} }
		go s.ActivateAndServe()
	}
	<-started
	<-started
	p.onClose(func() error {
		d.udp.Shutdown()
		d.tcp.Shutdown()
		return nil
	})
	return d, nil
}

// Set answers name with addrs: its IPv4 addresses to A queries, its IPv6
// addresses (IPv4-mapped ones included) to AAAA queries (none of a family:
// an empty NOERROR answer).
func (d *DNSServer) Set(name string, addrs ...netip.Addr) { d.SetSequence(name, addrs) }

// SetSequence answers name's successive A queries with successive steps,
// the last step repeated: SetSequence("r.test", {public}, {127.0.0.1}) is a
// rebinding name whose first answer is public and every later one loopback.
// AAAA queries get the IPv6 addresses of the step the last A query got (the
// first step before any).
func (d *DNSServer) SetSequence(name string, steps ...[]netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.names[canonical(name)] = &dnsName{steps: steps}
}

// Remove makes name unknown again (NXDOMAIN).
func (d *DNSServer) Remove(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.names, canonical(name))
}

// Queries returns the queries received so far.
func (d *DNSServer) Queries() []Query {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Query(nil), d.queries...)
}

// QueriesFor returns the queries for name received so far.
func (d *DNSServer) QueriesFor(name string) []Query {
	var out []Query
	for _, q := range d.Queries() {
		if q.Name == canonical(name) {
			out = append(out, q)
		}
	}
	return out
}

func canonical(name string) string { return dns.Fqdn(strings.ToLower(name)) }

func (d *DNSServer) serve(network string) func(w dns.ResponseWriter, r *dns.Msg) {
	return func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		if len(r.Question) != 1 {
			m.Rcode = dns.RcodeFormatError
			w.WriteMsg(m)
			return
		}
		q := r.Question[0]
		name := canonical(q.Name)
		var from netip.AddrPort
		switch a := w.RemoteAddr().(type) {
		case *net.UDPAddr:
			from = a.AddrPort()
		case *net.TCPAddr:
			from = a.AddrPort()
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())

		d.mu.Lock()
		d.queries = append(d.queries, Query{Name: name, Type: q.Qtype, Net: network, From: from, At: time.Now()})
		n, ok := d.names[name]
		var addrs []netip.Addr
		if ok && len(n.steps) > 0 {
			switch q.Qtype {
			case dns.TypeA:
				addrs = n.steps[min(n.next, len(n.steps)-1)]
				n.next++
			case dns.TypeAAAA:
				addrs = n.steps[min(max(n.next-1, 0), len(n.steps)-1)]
			}
		}
		d.mu.Unlock()

		if !ok {
			m.Rcode = dns.RcodeNameError
			w.WriteMsg(m)
			return
		}
		hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 0}
		for _, a := range addrs {
			switch {
			case q.Qtype == dns.TypeA && a.Is4():
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
			case q.Qtype == dns.TypeAAAA && a.Is6():
				// IPv4-mapped addresses too: an AAAA record can carry
				// ::ffff:a.b.c.d, and SSRF tests need it to.
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
		if network == "udp" {
			size := dns.MinMsgSize
			if o := r.IsEdns0(); o != nil {
				size = max(int(o.UDPSize()), dns.MinMsgSize)
			}
			m.Truncate(size)
		}
		w.WriteMsg(m)
	}
}
