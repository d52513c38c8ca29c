package network

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// dnsServe runs a DNS server (miekg/dns) on 127.0.0.1 over network until the test
// ends and returns its address.
func dnsServe(tb testing.TB, network string, h dns.HandlerFunc) string {
	tb.Helper()
	srv := &dns.Server{Handler: h}
	var addr string
	switch network {
	case "udp":
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		srv.PacketConn, addr = pc, pc.LocalAddr().String()
	default:
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		srv.Listener, addr = l, l.Addr().String()
	}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	done := make(chan struct{})
	go func() { srv.ActivateAndServe(); close(done) }()
	<-started
	tb.Cleanup(func() { srv.Shutdown(); <-done })
	return addr
}

// answerA answers every A question with ip.
func answerA(ip string) dns.HandlerFunc {
	return func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg).SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(ip)})
		}
		w.WriteMsg(r)
	}
}

func udpResolver(id, addr string) *nodev1.NetworkResolver {
	return &nodev1.NetworkResolver{ResolverId: id, Revision: 1, Spec: &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: addr}}}}
}

func tcpResolver(id, addr string) *nodev1.NetworkResolver {
	return &nodev1.NetworkResolver{ResolverId: id, Revision: 1, Spec: &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: addr}}}}
}

// withDNS is a PUBLIC_INTERNET configuration whose DNS goes to r (through via).
func withDNS(rev uint64, r *nodev1.NetworkResolver, via string, egresses ...*nodev1.NetworkEgress) *nodev1.NetworkConfig {
	p := public(rev)
	p.Dns = &ctrlv1.DnsConfig{ResolverId: r.GetResolverId(), ViaEgressId: via}
	return &nodev1.NetworkConfig{Policy: p, Resolver: r, Egresses: egresses}
}

// dnsConn is the workspace's socket to its DNS server.
func (w *ws) dnsConn(tb testing.TB, network string) net.Conn {
	tb.Helper()
	to := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(DNSAddr.Addr().AsSlice()), Port: DNSAddr.Port()}
	var c net.Conn
	var err error
	if network == "udp" {
		c, err = gonet.DialUDP(w.s, nil, &to, ipv4.ProtocolNumber)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err = gonet.DialContextTCP(ctx, w.s, to, ipv4.ProtocolNumber)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// query asks the workspace's DNS server over network.
func (w *ws) query(tb testing.TB, network, name string, qtype uint16) *dns.Msg {
	tb.Helper()
	r, err := w.tryQuery(tb, network, name, qtype)
	if err != nil {
		tb.Fatalf("query %s over %s: %v", name, network, err)
	}
	return r
}

func (w *ws) tryQuery(tb testing.TB, network, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg).SetQuestion(name, qtype)
	cl := dns.Client{Timeout: 10 * time.Second}
	r, _, err := cl.ExchangeWithConn(m, &dns.Conn{Conn: w.dnsConn(tb, network)})
	return r, err
}

func wantA(tb testing.TB, r *dns.Msg, ip string) {
	tb.Helper()
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		tb.Fatalf("answer %v, want one A record", r)
	}
	if a, ok := r.Answer[0].(*dns.A); !ok || a.A.String() != ip {
		tb.Fatalf("answer %v, want A %s", r.Answer[0], ip)
	}
}

func TestDNSWithoutResolverIsRefused(t *testing.T) {
	w := newWS(t, testConfig(&dialLog{}), &nodev1.NetworkConfig{Policy: public(1)})
	for _, network := range []string{"udp", "tcp"} {
		if r := w.query(t, network, "example.test.", dns.TypeA); r.Rcode != dns.RcodeRefused {
			t.Errorf("over %s: rcode %s, want REFUSED", network, dns.RcodeToString[r.Rcode])
		}
	}
	// Mode NONE, a resolver configured: refused as well.
	nc := withDNS(2, udpResolver("rs-a", "127.0.0.1:53"), "")
	nc.Policy.Mode = ctrlv1.NetworkMode_NETWORK_MODE_NONE
	if err := w.n.Apply(nc); err != nil {
		t.Fatal(err)
	}
	if r := w.query(t, "udp", "example.test.", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Errorf("mode NONE: rcode %s, want REFUSED", dns.RcodeToString[r.Rcode])
	}
}

// TestDNSDirect: UDP and TCP Resolvers, each asked over UDP and over TCP by the
// workspace, on marked sockets to the checked literal.
func TestDNSDirect(t *testing.T) {
	udpAddr := dnsServe(t, "udp", answerA("198.51.100.7"))
	tcpAddr := dnsServe(t, "tcp", answerA("198.51.100.8"))
	log := &dialLog{}
	w := newWS(t, testConfig(log), withDNS(1, udpResolver("rs-u", udpAddr), ""))
	for _, network := range []string{"udp", "tcp"} {
		wantA(t, w.query(t, network, "a.example.test.", dns.TypeA), "198.51.100.7")
	}
	if err := w.n.Apply(withDNS(2, tcpResolver("rs-t", tcpAddr), "")); err != nil {
		t.Fatal(err)
	}
	for _, network := range []string{"udp", "tcp"} {
		wantA(t, w.query(t, network, "b.example.test.", dns.TypeA), "198.51.100.8")
	}
	want := []string{"udp " + udpAddr, "udp " + udpAddr, "tcp " + tcpAddr, "tcp " + tcpAddr}
	if got := log.seen(); !slices.Equal(got, want) {
		t.Fatalf("node dialed %q, want %q", got, want)
	}
	// The answer's addresses still go through the policy at connect time: nothing
	// listens on 127.0.0.1:1, a RST.
	w.mustRefuse(t, netip.MustParseAddrPort("198.51.100.8:1"))
}

func TestDNSResolverChecked(t *testing.T) {
	log := &dialLog{}
	w := newWS(t, testConfig(log), withDNS(1, udpResolver("rs-a", "10.0.0.53:53"), ""))
	for _, network := range []string{"udp", "tcp"} {
		if r := w.query(t, network, "example.test.", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
			t.Errorf("a special-purpose resolver over %s: rcode %s, want SERVFAIL", network, dns.RcodeToString[r.Rcode])
		}
	}
	if got := log.seen(); len(got) != 0 {
		t.Fatalf("node dialed %q for a forbidden resolver", got)
	}
}

// TestDNSTruncation: an answer too large for the workspace's UDP query comes back
// truncated (TC), and whole over TCP.
func TestDNSTruncation(t *testing.T) {
	tcpAddr := dnsServe(t, "tcp", func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg).SetReply(q)
		for i := range 60 {
			r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(198, 51, 100, byte(i))})
		}
		w.WriteMsg(r)
	})
	w := newWS(t, testConfig(&dialLog{}), withDNS(1, tcpResolver("rs-t", tcpAddr), ""))
	r := w.query(t, "udp", "many.example.test.", dns.TypeA)
	if !r.Truncated || len(r.Answer) >= 60 {
		t.Fatalf("over UDP: truncated %v with %d answers, want TC and fewer than 60", r.Truncated, len(r.Answer))
	}
	if r := w.query(t, "tcp", "many.example.test.", dns.TypeA); r.Truncated || len(r.Answer) != 60 {
		t.Fatalf("over TCP: truncated %v with %d answers, want all 60", r.Truncated, len(r.Answer))
	}
}

func TestDNSViaEgressTCP(t *testing.T) {
	tcpAddr := dnsServe(t, "tcp", answerA("198.51.100.9"))
	fake := newFakeSOCKS(t, "u", "p")
	log := &dialLog{}
	eg := withAuth(socksEgress("eg-a", 1, fake.addr, 0), "u", "p")
	w := newWS(t, testConfig(log), withDNS(1, tcpResolver("rs-t", tcpAddr), "eg-a", eg))
	wantA(t, w.query(t, "udp", "via.example.test.", dns.TypeA), "198.51.100.9")
	if got := log.seen(); !slices.Equal(got, []string{"tcp " + fake.addr}) {
		t.Fatalf("node dialed %q, want only the egress", got)
	}
	fake.mu.Lock()
	targets := slices.Clone(fake.targets)
	fake.mu.Unlock()
	if !slices.Equal(targets, []string{tcpAddr}) {
		t.Fatalf("egress CONNECTs %q, want the resolver %s", targets, tcpAddr)
	}
	// A udp Resolver through an Egress without udp_enabled: SERVFAIL, nothing sent.
	udpAddr := dnsServe(t, "udp", answerA("198.51.100.10"))
	if err := w.n.Apply(withDNS(2, udpResolver("rs-u", udpAddr), "eg-a", eg)); err != nil {
		t.Fatal(err)
	}
	if r := w.query(t, "udp", "via.example.test.", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if got := log.seen(); len(got) != 1 {
		t.Fatalf("node dialed %q", got)
	}
}

// TestDNSInFlightBound: beyond MaxDNSInFlight queries being forwarded, the answer
// is SERVFAIL at once.
func TestDNSInFlightBound(t *testing.T) {
	release := make(chan struct{})
	var seen atomic.Int32
	udpAddr := dnsServe(t, "udp", func(w dns.ResponseWriter, q *dns.Msg) {
		seen.Add(1)
		<-release
		answerA("198.51.100.7")(w, q)
	})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	w := newWS(t, testConfig(&dialLog{}), withDNS(1, udpResolver("rs-u", udpAddr), ""))
	results := make(chan *dns.Msg, MaxDNSInFlight)
	conns := make([]net.Conn, MaxDNSInFlight)
	for i := range conns {
		conns[i] = w.dnsConn(t, "udp")
	}
	for _, c := range conns {
		go func() {
			m := new(dns.Msg).SetQuestion("held.example.test.", dns.TypeA)
			cl := dns.Client{Timeout: 20 * time.Second}
			r, _, _ := cl.ExchangeWithConn(m, &dns.Conn{Conn: c})
			results <- r
		}()
	}
	waitFor(t, "the resolver holding every query", func() bool { return seen.Load() == MaxDNSInFlight })
	start := time.Now()
	r := w.query(t, "tcp", "one.more.test.", dns.TypeA)
	if r.Rcode != dns.RcodeServerFailure || time.Since(start) > time.Second {
		t.Fatalf("a query beyond the bound: rcode %s after %v, want SERVFAIL at once", dns.RcodeToString[r.Rcode], time.Since(start))
	}
	free()
	for range MaxDNSInFlight {
		if r := <-results; r == nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("a held query: %v", r)
		}
	}
}

// TestDNSTCPBounds: a message longer than MaxDNSQuery ends the connection; beyond
// MaxDNSTCPConns a new connection is closed at once.
func TestDNSTCPBounds(t *testing.T) {
	w := newWS(t, testConfig(&dialLog{}), &nodev1.NetworkConfig{Policy: public(1)})
	c := w.dnsConn(t, "tcp")
	c.Write(binary.BigEndian.AppendUint16(nil, MaxDNSQuery+1))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after an oversized length: %v, want EOF", err)
	}
	for range MaxDNSTCPConns {
		if r := w.query(t, "tcp", "x.test.", dns.TypeA); r.Rcode != dns.RcodeRefused {
			t.Fatalf("rcode %d", r.Rcode)
		}
	}
	// Each query left its connection open (held until the test ends): the server
	// has MaxDNSTCPConns of them.
	waitFor(t, "the server holding its TCP connections", func() bool {
		w.n.dns.mu.Lock()
		defer w.n.dns.mu.Unlock()
		return len(w.n.dns.tcpConns) == MaxDNSTCPConns
	})
	extra := w.dnsConn(t, "tcp")
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a connection beyond the bound: %v, want EOF", err)
	}
}
