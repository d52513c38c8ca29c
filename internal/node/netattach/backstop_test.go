//go:build linux

package netattach

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/netguard"
)

func TestIntervalElements(t *testing.T) {
	ps := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	for _, tc := range []struct {
		in   []netip.Prefix
		want []string // first and end+1 ("" when it runs to the end)
	}{
		{nil, nil},
		{ps("10.0.0.0/8", "10.1.0.0/16"), []string{"10.0.0.0", "11.0.0.0"}},
		{ps("10.0.0.0/9", "10.128.0.0/9"), []string{"10.0.0.0", "11.0.0.0"}},
		{ps("192.168.0.0/16", "10.0.0.0/8"), []string{"10.0.0.0", "11.0.0.0", "192.168.0.0", "192.169.0.0"}},
		{ps("240.0.0.0/4", "255.255.255.255/32"), []string{"240.0.0.0", ""}},
		{ps("8000::/1", "fe80::/10", "::/3"), []string{"::", "2000::", "8000::", ""}},
	} {
		var got []string
		els := intervalElements(tc.in)
		for i, e := range els {
			a, _ := netip.AddrFromSlice(e.Key)
			if e.IntervalEnd != (i%2 == 1) {
				t.Errorf("%v: element %d interval end %v", tc.in, i, e.IntervalEnd)
			}
			got = append(got, a.String())
		}
		if len(got)%2 == 1 {
			got = append(got, "")
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%v: %v, want %v", tc.in, got, tc.want)
		}
	}
	// The whole special-purpose table merges into disjoint ranges.
	var v4, v6 []netip.Prefix
	for _, r := range netguard.Ranges() {
		if r.Prefix.Addr().Is4() {
			v4 = append(v4, r.Prefix)
		} else {
			v6 = append(v6, r.Prefix)
		}
	}
	for _, set := range [][]netip.Prefix{v4, v6} {
		rs := mergeRanges(set)
		for i := 1; i < len(rs); i++ {
			if rs[i].first.Compare(rs[i-1].last.Next()) <= 0 {
				t.Errorf("ranges %v and %v overlap or touch", rs[i-1], rs[i])
			}
		}
	}
}

// TestBackstop: in a namespace of its own (the node's) joined by a veth to
// a peer namespace, with the backstop installed: a marked socket cannot
// reach loopback or an address of the node's own, even one inside the
// allow-list, nor a private address outside the allow-list; it reaches the
// allow-listed peer. Unmarked sockets reach everything. A second install
// replaces the table (a shorter allow-list then refuses the peer).
func TestBackstop(t *testing.T) {
	requireRoot(t)
	node, peer := newNetns(t), newNetns(t)
	hn, hp := handleIn(t, node), handleIn(t, peer)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kbn0"}, PeerName: "kbp0", PeerNamespace: netlink.NsFd(int(peer.Fd()))}
	if err := hn.LinkAdd(veth); err != nil {
		t.Fatalf("veth: %v", err)
	}
	cfg := func(h *netlink.Handle, name string, addrs ...string) {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			ad, _ := netlink.ParseAddr(a)
			ad.Flags = unix.IFA_F_NODAD
			if err := h.AddrAdd(l, ad); err != nil {
				t.Fatal(err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	cfg(hn, "kbn0", "10.123.0.1/24", "fd00:1::1/64")
	cfg(hp, "kbp0", "10.123.0.2/24", "10.124.0.2/24", "fd00:1::2/64", "fd00:2::2/64")
	kbn0, _ := hn.LinkByName("kbn0")
	if err := hn.RouteAdd(&netlink.Route{LinkIndex: kbn0.Attrs().Index, Dst: &net.IPNet{IP: net.IP{10, 124, 0, 0}, Mask: net.CIDRMask(24, 32)},
		Gw: net.IP{10, 123, 0, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := hn.RouteAdd(&netlink.Route{LinkIndex: kbn0.Attrs().Index, Dst: &net.IPNet{IP: net.ParseIP("fd00:2::"), Mask: net.CIDRMask(64, 128)},
		Gw: net.ParseIP("fd00:1::2")}); err != nil {
		t.Fatal(err)
	}

	loop := listenIn(t, node, "tcp", "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(loop)
	loop6 := listenIn(t, node, "tcp", "[::1]:"+port)
	own := listenIn(t, node, "tcp", "10.123.0.1:"+port)
	listenIn(t, peer, "tcp", ":"+port)
	allowed := net.JoinHostPort("10.123.0.2", port)
	private := net.JoinHostPort("10.124.0.2", port)
	allowed6 := net.JoinHostPort("fd00:1::2", port)
	private6 := net.JoinHostPort("fd00:2::2", port)

	install := func(allow ...string) *Backstop {
		var ps []netip.Prefix
		for _, a := range allow {
			ps = append(ps, netip.MustParsePrefix(a))
		}
		b, err := installBackstop(ps, nftables.WithNetNSFd(int(node.Fd())))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	check := func(marked bool, addr string, reach bool) {
		t.Helper()
		start := time.Now()
		c, err := dialIn(t, node, marked, "tcp", addr)
		t.Logf("marked=%v %s: %v (%v)", marked, addr, err, time.Since(start))
		switch {
		case reach && err != nil:
			t.Errorf("marked=%v %s: %v", marked, addr, err)
		case reach:
			echoes(t, c)
		case err == nil:
			c.Close()
			t.Errorf("marked=%v %s: connected through the backstop", marked, addr)
		case !isRefused(err) || time.Since(start) > time.Second:
			t.Errorf("marked=%v %s: %v after %v, want refused at once", marked, addr, err, time.Since(start))
		}
	}

	// Without the table everything connects, marked or not.
	for _, a := range []string{loop, own, allowed, private, private6} {
		check(true, a, true)
	}
	b := install("10.123.0.0/24", "fd00:1::/64")
	install("10.123.0.0/24", "fd00:1::/64") // idempotent
	for _, a := range []string{loop, loop6, own, allowed, private, allowed6, private6} {
		check(false, a, true)
	}
	check(true, loop, false)
	check(true, loop6, false)
	check(true, own, false) // local, although allow-listed
	check(true, private, false)
	check(true, allowed, true)
	check(true, private6, false)
	check(true, allowed6, true)
	// UDP: a marked datagram to loopback is rejected too.
	var uc net.Conn
	var err error
	in(t, node, func() { uc, err = (&net.Dialer{Control: Control}).Dial("udp", loop) })
	if err != nil {
		t.Fatal(err)
	}
	uc.Write([]byte("x"))
	uc.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := uc.Read(make([]byte, 1)); !isRefused(err) {
		t.Errorf("marked UDP to loopback: %v, want refused", err)
	}
	uc.Close()

	install() // replaces the table: the peer is no longer allow-listed
	check(true, allowed, false)
	check(false, allowed, true)
	c, err := nftables.New(nftables.WithNetNSFd(int(node.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(slices.DeleteFunc(tables, func(t *nftables.Table) bool { return t.Name != TableName })); n != 1 {
		t.Errorf("%d tables named %s", n, TableName)
	}
	if err := b.Remove(); err != nil {
		t.Fatal(err)
	}
	check(true, loop, true)
}
