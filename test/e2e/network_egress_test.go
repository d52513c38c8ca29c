package e2e

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/nettest"
)

// secret records an Egress password: the env checks at its end that no
// log of ctrl or the node holds it.
func (e *netEnv) secret(s string) {
	if s == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.secrets == nil {
		e.t.Cleanup(e.checkSecrets)
	}
	e.secrets = append(e.secrets, s)
}

// checkSecrets fails the test when a log holds a recorded password.
func (e *netEnv) checkSecrets() {
	ctrlLog, nodeLog := e.logs()
	for _, s := range e.secrets {
		if strings.Contains(ctrlLog, s) {
			e.t.Errorf("ctrl's log holds an Egress password")
		}
		if strings.Contains(nodeLog, s) {
			e.t.Errorf("the node's log holds an Egress password")
		}
	}
}

// socks5 is the spec of an Egress to d (its credentials recorded as
// secrets).
func (e *netEnv) socks5(d *nettest.Dante, udp bool) *ctrlv1.EgressSpec {
	e.secret(d.Password)
	return socks5Spec(d, udp)
}

// holdConn starts `netprobe hold dst` in the workspace and returns it with
// the server's side of its connection.
func (w *netWS) holdConn(t *testing.T, s *nettest.TCPServer) (*bgProc, *nettest.Conn) {
	t.Helper()
	b := w.start("/tmp/netprobe", "hold", s.Addr.String())
	b.waitFor(t, "connected ", 15*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("the hold connection did not arrive: %v (probe said %q)", err, b.output())
	}
	return b, c
}

// openFor checks that c is still open d after from, and waits until then.
func openFor(t *testing.T, what string, c *nettest.Conn, from time.Time, d time.Duration) {
	t.Helper()
	select {
	case <-c.Done():
		at, err := c.Ended()
		t.Fatalf("%s ended %s after the change (%v), want it open at least %s", what, at.Sub(from).Round(time.Millisecond), err, d)
	case <-time.After(time.Until(from.Add(d))):
	}
}

// closedBy checks that c ends by from+d and returns when it ended.
func closedBy(t *testing.T, what string, c *nettest.Conn, from time.Time, d time.Duration) time.Duration {
	t.Helper()
	select {
	case <-c.Done():
		at, _ := c.Ended()
		return at.Sub(from)
	case <-time.After(time.Until(from.Add(d))):
		t.Fatalf("%s still open %s after the change", what, d)
	}
	return 0
}

// TestNetworkEgressRouting: the first policy entry covering a destination
// sends it through its Egress (RFC 1929 auth, or none, or inside TLS);
// destinations no entry covers leave directly; deny and allow are decided
// before any Egress; an Egress that refuses (a wrong password, a foreign
// CA) is a refused connection, not a hung one.
func TestNetworkEgressRouting(t *testing.T) {
	e := newNetEnv(t)
	a, b, c := nettest.NewPeer(t), nettest.NewPeer(t), nettest.NewPeer(t)
	da, err := a.Dante(nettest.DanteOptions{Auth: true})
	must(t, err)
	db, err := b.Dante(nettest.DanteOptions{})
	must(t, err)
	front, err := a.TLS(da.Addr)
	must(t, err)
	h, err := c.HTTP(nil)
	must(t, err)
	other, err := b.HTTP(nil)
	must(t, err)

	egA := e.mustEgress(e.socks5(da, false))
	egB := e.mustEgress(e.socks5(db, false))
	tlsSpec := e.socks5(da, false)
	tlsSpec.GetSocks5().Address = front.Addr.String()
	tlsSpec.GetSocks5().Tls = &ctrlv1.EgressTls{ServerName: front.ServerName, CaCert: string(front.CAPEM)}
	egT := e.mustEgress(tlsSpec)
	bad := e.socks5(da, false)
	bad.GetSocks5().Password = "not-" + da.Password
	egBad := e.mustEgress(bad)
	foreign, err := nettest.NewTestPKI(nettest.TLSServerName)
	must(t, err)
	foreignSpec := e.socks5(da, false)
	foreignSpec.GetSocks5().Address = front.Addr.String()
	foreignSpec.GetSocks5().Tls = &ctrlv1.EgressTls{ServerName: front.ServerName, CaCert: string(foreign.CAPEM)}
	egForeign := e.mustEgress(foreignSpec)

	cHost := netip.PrefixFrom(c.Addr, 32).String()
	hPort := uint32(h.Addr.Port())
	w := e.workspace(publicPolicy(nil, nil, route(egA.GetEgressId(), dest(cHost, hPort)), route(egB.GetEgressId(), dest(c.Prefix.String()))))
	w.whoami(t, h, a.Addr) // the first entry: a's Dante, with auth
	ctx := withTimeout(t, 10*time.Second)
	if got, err := da.WaitConnect(ctx, h.Addr); err != nil {
		t.Fatal(err)
	} else if got.Client.Addr() != a.HostAddr {
		t.Errorf("a's Dante was asked by %s, want the node (the host end of a's link, %s)", got.Client, a.HostAddr)
	}
	w.whoami(t, other, b.HostAddr) // covered by no entry: direct

	ws := e.mustSetPolicy(w.id, publicPolicy(nil, nil, route(egB.GetEgressId(), dest(c.Prefix.String())), route(egA.GetEgressId(), dest(cHost, hPort))), nil)
	w.whoami(t, h, b.Addr) // now b's entry comes first
	if !egressApplied(ws, egA.GetEgressId(), 1) || !egressApplied(ws, egB.GetEgressId(), 1) {
		t.Errorf("egress status %v, want both at revision 1", ws.GetNetworkPolicyStatus().GetEgresses())
	}

	e.mustSetPolicy(w.id, publicPolicy(nil, nil, route(egT.GetEgressId(), dest(c.Prefix.String()))), nil)
	w.whoami(t, h, a.Addr) // SOCKS5 inside TLS to socat, then a's Dante

	for _, tc := range []struct {
		name   string
		policy *ctrlv1.NetworkPolicy
	}{
		{"a wrong password", publicPolicy(nil, nil, route(egBad.GetEgressId(), dest(c.Prefix.String())))},
		{"a foreign CA", publicPolicy(nil, nil, route(egForeign.GetEgressId(), dest(c.Prefix.String())))},
		{"deny before the Egress", publicPolicy(nil, []*ctrlv1.Destination{dest(cHost)}, route(egA.GetEgressId(), dest(c.Prefix.String())))},
		{"allow before the Egress", publicPolicy([]*ctrlv1.Destination{dest(b.Prefix.String())}, nil, route(egA.GetEgressId(), dest(c.Prefix.String())))},
	} {
		e.mustSetPolicy(w.id, tc.policy, ptr(uint32(0)))
		t0 := time.Now()
		if got := w.dial(h.Addr.String()); got != "refused" {
			t.Errorf("%s: dial %s = %s, want refused", tc.name, h.Addr, got)
		}
		if took := time.Since(t0); took > 8*time.Second {
			t.Errorf("%s: the refusal took %s", tc.name, took)
		}
	}
	// Nothing in a response shows the password.
	g, err := e.eg.GetEgress(t.Context(), connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: egA.GetEgressId()}))
	must(t, err)
	if strings.Contains(g.Msg.String(), da.Password) || strings.Contains(egA.String(), da.Password) {
		t.Error("an Egress response holds the password")
	}
}

// TestNetworkEgressEndpointChecked: the Egress endpoint is checked on every
// dial: a name that answered a peer's address at CreateEgress and loopback
// afterwards (DNS rebinding) is refused at dial, and so is an endpoint on
// the host's own address (admitted by the allow-list, refused by the
// kernel backstop); a name with one private address among its answers is
// refused at create.
func TestNetworkEgressEndpointChecked(t *testing.T) {
	e := newNetEnv(t)
	a, c := nettest.NewPeer(t), nettest.NewPeer(t)
	da, err := a.Dante(nettest.DanteOptions{})
	must(t, err)
	h, err := c.HTTP(nil)
	must(t, err)
	// Something on the host's loopback at the Dante's port, and on the host
	// end of a's link: the rebinding name's second answer and the
	// backstop's case. Neither may see a connection.
	cn := newCanaryOn(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), da.Addr.Port()), netip.AddrPortFrom(a.HostAddr, da.Addr.Port()))

	rebind := "rebind-egress.kibotos.test"
	e.dns.SetSequence(rebind, []netip.Addr{a.Addr}, []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	spec := e.socks5(da, false)
	spec.GetSocks5().Address = net.JoinHostPort(rebind, strconv.Itoa(int(da.Addr.Port())))
	egRebind := e.mustEgress(spec) // ctrl's one lookup saw a's address
	if n := len(e.dns.QueriesFor(rebind)); n == 0 {
		t.Fatal("ctrl did not resolve the Egress's name with the test DNS server")
	}
	local := e.socks5(da, false)
	local.GetSocks5().Address = netip.AddrPortFrom(a.HostAddr, da.Addr.Port()).String()
	egLocal := e.mustEgress(local) // in the allow-list

	multi := "multi-egress.kibotos.test"
	e.dns.Set(multi, a.Addr, netip.MustParseAddr("10.0.0.1"))
	spec = e.socks5(da, false)
	spec.GetSocks5().Address = multi + ":1080"
	if _, err := e.createEgress(spec); connect.CodeOf(err) != connect.CodeInvalidArgument || detailOf(err).GetReason() != ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN {
		t.Errorf("CreateEgress on a name with a private address among its answers: %v", err)
	}

	w := e.workspace(publicPolicy(nil, nil, route(egRebind.GetEgressId(), dest(c.Prefix.String()))))
	if got := w.dial(h.Addr.String()); got != "refused" {
		t.Errorf("through the rebinding Egress: %s, want refused", got)
	}
	if qs := e.dns.QueriesFor(rebind); len(qs) < 2 {
		t.Errorf("the node did not resolve the Egress's name again at dial (%d queries)", len(qs))
	}
	e.mustSetPolicy(w.id, publicPolicy(nil, nil, route(egLocal.GetEgressId(), dest(c.Prefix.String()))), ptr(uint32(0)))
	if got := w.dial(h.Addr.String()); got != "refused" {
		t.Errorf("through an Egress on the host's own address: %s, want refused", got)
	}
	if cs := da.Connects(); len(cs) > 0 {
		t.Errorf("Dante passed %v", cs)
	}
	cn.check(t)
}

// TestNetworkEgressDrain: UpdateEgress switches new connections at once
// and reports the applied revision; connections on the previous revision
// close at once with drain_seconds 0 and after drain_seconds otherwise; a
// connection an earlier update left draining keeps its own deadline; a
// connection draining through an Egress that is deleted closes at once.
func TestNetworkEgressDrain(t *testing.T) {
	e := newNetEnv(t)
	a, b, c := nettest.NewPeer(t), nettest.NewPeer(t), nettest.NewPeer(t)
	da, err := a.Dante(nettest.DanteOptions{Auth: true})
	must(t, err)
	db, err := b.Dante(nettest.DanteOptions{})
	must(t, err)
	hs, err := c.TCP(nettest.Hold, 0)
	must(t, err)
	eg := e.mustEgress(e.socks5(da, false))
	w := e.workspace(publicPolicy(nil, nil, route(eg.GetEgressId(), dest(c.Prefix.String()))))

	via := func(conn *nettest.Conn, p *nettest.Peer) {
		t.Helper()
		if conn.Remote.Addr() != p.Addr {
			t.Fatalf("the connection came from %s, want through %s", conn.Remote, p.Addr)
		}
	}
	update := func(spec *ctrlv1.EgressSpec, drain uint32) time.Time {
		t.Helper()
		eg = e.updateEgress(eg, spec, &drain)
		t0 := time.Now()
		rev := eg.GetRevision()
		e.waitWS(w.id, 15*time.Second, "egress revision applied", func(ws *ctrlv1.Workspace) bool { return egressApplied(ws, eg.GetEgressId(), rev) })
		t.Logf("UpdateEgress to revision %d (drain %d s): applied by the workspace %s after the call returned", rev, drain, time.Since(t0).Round(time.Millisecond))
		return t0
	}

	_, c1 := w.holdConn(t, hs)
	via(c1, a)
	// drain 0: the old revision's connection closes when the new takes over.
	t0 := update(e.socks5(db, false), 0)
	t.Logf("drain 0: closed %s after the update", closedBy(t, "rev 1 connection", c1, t0, 3*time.Second))
	_, c2 := w.holdConn(t, hs)
	via(c2, b)

	// drain 4: open for 4 s, then closed.
	t0 = update(e.socks5(da, false), 4)
	_, c3 := w.holdConn(t, hs)
	via(c3, a)
	openFor(t, "rev 2 connection draining 4 s", c2, t0, 3*time.Second)
	t.Logf("drain 4: closed %s after the update", closedBy(t, "rev 2 connection", c2, t0, 7*time.Second))

	// An earlier deadline is kept: c3 drains 8 s from t1; the next update
	// (drain 0) closes only what it moved from revision 4.
	t1 := update(e.socks5(db, false), 8)
	_, c4 := w.holdConn(t, hs)
	via(c4, b)
	t2 := update(e.socks5(da, false), 0)
	closedBy(t, "rev 4 connection (drain 0)", c4, t2, 3*time.Second)
	openFor(t, "rev 3 connection left draining 8 s by an earlier update", c3, t1, 6*time.Second)
	t.Logf("earlier deadline: closed %s after its own update", closedBy(t, "rev 3 connection", c3, t1, 11*time.Second))

	// DeleteEgress closes what drains through it at once.
	eg2 := e.mustEgress(e.socks5(db, false))
	e.mustSetPolicy(w.id, publicPolicy(nil, nil, route(eg2.GetEgressId(), dest(c.Prefix.String()))), nil)
	_, c5 := w.holdConn(t, hs)
	via(c5, b)
	t3 := time.Now()
	e.mustSetPolicy(w.id, publicPolicy(nil, nil, route(eg.GetEgressId(), dest(c.Prefix.String()))), ptr(uint32(600)))
	openFor(t, "connection draining after its Egress left the policy", c5, t3, time.Second)
	if _, err := e.eg.DeleteEgress(t.Context(), connect.NewRequest(&ctrlv1.DeleteEgressRequest{Metadata: e.cmdID("egress-delete"), EgressId: eg2.GetEgressId()})); err != nil {
		t.Fatalf("DeleteEgress of an Egress no policy references: %v", err)
	}
	t4 := time.Now()
	t.Logf("DeleteEgress: the draining connection closed %s after", closedBy(t, "connection draining through the deleted Egress", c5, t4, 3*time.Second))
	// The Egress still referenced cannot be deleted.
	if _, err := e.eg.DeleteEgress(t.Context(), connect.NewRequest(&ctrlv1.DeleteEgressRequest{Metadata: e.cmdID("egress-delete"), EgressId: eg.GetEgressId()})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("DeleteEgress of a referenced Egress: %v, want failed_precondition", err)
	}
}

// TestNetworkPolicyDrain: a policy update closes at once the connections
// it no longer admits (whatever drain_seconds says), keeps those whose
// path it does not change, drains those whose path moves (direct to
// Egress, Egress to direct) for its drain_seconds, and reports the
// applied revision with each referenced Egress's.
func TestNetworkPolicyDrain(t *testing.T) {
	e := newNetEnv(t)
	a, c := nettest.NewPeer(t), nettest.NewPeer(t)
	da, err := a.Dante(nettest.DanteOptions{})
	must(t, err)
	hx, err := c.TCP(nettest.Hold, 0)
	must(t, err)
	hy, err := c.TCP(nettest.Hold, 0)
	must(t, err)
	eg := e.mustEgress(e.socks5(da, false))
	cHost := netip.PrefixFrom(c.Addr, 32).String()
	w := e.workspace(publicPolicy(nil, nil))

	_, x1 := w.holdConn(t, hx)
	_, y1 := w.holdConn(t, hy)
	if x1.Remote.Addr() != c.HostAddr {
		t.Fatalf("direct connection from %s", x1.Remote)
	}

	// Deny x: closed at once although drain is 30 s; y is untouched.
	ws := e.mustSetPolicy(w.id, publicPolicy(nil, []*ctrlv1.Destination{dest(cHost, uint32(hx.Addr.Port()))}), ptr(uint32(30)))
	t0 := time.Now()
	t.Logf("no longer admitted: closed %s after the update returned", closedBy(t, "denied connection", x1, t0, 2*time.Second))
	if len(ws.GetNetworkPolicyStatus().GetEgresses()) != 0 {
		t.Errorf("egress status %v with no Egress referenced", ws.GetNetworkPolicyStatus().GetEgresses())
	}

	// y moves from direct to the Egress: drained 3 s.
	ws = e.mustSetPolicy(w.id, publicPolicy(nil, nil, route(eg.GetEgressId(), dest(cHost, uint32(hy.Addr.Port())))), ptr(uint32(3)))
	t0 = time.Now()
	if !egressApplied(ws, eg.GetEgressId(), eg.GetRevision()) {
		t.Errorf("egress status %v, want %s at revision %d", ws.GetNetworkPolicyStatus().GetEgresses(), eg.GetEgressId(), eg.GetRevision())
	}
	_, x2 := w.holdConn(t, hx) // admitted again, direct: unchanged by what follows
	_, y2 := w.holdConn(t, hy)
	if y2.Remote.Addr() != a.Addr {
		t.Fatalf("new connection to y from %s, want through the Egress at %s", y2.Remote, a.Addr)
	}
	openFor(t, "direct connection moved to an Egress (drain 3 s)", y1, t0, 2*time.Second)
	t.Logf("direct → Egress, drain 3: closed %s after the update", closedBy(t, "moved connection", y1, t0, 6*time.Second))

	// y moves back to direct with drain 0: at once; x stays.
	e.mustSetPolicy(w.id, publicPolicy(nil, nil), ptr(uint32(0)))
	t0 = time.Now()
	closedBy(t, "Egress connection moved to direct (drain 0)", y2, t0, 2*time.Second)
	select {
	case <-x2.Done():
		t.Error("a direct connection the update did not move was closed")
	case <-time.After(500 * time.Millisecond):
	}
	// Mode NONE: everything ends at once.
	e.mustSetPolicy(w.id, &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, ptr(uint32(600)))
	closedBy(t, "connection under mode NONE", x2, time.Now(), 2*time.Second)
}
