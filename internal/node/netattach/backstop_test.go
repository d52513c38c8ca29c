//go:build linux

package netattach

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
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

func TestBackstopOf(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "state")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	a := BackstopOf(real)
	if !regexp.MustCompile(`^kibotos-[0-9a-f]{12}$`).MatchString(a.Table) {
		t.Errorf("table %q", a.Table)
	}
	if a.Mark&^markTag != markBase || a.Mark&0xc000 != 0 {
		t.Errorf("mark %#x", a.Mark)
	}
	// One directory, however spelled, is one backstop.
	for _, spelling := range []string{real, real + "/", link, "state", "./link/../state"} {
		if b := BackstopOf(spelling); b.Table != a.Table || b.Mark != a.Mark {
			t.Errorf("BackstopOf(%q) = %s %#x, want %s %#x", spelling, b.Table, b.Mark, a.Table, a.Mark)
		}
	}
	if b := BackstopOf(filepath.Join(dir, "other")); b.Table == a.Table {
		t.Errorf("another directory has the same table %s", b.Table)
	}
}

// backstopNet is a namespace of its own (the node's) joined by a veth to a
// peer namespace that echoes on port on every address: the node's own
// addresses (loop, loop6, own), the peer's on the shared links (allowed,
// allowed6) and behind them (private, private6).
type backstopNet struct {
	node, peer                        *os.File
	loop, loop6, own                  string
	allowed, private, allowed6, priv6 string
}

func newBackstopNet(t *testing.T) *backstopNet {
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
	n := &backstopNet{node: node, peer: peer}
	n.loop = listenIn(t, node, "tcp", "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(n.loop)
	n.loop6 = listenIn(t, node, "tcp", "[::1]:"+port)
	n.own = listenIn(t, node, "tcp", "10.123.0.1:"+port)
	listenIn(t, peer, "tcp", ":"+port)
	n.allowed = net.JoinHostPort("10.123.0.2", port)
	n.private = net.JoinHostPort("10.124.0.2", port)
	n.allowed6 = net.JoinHostPort("fd00:1::2", port)
	n.priv6 = net.JoinHostPort("fd00:2::2", port)
	return n
}

// install installs, in the node's namespace, the backstop of the node with
// state directory stateDir and allow-list allow.
func (n *backstopNet) install(t *testing.T, stateDir string, allow ...string) *Backstop {
	t.Helper()
	var ps []netip.Prefix
	for _, a := range allow {
		ps = append(ps, netip.MustParsePrefix(a))
	}
	b := BackstopOf(stateDir)
	b.opts = []nftables.ConnOption{nftables.WithNetNSFd(int(n.node.Fd()))}
	if err := b.install(ps); err != nil {
		t.Fatal(err)
	}
	return b
}

// check dials addr from the node's namespace with b's mark (none when nil)
// and checks that it connects and echoes (reach) or is refused at once.
func (n *backstopNet) check(t *testing.T, b *Backstop, addr string, reach bool) {
	t.Helper()
	what := "unmarked"
	if b != nil {
		what = fmt.Sprintf("mark %#x", b.Mark)
	}
	start := time.Now()
	c, err := dialIn(t, n.node, b, "tcp", addr)
	t.Logf("%s %s: %v (%v)", what, addr, err, time.Since(start))
	switch {
	case reach && err != nil:
		t.Errorf("%s %s: %v", what, addr, err)
	case reach:
		echoes(t, c)
	case err == nil:
		c.Close()
		t.Errorf("%s %s: connected through the backstop", what, addr)
	case !isRefused(err) || time.Since(start) > time.Second:
		t.Errorf("%s %s: %v after %v, want refused at once", what, addr, err, time.Since(start))
	}
}

// tables lists the backstop tables (TablePrefix) in the node's namespace.
func (n *backstopNet) tables(t *testing.T) []string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(n.node.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tb := range ts {
		if strings.HasPrefix(tb.Name, TablePrefix) {
			out = append(out, tb.Name)
		}
	}
	slices.Sort(out)
	return out
}

// TestBackstop: with a node's backstop installed, a socket with its mark
// cannot reach loopback or an address of the node's own, even one inside
// the allow-list, nor a private address outside the allow-list; it reaches
// the allow-listed peer. Unmarked sockets reach everything. Remove takes
// the table away.
func TestBackstop(t *testing.T) {
	n := newBackstopNet(t)
	b := BackstopOf("/kibotos-test/node")
	// Without the table everything connects, marked or not.
	for _, a := range []string{n.loop, n.own, n.allowed, n.private, n.priv6} {
		n.check(t, b, a, true)
	}
	n.install(t, "/kibotos-test/node", "10.123.0.0/24", "fd00:1::/64")
	for _, a := range []string{n.loop, n.loop6, n.own, n.allowed, n.private, n.allowed6, n.priv6} {
		n.check(t, nil, a, true)
	}
	n.check(t, b, n.loop, false)
	n.check(t, b, n.loop6, false)
	n.check(t, b, n.own, false) // local, although allow-listed
	n.check(t, b, n.private, false)
	n.check(t, b, n.allowed, true)
	n.check(t, b, n.priv6, false)
	n.check(t, b, n.allowed6, true)
	// UDP: a marked datagram to loopback is rejected too.
	var uc net.Conn
	var err error
	in(t, n.node, func() { uc, err = (&net.Dialer{Control: b.Control}).Dial("udp", n.loop) })
	if err != nil {
		t.Fatal(err)
	}
	uc.Write([]byte("x"))
	uc.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := uc.Read(make([]byte, 1)); !isRefused(err) {
		t.Errorf("marked UDP to loopback: %v, want refused", err)
	}
	uc.Close()

	b.opts = []nftables.ConnOption{nftables.WithNetNSFd(int(n.node.Fd()))}
	if err := b.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(); err != nil { // gone already: no error
		t.Fatal(err)
	}
	if ts := n.tables(t); len(ts) != 0 {
		t.Errorf("tables after Remove: %v", ts)
	}
	n.check(t, b, n.loop, true)
}

// TestBackstopRestart: a node that starts again with the same state
// directory (spelled differently: through a symlink) replaces its table,
// allow-list included, instead of adding a second: the peer its first
// table refused is reachable after the second install, which only the
// first table's being gone allows (its reject would win over any accept).
func TestBackstopRestart(t *testing.T) {
	n := newBackstopNet(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(state, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	first := n.install(t, filepath.Join(dir, "link"))
	n.check(t, first, n.allowed, false)
	second := n.install(t, state, "10.123.0.0/24")
	if second.Table != first.Table || second.Mark != first.Mark {
		t.Fatalf("restart: table %s mark %#x, was %s %#x", second.Table, second.Mark, first.Table, first.Mark)
	}
	if ts := n.tables(t); !slices.Equal(ts, []string{first.Table}) {
		t.Errorf("tables after the restart: %v, want [%s]", ts, first.Table)
	}
	n.check(t, second, n.allowed, true)
	n.check(t, second, n.private, false)
	n.install(t, state, "10.123.0.0/24") // idempotent
	if ts := n.tables(t); !slices.Equal(ts, []string{first.Table}) {
		t.Errorf("tables after a third install: %v, want [%s]", ts, first.Table)
	}
	n.check(t, second, n.allowed, true)
}

// TestBackstopTwoNodes: two nodes on one host, with different allow-lists:
// each node's marked sockets obey its own table only, whichever installed
// last, and one node's restart or removal leaves the other's table as it
// was.
func TestBackstopTwoNodes(t *testing.T) {
	n := newBackstopNet(t)
	a := n.install(t, "/kibotos-test/node-a", "10.123.0.0/24", "fd00:1::/64")
	b := n.install(t, "/kibotos-test/node-b", "10.124.0.0/24")
	if a.Table == b.Table || a.Mark == b.Mark {
		t.Fatalf("two nodes share a table or mark: %s %#x, %s %#x", a.Table, a.Mark, b.Table, b.Mark)
	}
	if ts, want := n.tables(t), slices.Sorted(slices.Values([]string{a.Table, b.Table})); !slices.Equal(ts, want) {
		t.Fatalf("tables %v, want %v", ts, want)
	}
	obey := func() {
		t.Helper()
		for _, bs := range []*Backstop{a, b} {
			n.check(t, bs, n.loop, false)
			n.check(t, bs, n.own, false)
		}
		n.check(t, a, n.allowed, true)
		n.check(t, a, n.allowed6, true)
		n.check(t, a, n.private, false)
		n.check(t, b, n.allowed, false)
		n.check(t, b, n.allowed6, false)
		n.check(t, b, n.private, true)
		n.check(t, nil, n.allowed, true)
		n.check(t, nil, n.private, true)
	}
	obey()
	// A restarts (installs last now) with the same allow-list: nothing
	// changes for either.
	n.install(t, "/kibotos-test/node-a", "10.123.0.0/24", "fd00:1::/64")
	obey()
	// A's table goes: A's mark is judged by no table; B's still holds.
	a.opts = []nftables.ConnOption{nftables.WithNetNSFd(int(n.node.Fd()))}
	if err := a.Remove(); err != nil {
		t.Fatal(err)
	}
	if ts := n.tables(t); !slices.Equal(ts, []string{b.Table}) {
		t.Errorf("tables %v, want [%s]", ts, b.Table)
	}
	n.check(t, a, n.private, true)
	n.check(t, b, n.allowed, false)
	n.check(t, b, n.private, true)
}

// TestBackstopMarkCollision: a node whose derived mark another node's
// table already judges (a hash collision, or a table a gone node left)
// takes the next free mark, keeps it when it restarts, and both tables
// stay.
func TestBackstopMarkCollision(t *testing.T) {
	n := newBackstopNet(t)
	a := n.install(t, "/kibotos-test/node-a")
	opts := []nftables.ConnOption{nftables.WithNetNSFd(int(n.node.Fd()))}
	other := &Backstop{Table: TablePrefix + "collides", Mark: a.Mark, opts: opts}
	if err := other.install(nil); err != nil {
		t.Fatalf("install with another table's mark: %v", err)
	}
	if other.Mark == a.Mark || other.Mark&^markTag != markBase {
		t.Fatalf("the colliding node got mark %#x (the other's is %#x)", other.Mark, a.Mark)
	}
	if ts, want := n.tables(t), slices.Sorted(slices.Values([]string{a.Table, other.Table})); !slices.Equal(ts, want) {
		t.Errorf("tables %v, want %v", ts, want)
	}
	// Each table judges its own mark, read back as installed.
	c, err := nftables.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []*Backstop{a, other} {
		tb := &nftables.Table{Family: nftables.TableFamilyINet, Name: b.Table}
		rules, err := c.GetRules(tb, &nftables.Chain{Name: "output", Table: tb})
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := judgedMark(rules); !ok || m != b.Mark {
			t.Errorf("table %s judges %#x, %v; want %#x", b.Table, m, ok, b.Mark)
		}
	}
	// A restart of the colliding node keeps its mark.
	again := &Backstop{Table: other.Table, Mark: a.Mark, opts: opts}
	if err := again.install(nil); err != nil || again.Mark != other.Mark {
		t.Fatalf("restart: mark %#x, %v; want %#x", again.Mark, err, other.Mark)
	}
}

// TestChooseMark: the rules of chooseMark, without nftables.
func TestChooseMark(t *testing.T) {
	m := func(low uint32) uint32 { return markBase | low }
	for _, tc := range []struct {
		name         string
		derived, own uint32
		others       []uint32
		want         uint32
	}{
		{"free", m(5), 0, nil, m(5)},
		{"own kept", m(5), m(9), nil, m(9)},
		{"own taken meanwhile", m(5), m(9), []uint32{m(9)}, m(5)},
		{"foreign own ignored", m(5), 0x1234, nil, m(5)},
		{"collision steps on", m(5), 0, []uint32{m(5), m(6)}, m(7)},
		{"wraps", m(markTag), 0, []uint32{m(markTag)}, m(0)},
	} {
		others := map[uint32]string{}
		for _, o := range tc.others {
			others[o] = "x"
		}
		if got, err := chooseMark(tc.derived, tc.own, others); err != nil || got != tc.want {
			t.Errorf("%s: chooseMark = %#x, %v; want %#x", tc.name, got, err, tc.want)
		}
	}
	all := map[uint32]string{}
	for i := uint32(0); i <= markTag; i++ {
		all[m(i)] = "x"
	}
	if _, err := chooseMark(m(1), 0, all); err == nil {
		t.Error("chooseMark found a mark with every one taken")
	}
}
