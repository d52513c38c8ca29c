package netguard

import (
	"net/netip"
	"testing"

	"github.com/kibotos/kibotos/internal/fault"
)

// wantFault fails the test unless err is a *fault.Error with the given
// Kind, Reason and Field. what describes the call for the message.
func wantFault(t *testing.T, what string, err error, kind fault.Kind, reason fault.Reason, field string) *fault.Error {
	t.Helper()
	if err == nil {
		t.Errorf("%s = nil, want %v/%s on field %q", what, kind, reason, field)
		return nil
	}
	fe, ok := fault.As(err)
	if !ok {
		t.Errorf("%s = %v (%T), want *fault.Error", what, err, err)
		return nil
	}
	if fe.Kind != kind || fe.Reason != reason || fe.Field != field {
		t.Errorf("%s = %v (kind %v, reason %q, field %q), want kind %v, reason %q, field %q",
			what, err, fe.Kind, fe.Reason, fe.Field, kind, reason, field)
	}
	return fe
}

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	if p.Addr().Is4() {
		b := p.Addr().As4()
		setHostBits(b[:], p.Bits())
		return netip.AddrFrom4(b)
	}
	b := p.Addr().As16()
	setHostBits(b[:], p.Bits())
	return netip.AddrFrom16(b)
}

func setHostBits(b []byte, bits int) {
	for i := bits; i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
}

// midAddr returns the address halfway through p (p itself for a host
// prefix).
func midAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr()
	}
	var b []byte
	if p.Addr().Is4() {
		a := p.Addr().As4()
		b = a[:]
	} else {
		a := p.Addr().As16()
		b = a[:]
	}
	b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	a, _ := netip.AddrFromSlice(b)
	return a
}

func TestTableWellFormed(t *testing.T) {
	seen := map[netip.Prefix]bool{}
	for _, r := range Ranges() {
		if !r.Prefix.IsValid() || r.Prefix.Masked() != r.Prefix {
			t.Errorf("table prefix %v is not a valid masked prefix", r.Prefix)
		}
		if r.Name == "" || r.Ref == "" {
			t.Errorf("table entry %v has empty Name or Ref", r.Prefix)
		}
		if seen[r.Prefix] {
			t.Errorf("table prefix %v listed twice", r.Prefix)
		}
		seen[r.Prefix] = true
	}
	// The contract names these blocks explicitly.
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.0.0.0/29", "192.0.0.8/32", "192.0.0.9/32",
		"192.0.0.10/32", "192.0.0.170/31", "192.0.2.0/24", "192.31.196.0/24", "192.52.193.0/24",
		"192.88.99.0/24", "192.168.0.0/16", "192.175.48.0/24", "198.18.0.0/15", "198.51.100.0/24",
		"203.0.113.0/24", "240.0.0.0/4", "255.255.255.255/32", "224.0.0.0/4",
		"::/128", "::1/128", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23",
		"2001::/32", "2001:2::/48", "2001:db8::/32", "2002::/16", "2620:4f:8000::/48",
		"3fff::/20", "fc00::/7", "fe80::/10", "ff00::/8",
	} {
		if !seen[netip.MustParsePrefix(s)] {
			t.Errorf("table lacks %s", s)
		}
	}
}

// TestEveryTableRow checks the first, middle and last address of every
// table row, and for IPv4 rows their IPv4-mapped forms.
func TestEveryTableRow(t *testing.T) {
	var c Checker
	for _, row := range Ranges() {
		for _, a := range []netip.Addr{row.Prefix.Addr(), midAddr(row.Prefix), lastAddr(row.Prefix)} {
			forms := []netip.Addr{a}
			if a.Is4() {
				forms = append(forms, netip.AddrFrom16(a.As16()))
			}
			for _, f := range forms {
				got, ok := Classify(f)
				if !ok {
					t.Errorf("Classify(%v) = not special, want inside %v (%s)", f, row.Prefix, row.Name)
					continue
				}
				if !got.Prefix.Contains(a) || got.Prefix.Bits() < row.Prefix.Bits() {
					t.Errorf("Classify(%v) = %v (%s), want %v or a more specific entry", f, got.Prefix, got.Name, row.Prefix)
				}
				err := c.CheckAddr("spec.egress.address", f)
				wantFault(t, "CheckAddr("+f.String()+")", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "spec.egress.address")
			}
		}
	}
}

func TestClassifyNames(t *testing.T) {
	tests := []struct {
		addr   string
		prefix string
		name   string
	}{
		{"0.0.0.0", "0.0.0.0/32", "This host on this network"},
		{"0.1.2.3", "0.0.0.0/8", "This network"},
		{"192.0.0.1", "192.0.0.0/29", "IPv4 Service Continuity Prefix"},
		{"192.0.0.8", "192.0.0.8/32", "IPv4 dummy address"},
		{"192.0.0.9", "192.0.0.9/32", "Port Control Protocol Anycast"},
		{"192.0.0.10", "192.0.0.10/32", "Traversal Using Relays around NAT Anycast"},
		{"192.0.0.170", "192.0.0.170/31", "NAT64/DNS64 Discovery"},
		{"192.0.0.171", "192.0.0.170/31", "NAT64/DNS64 Discovery"},
		{"192.0.0.11", "192.0.0.0/24", "IETF Protocol Assignments"},
		{"192.0.0.255", "192.0.0.0/24", "IETF Protocol Assignments"},
		{"192.88.99.2", "192.88.99.2/32", "6a44-relay anycast address"},
		{"239.255.255.250", "224.0.0.0/4", "Multicast"},
		{"255.255.255.255", "255.255.255.255/32", "Limited Broadcast"},
		{"255.255.255.254", "240.0.0.0/4", "Reserved"},
		{"::ffff:127.0.0.1", "127.0.0.0/8", "Loopback"},
		{"::", "::/128", "Unspecified Address"},
		{"::1", "::1/128", "Loopback Address"},
		{"::2", "::/96", "Deprecated IPv4-Compatible Address"},
		{"::8.8.8.8", "::/96", "Deprecated IPv4-Compatible Address"},
		{"::1:0:0:0", "::/3", notGlobal},
		{"1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "::/3", notGlobal},
		{"4000::", "4000::/2", notGlobal},
		{"8000::", "8000::/1", notGlobal},
		{"64:ff9b::8.8.8.8", "64:ff9b::/96", "IPv4-IPv6 Translation (NAT64)"},
		{"64:ff9b:1::a00:1", "64:ff9b:1::/48", "Local-Use IPv4/IPv6 Translation"},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001::/32", "TEREDO"},
		{"2001:1::1", "2001:1::1/128", "Port Control Protocol Anycast"},
		{"2001:1::4", "2001::/23", "IETF Protocol Assignments"},
		{"2001:2::1", "2001:2::/48", "Benchmarking"},
		{"2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", "2001::/23", "IETF Protocol Assignments"},
		{"2001:db8::1", "2001:db8::/32", "Documentation"},
		{"2002:808:808::1", "2002::/16", "6to4"},
		{"2002:c000:0201::1", "2002::/16", "6to4"},
		{"2620:4f:8000::1", "2620:4f:8000::/48", "Direct Delegation AS112 Service"},
		{"3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", "3fff::/20", "Documentation"},
		{"5f00::1", "5f00::/16", "Segment Routing (SRv6) SIDs"},
		{"fd00::1", "fc00::/7", "Unique-Local"},
		{"fe80::1%eth0", "fe80::/10", "Link-Local Unicast"},
		{"ff02::1", "ff00::/8", "Multicast"},
	}
	for _, tt := range tests {
		got, ok := Classify(netip.MustParseAddr(tt.addr))
		if !ok || got.Prefix != netip.MustParsePrefix(tt.prefix) || got.Name != tt.name {
			t.Errorf("Classify(%s) = %v %q %v, want %s %q true", tt.addr, got.Prefix, got.Name, ok, tt.prefix, tt.name)
		}
	}
	if got, ok := Classify(netip.Addr{}); ok {
		t.Errorf("Classify(zero Addr) = %v, true, want false", got)
	}
}

// TestGlobalUnicastIsNotEnough proves that netip's IsGlobalUnicast accepts
// addresses this package must reject.
func TestGlobalUnicastIsNotEnough(t *testing.T) {
	var c Checker
	for _, s := range []string{
		"192.0.2.1", "198.51.100.1", "203.0.113.1", "198.18.0.1", "198.19.255.255",
		"240.0.0.1", "192.31.196.1", "192.52.193.1", "192.88.99.1", "192.175.48.1",
		"100.64.0.1", "2001:db8::1", "3fff::1", "2001::1", "2002:808:808::1", "2620:4f:8000::1",
	} {
		a := netip.MustParseAddr(s)
		if !a.IsGlobalUnicast() {
			t.Fatalf("precondition: %v.IsGlobalUnicast() = false", a)
		}
		err := c.CheckAddr("f", a)
		wantFault(t, "CheckAddr("+s+")", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "f")
	}
}

func TestCheckAddrAllowedNeighbors(t *testing.T) {
	var c Checker
	for _, s := range []string{
		"1.0.0.0", "1.1.1.1", "8.8.8.8", "9.255.255.255", "11.0.0.0",
		"100.63.255.255", "100.128.0.0", "126.255.255.255", "128.0.0.0",
		"169.253.255.255", "169.255.0.0", "172.15.255.255", "172.32.0.0",
		"191.255.255.255", "192.0.1.0", "192.0.1.255", "192.0.3.0",
		"192.31.195.255", "192.31.197.0", "192.52.192.255", "192.52.194.0",
		"192.88.98.255", "192.88.100.0", "192.167.255.255", "192.169.0.0",
		"192.175.47.255", "192.175.49.0", "198.17.255.255", "198.20.0.0",
		"198.51.99.255", "198.51.101.0", "203.0.112.255", "203.0.114.0",
		"223.255.255.255",
		"::ffff:8.8.8.8", "::ffff:1.1.1.1",
		"2606:4700::1111", "2001:4860:4860::8888", "2000::", "2001:200::",
		"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db9::", "2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
		"2003::", "2620:4f:7fff:ffff:ffff:ffff:ffff:ffff", "2620:4f:8001::",
		"3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "3fff:1000::",
		"3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
	} {
		a := netip.MustParseAddr(s)
		if r, ok := Classify(a); ok {
			t.Errorf("Classify(%v) = %v (%s), want not special", a, r.Prefix, r.Name)
		}
		if err := c.CheckAddr("f", a); err != nil {
			t.Errorf("CheckAddr(%v) = %v, want nil", a, err)
		}
	}
}

func TestCheckAddrMappedAndEmbedded(t *testing.T) {
	var c Checker
	tests := []struct {
		addr    string
		allowed bool
	}{
		{"::ffff:127.0.0.1", false},
		{"::ffff:10.0.0.1", false},
		{"::ffff:169.254.169.254", false},
		{"::ffff:0.0.0.0", false},
		{"::ffff:8.8.8.8", true},
		// NAT64, 6to4, Teredo and IPv4-compatible forms are forbidden as
		// ranges, even when the embedded IPv4 address is public.
		{"64:ff9b::8.8.8.8", false},
		{"64:ff9b::127.0.0.1", false},
		{"64:ff9b:1::808:808", false},
		{"2002:808:808::1", false},
		{"2002:7f00:1::1", false},
		{"2001:0:808:808::1", false},
		{"::8.8.8.8", false},
		{"::127.0.0.1", false},
	}
	for _, tt := range tests {
		a := netip.MustParseAddr(tt.addr)
		err := c.CheckAddr("f", a)
		if tt.allowed {
			if err != nil {
				t.Errorf("CheckAddr(%v) = %v, want nil", a, err)
			}
			continue
		}
		wantFault(t, "CheckAddr("+tt.addr+")", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "f")
	}
}

func TestCheckAddrInvalid(t *testing.T) {
	var c Checker
	err := c.CheckAddr("spec.dns.address", netip.Addr{})
	wantFault(t, "CheckAddr(zero)", err, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "spec.dns.address")
}

func TestCheckAddrAllowList(t *testing.T) {
	allow, err := ParseAllowList("127.0.0.0/8, ::1")
	if err != nil {
		t.Fatalf("ParseAllowList = %v", err)
	}
	c := &Checker{Allow: allow}
	tests := []struct {
		addr    string
		allowed bool
	}{
		{"127.0.0.1", true},
		{"127.255.255.255", true},
		{"::ffff:127.0.0.1", true},
		{"::1", true},
		{"8.8.8.8", true},
		{"10.0.0.1", false},
		{"::ffff:10.0.0.1", false},
		{"::2", false},
		{"128.0.0.0", true},
		{"126.255.255.255", true},
		{"169.254.169.254", false},
	}
	for _, tt := range tests {
		a := netip.MustParseAddr(tt.addr)
		err := c.CheckAddr("f", a)
		if tt.allowed {
			if err != nil {
				t.Errorf("CheckAddr(%v) = %v, want nil", a, err)
			}
			continue
		}
		wantFault(t, "CheckAddr("+tt.addr+")", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "f")
	}

	// A mapped allow-list prefix set directly on Checker is unmapped too.
	c = &Checker{Allow: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}}
	if err := c.CheckAddr("f", netip.MustParseAddr("10.1.2.3")); err != nil {
		t.Errorf("CheckAddr(10.1.2.3) with ::ffff:10.0.0.0/104 allowed = %v, want nil", err)
	}
	// A nil *Checker forbids everything special.
	var nilc *Checker
	err = nilc.CheckAddr("f", netip.MustParseAddr("127.0.0.1"))
	wantFault(t, "nil.CheckAddr(127.0.0.1)", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "f")
}

func TestParseAllowList(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		bad  bool
	}{
		{in: "", want: nil},
		{in: "   ", want: nil},
		{in: "127.0.0.0/8", want: []string{"127.0.0.0/8"}},
		{in: "127.0.0.0/8,::1", want: []string{"127.0.0.0/8", "::1/128"}},
		{in: " 10.0.0.1 , fd00::/8 ", want: []string{"10.0.0.1/32", "fd00::/8"}},
		{in: "::ffff:127.0.0.1", want: []string{"127.0.0.1/32"}},
		{in: "::ffff:127.0.0.0/104", want: []string{"127.0.0.0/8"}},
		{in: "0.0.0.0/0", want: []string{"0.0.0.0/0"}},
		{in: "127.0.0.1/8", bad: true},
		{in: "127.0.0.0/33", bad: true},
		{in: "10.0.0.0/8,", bad: true},
		{in: ",10.0.0.0/8", bad: true},
		{in: "10.0.0.0/8,,::1", bad: true},
		{in: "fe80::1%eth0", bad: true},
		{in: "fe80::/10%eth0", bad: true},
		{in: "localhost", bad: true},
		{in: "10.0.0.0/", bad: true},
		{in: "10.0.0.0 /8", bad: true},
	}
	for _, tt := range tests {
		got, err := ParseAllowList(tt.in)
		if tt.bad {
			wantFault(t, "ParseAllowList("+tt.in+")", err, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "")
			continue
		}
		if err != nil {
			t.Errorf("ParseAllowList(%q) = %v, want %v", tt.in, err, tt.want)
			continue
		}
		if len(got) != len(tt.want) {
			t.Errorf("ParseAllowList(%q) = %v, want %v", tt.in, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != netip.MustParsePrefix(tt.want[i]) {
				t.Errorf("ParseAllowList(%q)[%d] = %v, want %v", tt.in, i, got[i], tt.want[i])
			}
		}
	}
}
