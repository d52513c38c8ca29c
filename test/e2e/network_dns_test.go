package e2e

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/nettest"
)

// TestNetworkDNS: the workspace's resolver (the node, at the gateway's
// address, over UDP and TCP) answers REFUSED without a Resolver, forwards
// to a UDP and to a TCP Resolver directly and through an Egress (UDP
// ASSOCIATE for the UDP one, CONNECT for the TCP one: the DNS server sees
// the Dante's address), and the addresses it answers still go through the
// policy at connect time. A udp Resolver through an Egress without
// udp_enabled is failed_precondition, and so is turning udp_enabled off
// while a policy uses it.
func TestNetworkDNS(t *testing.T) {
	e := newNetEnv(t)
	d := nettest.NewPeer(t) // a DNS server and a Dante in the same namespace
	c := nettest.NewPeer(t)
	srv, err := d.DNS()
	must(t, err)
	dd, err := d.Dante(nettest.DanteOptions{Auth: true})
	must(t, err)
	h, err := c.HTTP(nil)
	must(t, err)
	name := "www.kibotos.test"
	srv.Set(name, c.Addr)
	srv.Set("denied.kibotos.test", c.Addr)

	udp := e.mustResolver(&ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: srv.Addr.String()}}})
	tcp := e.mustResolver(&ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: srv.Addr.String()}}})
	egUDP := e.mustEgress(e.socks5(dd, true))
	egNoUDP := e.mustEgress(e.socks5(dd, false))

	w := e.workspace(publicPolicy(nil, nil))
	ask := func(step, transport string, q string) string {
		t.Helper()
		args := []string{"dns"}
		if transport == "tcp" {
			args = append(args, "-tcp")
		}
		out, _ := w.probe(append(args, q)...)
		f := strings.Fields(out)
		if len(f) < 2 || f[0] != q {
			t.Fatalf("%s: netprobe dns over %s: %q", step, transport, out)
		}
		if len(f) == 2 {
			return f[1]
		}
		return f[1] + " " + f[2]
	}
	for _, tr := range []string{"udp", "tcp"} {
		if got := ask("no Resolver", tr, name); got != "REFUSED" {
			t.Errorf("no Resolver, over %s: %q, want REFUSED", tr, got)
		}
	}

	for _, tc := range []struct {
		name     string
		dns      *ctrlv1.DnsConfig
		net      string     // how the server must see the queries
		from     netip.Addr // and from where
		viaDante bool
	}{
		{"udp Resolver", &ctrlv1.DnsConfig{ResolverId: udp.GetResolverId()}, "udp", d.HostAddr, false},
		{"tcp Resolver", &ctrlv1.DnsConfig{ResolverId: tcp.GetResolverId()}, "tcp", d.HostAddr, false},
		{"udp Resolver via an Egress", &ctrlv1.DnsConfig{ResolverId: udp.GetResolverId(), ViaEgressId: egUDP.GetEgressId()}, "udp", d.Addr, true},
		{"tcp Resolver via an Egress", &ctrlv1.DnsConfig{ResolverId: tcp.GetResolverId(), ViaEgressId: egNoUDP.GetEgressId()}, "tcp", d.Addr, true},
	} {
		p := publicPolicy(nil, nil)
		p.Dns = tc.dns
		e.mustSetPolicy(w.id, p, nil)
		before := len(srv.QueriesFor(name))
		for _, tr := range []string{"udp", "tcp"} {
			if got := ask(tc.name, tr, name); got != "NOERROR "+c.Addr.String() {
				t.Errorf("%s, asked over %s: %q", tc.name, tr, got)
			}
		}
		qs := srv.QueriesFor(name)[before:]
		if len(qs) == 0 {
			t.Fatalf("%s: the DNS server saw no query", tc.name)
		}
		for _, q := range qs {
			if q.Net != tc.net || q.From.Addr() != tc.from {
				t.Errorf("%s: the DNS server saw a query over %s from %s, want over %s from %s", tc.name, q.Net, q.From, tc.net, tc.from)
			}
		}
		if tc.viaDante && tc.net == "tcp" {
			if _, err := dd.WaitConnect(withTimeout(t, 5*time.Second), srv.Addr); err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
		}
		// busybox's resolver (the default template's) gets the same answer.
		if out := w.mustRun(w.tok, "nslookup", name); !strings.Contains(out, c.Addr.String()) {
			t.Errorf("%s: busybox nslookup: %q", tc.name, out)
		}
	}

	// A resolved address goes through the policy at connect time.
	p := publicPolicy(nil, []*ctrlv1.Destination{dest(netip.PrefixFrom(c.Addr, 32).String())})
	p.Dns = &ctrlv1.DnsConfig{ResolverId: udp.GetResolverId()}
	e.mustSetPolicy(w.id, p, nil)
	target := "denied.kibotos.test:" + strconv.Itoa(int(h.Addr.Port()))
	if out, _ := w.probe("dial", target); !strings.HasPrefix(out, target+" refused ") {
		t.Errorf("a name answering a denied address: %q, want refused", out)
	}

	// udp needs udp_enabled.
	bad := publicPolicy(nil, nil)
	bad.Dns = &ctrlv1.DnsConfig{ResolverId: udp.GetResolverId(), ViaEgressId: egNoUDP.GetEgressId()}
	if _, err := e.setPolicy(w.id, bad, nil); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("a udp Resolver via an Egress without udp_enabled: %v, want failed_precondition", err)
	}
	good := publicPolicy(nil, nil)
	good.Dns = &ctrlv1.DnsConfig{ResolverId: udp.GetResolverId(), ViaEgressId: egUDP.GetEgressId()}
	e.mustSetPolicy(w.id, good, nil)
	off := e.socks5(dd, false)
	if _, err := e.eg.UpdateEgress(t.Context(), connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: e.cmdID("udp-off"),
		EgressId: egUDP.GetEgressId(), ExpectedRevision: egUDP.GetRevision(), Spec: off})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("turning udp_enabled off while a policy uses it: %v, want failed_precondition", err)
	}
}
