package network

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/netguard"
)

func TestDirect(t *testing.T) {
	echo := echoServer(t)
	log := &dialLog{}
	w := newWS(t, testConfig(log), &nodev1.NetworkConfig{Policy: public(1)})
	dst := standIn(t, echo)
	c := w.mustDial(t, dst)
	if got := log.seen(); !slices.Equal(got, []string{"tcp " + echo}) {
		t.Fatalf("node dialed %q, want the destination's literal %s", got, echo)
	}
	if n := w.n.Conns(); n != 1 {
		t.Fatalf("Conns = %d, want 1", n)
	}
	c.Close()
	waitFor(t, "the connection unregistered", func() bool { return w.n.Conns() == 0 })
}

func TestRefusals(t *testing.T) {
	echo := echoServer(t)
	dst := standIn(t, echo)
	other := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.2"), dst.Port())
	for _, tc := range []struct {
		name   string
		policy *ctrlv1.NetworkPolicy
		dst    netip.AddrPort
	}{
		{"mode NONE", &ctrlv1.NetworkPolicy{Revision: 1, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, dst},
		{"mode unspecified", &ctrlv1.NetworkPolicy{Revision: 1}, dst},
		{"deny", func() *ctrlv1.NetworkPolicy { p := public(1); p.Deny = []*ctrlv1.Destination{hostDest(dst)}; return p }(), dst},
		{"deny wins over allow", func() *ctrlv1.NetworkPolicy {
			p := public(1)
			p.Allow = []*ctrlv1.Destination{dest("198.51.100.0/24")}
			p.Deny = []*ctrlv1.Destination{dest("198.51.100.1/32")}
			return p
		}(), dst},
		{"outside allow", func() *ctrlv1.NetworkPolicy {
			p := public(1)
			p.Allow = []*ctrlv1.Destination{hostDest(other)}
			return p
		}(), dst},
		{"private, not allow-listed", public(1), netip.MustParseAddrPort("10.1.2.3:80")},
		{"link-local metadata", public(1), netip.MustParseAddrPort("169.254.169.254:80")},
		{"the gateway's other ports", public(1), netip.AddrPortFrom(Gateway, 80)},
		{"the egress of a route missing from the configuration", func() *ctrlv1.NetworkPolicy {
			p := public(1)
			p.Egresses = []*ctrlv1.EgressRoute{route("eg-missing", dest("198.51.100.0/24"))}
			return p
		}(), dst},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &dialLog{}
			w := newWS(t, testConfig(log), &nodev1.NetworkConfig{Policy: tc.policy})
			fastest := time.Hour
			for range 3 {
				fastest = min(fastest, w.mustRefuse(t, tc.dst))
			}
			if fastest > 100*time.Millisecond {
				t.Errorf("refused after %v, want at once", fastest)
			}
			if got := log.seen(); len(got) > 0 {
				t.Errorf("a refused destination was dialed: %q", got)
			}
		})
	}
}

func TestAllowOnly(t *testing.T) {
	echo := echoServer(t)
	dst := standIn(t, echo)
	p := public(1)
	p.Allow = []*ctrlv1.Destination{hostDest(dst)}
	w := newWS(t, testConfig(&dialLog{}), &nodev1.NetworkConfig{Policy: p})
	w.mustDial(t, dst)
	w.mustRefuse(t, netip.AddrPortFrom(dst.Addr(), dst.Port()+1))
	w.mustRefuse(t, netip.AddrPortFrom(netip.MustParseAddr("198.51.100.2"), dst.Port()))
}

func TestFailedUpstreamIsReset(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	fake := newFakeSOCKS(t, "", "")
	p := public(1)
	dst := standIn(t, closed)
	viaEgress := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.3"), dst.Port())
	p.Egresses = []*ctrlv1.EgressRoute{route("eg-a", hostDest(viaEgress))}
	w := newWS(t, testConfig(&dialLog{}), &nodev1.NetworkConfig{Policy: p, Egresses: []*nodev1.NetworkEgress{socksEgress("eg-a", 1, fake.addr, 0)}})
	w.mustRefuse(t, dst)
	// The proxy's CONNECT fails: a RST too.
	w.mustRefuse(t, viaEgress)
	if fake.connects() != 1 {
		t.Fatalf("the egress saw %d CONNECTs, want 1", fake.connects())
	}
	if n := w.n.Conns(); n != 0 {
		t.Fatalf("Conns = %d, want 0", n)
	}
}

func TestFirstMatchingEgressWins(t *testing.T) {
	echo := echoServer(t)
	dst := standIn(t, echo)
	a, b := newFakeSOCKS(t, "", ""), newFakeSOCKS(t, "user-b", "secret-b")
	p := public(1)
	p.Egresses = []*ctrlv1.EgressRoute{
		route("eg-b", hostDest(netip.AddrPortFrom(netip.MustParseAddr("198.51.100.1"), 1))),
		route("eg-a", dest("198.51.100.0/25")),
		route("eg-b", dest("198.51.100.0/24")),
	}
	log := &dialLog{}
	nc := &nodev1.NetworkConfig{Policy: p, Egresses: []*nodev1.NetworkEgress{
		socksEgress("eg-a", 1, a.addr, 0),
		withAuth(socksEgress("eg-b", 4, b.addr, 0), "user-b", "secret-b"),
	}}
	w := newWS(t, testConfig(log), nc)
	w.mustDial(t, dst)
	if a.connects() != 1 || b.connects() != 0 {
		t.Fatalf("CONNECTs: first matching egress %d, later one %d; want 1 and 0", a.connects(), b.connects())
	}
	if got := log.seen(); !slices.Equal(got, []string{"tcp " + a.addr}) {
		t.Fatalf("node dialed %q, want only the egress %s", got, a.addr)
	}
	// Only the third route covers .200: through eg-b, with its credentials.
	w.mustDial(t, netip.AddrPortFrom(netip.MustParseAddr("198.51.100.200"), dst.Port()))
	if a.connects() != 1 || b.connects() != 1 {
		t.Fatalf("eg-b saw %d CONNECTs, want 1", b.connects())
	}
	st := w.n.Status()
	if st.GetAppliedRevision() != 1 || len(st.GetEgresses()) != 2 || st.GetEgresses()[1].GetAppliedRevision() != 4 {
		t.Fatalf("Status = %v", st)
	}
}

func TestWrongEgressCredentialsIsReset(t *testing.T) {
	echo := echoServer(t)
	dst := standIn(t, echo)
	f := newFakeSOCKS(t, "user", "right")
	p := public(1)
	p.Egresses = []*ctrlv1.EgressRoute{route("eg-a", dest("198.51.100.0/24"))}
	w := newWS(t, testConfig(&dialLog{}), &nodev1.NetworkConfig{Policy: p, Egresses: []*nodev1.NetworkEgress{
		withAuth(socksEgress("eg-a", 1, f.addr, 0), "user", "wrong"),
	}})
	w.mustRefuse(t, dst)
}

// TestEgressUpdateDrains: a new revision takes new connections at once; the older
// revision's connections end after drain_seconds (0: at once); one already draining
// keeps its deadline.
func TestEgressUpdateDrains(t *testing.T) {
	echo := echoServer(t)
	dst := standIn(t, echo)
	p1, p2 := newFakeSOCKS(t, "", ""), newFakeSOCKS(t, "", "")
	p := public(1)
	p.Egresses = []*ctrlv1.EgressRoute{route("eg-a", dest("198.51.100.0/24"))}
	nc := func(rev uint64, addr string, drain uint32) *nodev1.NetworkConfig {
		return &nodev1.NetworkConfig{Policy: p, Egresses: []*nodev1.NetworkEgress{socksEgress("eg-a", rev, addr, drain)}}
	}
	w := newWS(t, testConfig(&dialLog{}), nc(1, p1.addr, 0))
	c1 := w.mustDial(t, dst)

	// Revision 2, drain 0: c1 ends at once, new connections go through p2.
	if err := w.n.Apply(nc(2, p2.addr, 0)); err != nil {
		t.Fatal(err)
	}
	if d := ended(t, c1, 2*time.Second); d > 500*time.Millisecond {
		t.Errorf("drain 0 ended the old revision's connection after %v", d)
	}
	c2 := w.mustDial(t, dst)
	if p2.connects() != 1 {
		t.Fatalf("revision 2's endpoint saw %d CONNECTs, want 1", p2.connects())
	}
	if got := w.n.Status().GetEgresses(); len(got) != 1 || got[0].GetAppliedRevision() != 2 {
		t.Fatalf("Status egresses = %v, want eg-a at 2", got)
	}

	// Revision 3 (back to p1), drain 2 s: c2 keeps working, then ends.
	start := time.Now()
	if err := w.n.Apply(nc(3, p1.addr, 2)); err != nil {
		t.Fatal(err)
	}
	c3 := w.mustDial(t, dst)
	roundTrip(t, c2)
	// Revision 4, drain 0: c3 (revision 3) ends at once; c2 keeps its deadline.
	if err := w.n.Apply(nc(4, p2.addr, 0)); err != nil {
		t.Fatal(err)
	}
	ended(t, c3, 2*time.Second)
	if err := tryRoundTrip(c2); err != nil {
		t.Fatalf("a draining connection ended by a later update: %v", err)
	}
	ended(t, c2, 5*time.Second)
	if d := time.Since(start); d < 2*time.Second || d > 4*time.Second {
		t.Errorf("the draining connection ended %v after its update, want 2s", d)
	}
	w.mustDial(t, dst)
}

// TestPolicyChange: one the new policy no longer admits ends at once, one whose path
// moves ends after the new drain_seconds, one unchanged stays.
func TestPolicyChange(t *testing.T) {
	echo := echoServer(t)
	port := standIn(t, echo).Port()
	at := func(last byte) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, last}), port)
	}
	keep, deny, toEgress, fromEgress, egressKept := at(1), at(2), at(3), at(4), at(5)
	fake := newFakeSOCKS(t, "", "")
	eg := []*nodev1.NetworkEgress{socksEgress("eg-a", 1, fake.addr, 0)}
	p1 := public(1)
	p1.Egresses = []*ctrlv1.EgressRoute{route("eg-a", hostDest(fromEgress), hostDest(egressKept))}
	w := newWS(t, testConfig(&dialLog{}), &nodev1.NetworkConfig{Policy: p1, Egresses: eg})
	conns := map[netip.AddrPort]net.Conn{}
	for _, d := range []netip.AddrPort{keep, deny, toEgress, fromEgress, egressKept} {
		conns[d] = w.mustDial(t, d)
	}

	p2 := public(2)
	p2.Deny = []*ctrlv1.Destination{hostDest(deny)}
	p2.Egresses = []*ctrlv1.EgressRoute{route("eg-a", hostDest(toEgress), hostDest(egressKept))}
	start := time.Now()
	if err := w.n.Apply(&nodev1.NetworkConfig{Policy: p2, DrainSeconds: 1, Egresses: eg}); err != nil {
		t.Fatal(err)
	}
	if d := ended(t, conns[deny], 2*time.Second); d > 500*time.Millisecond {
		t.Errorf("a no longer admitted connection ended after %v, want at once", d)
	}
	w.mustRefuse(t, deny)
	for _, d := range []netip.AddrPort{keep, toEgress, fromEgress, egressKept} {
		roundTrip(t, conns[d])
	}
	ended(t, conns[toEgress], 3*time.Second)
	ended(t, conns[fromEgress], 3*time.Second)
	if d := time.Since(start); d < time.Second {
		t.Errorf("moved connections ended after %v, want the 1s drain", d)
	}
	roundTrip(t, conns[keep])
	roundTrip(t, conns[egressKept])
	if got := w.n.Status().GetAppliedRevision(); got != 2 {
		t.Fatalf("applied revision %d, want 2", got)
	}

	// The same revision again (a repeated desired state): its drain is not applied
	// again and nothing changes.
	if err := w.n.Apply(&nodev1.NetworkConfig{Policy: p2, DrainSeconds: 0, Egresses: eg}); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, conns[keep])
	roundTrip(t, conns[egressKept])

	// Mode NONE: everything ends at once, nothing new.
	if err := w.n.Apply(&nodev1.NetworkConfig{Policy: &ctrlv1.NetworkPolicy{Revision: 3, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, DrainSeconds: 600}); err != nil {
		t.Fatal(err)
	}
	ended(t, conns[keep], 2*time.Second)
	ended(t, conns[egressKept], 2*time.Second)
	w.mustRefuse(t, keep)
	waitFor(t, "no connections", func() bool { return w.n.Conns() == 0 })
}

func TestCloseEgress(t *testing.T) {
	echo := echoServer(t)
	dst := standIn(t, echo)
	fake := newFakeSOCKS(t, "", "")
	p := public(1)
	p.Egresses = []*ctrlv1.EgressRoute{route("eg-a", hostDest(dst))}
	other := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.9"), dst.Port())
	eg := func(rev uint64, drain uint32) *nodev1.NetworkConfig {
		return &nodev1.NetworkConfig{Policy: p, Egresses: []*nodev1.NetworkEgress{socksEgress("eg-a", rev, fake.addr, drain)}}
	}
	w := newWS(t, testConfig(&dialLog{}), eg(1, 0))
	draining := w.mustDial(t, dst)
	if err := w.n.Apply(eg(2, 600)); err != nil {
		t.Fatal(err)
	}
	current := w.mustDial(t, dst)
	direct := w.mustDial(t, other)
	if n := w.n.CloseEgress("eg-a"); n != 2 {
		t.Fatalf("CloseEgress ended %d, want 2", n)
	}
	ended(t, draining, time.Second)
	ended(t, current, time.Second)
	roundTrip(t, direct)
	if n := w.n.CloseEgress("eg-other"); n != 0 {
		t.Fatalf("CloseEgress of an unused egress ended %d", n)
	}
}

func TestInvalidConfigKeepsPrevious(t *testing.T) {
	echo := echoServer(t)
	dst := standIn(t, echo)
	w := newWS(t, testConfig(&dialLog{}), &nodev1.NetworkConfig{Policy: public(1)})
	c := w.mustDial(t, dst)
	bad := public(2)
	bad.Allow = []*ctrlv1.Destination{dest("198.51.100.1/24")}
	secret := "hunter2-secret"
	for name, nc := range map[string]*nodev1.NetworkConfig{
		"host bits":    {Policy: bad},
		"drain":        {Policy: public(2), DrainSeconds: 3601},
		"egress twice": {Policy: public(2), Egresses: []*nodev1.NetworkEgress{socksEgress("eg-a", 1, "127.0.0.1:1", 0), socksEgress("eg-a", 1, "127.0.0.1:1", 0)}},
		"bad address":  {Policy: public(2), Egresses: []*nodev1.NetworkEgress{withAuth(socksEgress("eg-a", 1, "no port", 0), "u", secret)}},
		"no password":  {Policy: public(2), Egresses: []*nodev1.NetworkEgress{withAuth(socksEgress("eg-a", 1, "127.0.0.1:1", 0), "u", "")}},
		"bad ca":       {Policy: public(2), Egresses: []*nodev1.NetworkEgress{tlsEgress(socksEgress("eg-a", 1, "127.0.0.1:1", 0), "x", "not PEM")}},
		"resolver":     {Policy: public(2), Resolver: &nodev1.NetworkResolver{ResolverId: "rs-a"}},
	} {
		err := w.n.Apply(nc)
		if err == nil {
			t.Errorf("%s: Apply accepted it", name)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
	}
	if got := w.n.Status().GetAppliedRevision(); got != 1 {
		t.Fatalf("applied revision %d after invalid configurations, want 1", got)
	}
	roundTrip(t, c)
	w.mustDial(t, dst)
	if _, err := New(testConfig(&dialLog{}), nil, &nodev1.NetworkConfig{Policy: bad}); err == nil {
		t.Fatal("New accepted an invalid configuration")
	}
}

func tlsEgress(e *nodev1.NetworkEgress, serverName, ca string) *nodev1.NetworkEgress {
	e.Spec.GetSocks5().Tls = &ctrlv1.EgressTls{ServerName: serverName, CaCert: ca}
	return e
}

// TestApplyWhileDialing: a connection decided under one configuration whose dial
// completes after another was applied is decided again.
func TestApplyWhileDialing(t *testing.T) {
	echo := echoServer(t)
	dst := standIn(t, echo)
	release := make(chan struct{})
	dialing := make(chan struct{}, 1)
	cfg := testConfig(&dialLog{})
	cfg.dial = func(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error) {
		dialing <- struct{}{}
		<-release
		var d net.Dialer
		return d.DialContext(ctx, network, addr.String())
	}
	w := newWS(t, cfg, &nodev1.NetworkConfig{Policy: public(1)})
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := w.dial(ctx, dst)
		if err == nil {
			c.Close()
		}
		errc <- err
	}()
	<-dialing
	p := public(2)
	p.Deny = []*ctrlv1.Destination{hostDest(dst)}
	if err := w.n.Apply(&nodev1.NetworkConfig{Policy: p}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a dial that completed after its destination was denied: %v, want refused", err)
	}
}

// TestEgressRebinding: an Egress host name is resolved on every dial, every answer
// checked, and only the checked literal dialed: a name that answered a public
// address once and loopback next is refused the second time without a dial.
func TestEgressRebinding(t *testing.T) {
	// First a public address (the test dialer records it and sends nothing), then
	// loopback.
	answers := []string{"1.2.3.4", "127.0.0.1"}
	var mu sync.Mutex
	var asked []string
	srv := dnsServe(t, "udp", func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg).SetReply(q)
		if q.Question[0].Qtype == dns.TypeA && q.Question[0].Name == "egress.test." {
			mu.Lock()
			a := answers[min(len(asked), len(answers)-1)]
			asked = append(asked, a)
			mu.Unlock()
			r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 0}, A: net.ParseIP(a)})
		}
		w.WriteMsg(r)
	})
	log := &dialLog{}
	cfg := testConfig(log)
	cfg.Checker = &netguard.Checker{Allow: []netip.Prefix{standIns}, Resolver: &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", srv)
	}}}
	p := public(1)
	p.Egresses = []*ctrlv1.EgressRoute{route("eg-a", dest("198.51.100.0/24"))}
	w := newWS(t, cfg, &nodev1.NetworkConfig{Policy: p, Egresses: []*nodev1.NetworkEgress{socksEgress("eg-a", 1, "egress.test:1080", 0)}})
	dst := netip.MustParseAddrPort("198.51.100.1:80")
	w.mustRefuse(t, dst)
	w.mustRefuse(t, dst)
	if got := log.seen(); !slices.Equal(got, []string{"tcp 1.2.3.4:1080"}) {
		t.Fatalf("node dialed %q, want only the checked public answer 1.2.3.4:1080", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 {
		t.Fatalf("the egress name was resolved %d times, want once per dial (2)", len(asked))
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	echo := echoServer(t)
	dst := standIn(t, echo)
	fake := newFakeSOCKS(t, "", "")
	resolver := dnsServe(t, "udp", answerA("198.51.100.7"))
	before := runtime.NumGoroutine()
	p := public(1)
	p.Egresses = []*ctrlv1.EgressRoute{route("eg-a", hostDest(dst))}
	p.Dns = &ctrlv1.DnsConfig{ResolverId: "rs-a"}
	nc := &nodev1.NetworkConfig{Policy: p, Egresses: []*nodev1.NetworkEgress{socksEgress("eg-a", 1, fake.addr, 0)}, Resolver: udpResolver("rs-a", resolver)}
	w := newWS(t, testConfig(&dialLog{}), nc)
	w.mustDial(t, dst)
	w.mustDial(t, netip.AddrPortFrom(netip.MustParseAddr("198.51.100.2"), dst.Port()))
	p2 := public(2)
	p2.Dns = p.Dns
	if err := w.n.Apply(&nodev1.NetworkConfig{Policy: p2, DrainSeconds: 600, Resolver: nc.Resolver, Egresses: nc.Egresses}); err != nil {
		t.Fatal(err)
	}
	if r := w.query(t, "udp", "a.test.", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("rcode %d", r.Rcode)
	}
	tcpDNS := w.dnsConn(t, "tcp") // idle TCP connection to the DNS server
	_ = tcpDNS
	start := time.Now()
	w.close()
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if w.n.Conns() != 0 {
		t.Fatalf("Conns = %d after Close", w.n.Conns())
	}
	if err := w.n.Apply(nc); err == nil {
		t.Fatal("Apply after Close succeeded")
	}
	settled(t, before)
}

func TestEgressTLS(t *testing.T) {
	echo := echoServer(t)
	dst := standIn(t, echo)
	pki := newTestPKI(t)
	fake := newFakeSOCKSOn(t, "u", "p", pki.serverConfig(t))
	p := public(1)
	p.Egresses = []*ctrlv1.EgressRoute{route("eg-a", dest("198.51.100.0/24"))}
	nc := func(rev uint64, serverName string, ca []byte) *nodev1.NetworkConfig {
		return &nodev1.NetworkConfig{Policy: p, Egresses: []*nodev1.NetworkEgress{
			tlsEgress(withAuth(socksEgress("eg-a", rev, fake.addr, 0), "u", "p"), serverName, string(ca)),
		}}
	}
	w := newWS(t, testConfig(&dialLog{}), nc(1, "socks.test", pki.caPEM))
	w.mustDial(t, dst)
	// No server_name: the endpoint's host (an IP in the certificate) is verified.
	if err := w.n.Apply(nc(2, "", pki.caPEM)); err != nil {
		t.Fatal(err)
	}
	w.mustDial(t, dst)
	// A CA that did not sign the endpoint's certificate, or a name it does not
	// carry: a RST, no CONNECT.
	before := fake.connects()
	for rev, tc := range []struct {
		name string
		ca   []byte
	}{{"socks.test", newTestPKI(t).caPEM}, {"other.test", pki.caPEM}} {
		if err := w.n.Apply(nc(uint64(3+rev), tc.name, tc.ca)); err != nil {
			t.Fatal(err)
		}
		w.mustRefuse(t, dst)
	}
	if fake.connects() != before {
		t.Fatal("a CONNECT went through an unverified TLS endpoint")
	}
}
