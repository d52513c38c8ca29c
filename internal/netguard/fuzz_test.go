package netguard

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/fault"
)

func FuzzParseHostPort(f *testing.F) {
	for _, s := range []string{"example.com:53", "[::1]:80", "1.2.3.4:65535", "a:0", "[fe80::1%eth0]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		host, port, err := ParseHostPort("f", s)
		if err != nil {
			fe, ok := fault.As(err)
			if !ok || fe.Kind != fault.KindInvalidArgument || fe.Reason != fault.ReasonInvalidArgument || fe.Field != "f" {
				t.Fatalf("ParseHostPort(%q) = %v, want invalid_argument on f", s, err)
			}
			if len(fe.Message) > 200 {
				t.Fatalf("ParseHostPort(%q) message is %d bytes, want bounded", s, len(fe.Message))
			}
			if host != "" || port != 0 {
				t.Fatalf("ParseHostPort(%q) = %q, %d with error", s, host, port)
			}
			return
		}
		if host == "" || port == 0 {
			t.Fatalf("ParseHostPort(%q) = %q, %d, nil: empty host or zero port", s, host, port)
		}
		if strings.ContainsAny(host, "%[]@/ \t\r\n\x00") {
			t.Fatalf("ParseHostPort(%q) host %q has a forbidden character", s, host)
		}
		// Accepted input is exactly the canonical join of its parts...
		if j := net.JoinHostPort(host, strconv.Itoa(int(port))); j != s {
			t.Fatalf("ParseHostPort(%q) = %q, %d; joined back %q", s, host, port, j)
		}
		// ...and agrees with the standard library's lenient splitter.
		h2, p2, err := net.SplitHostPort(s)
		if err != nil || h2 != host || p2 != strconv.Itoa(int(port)) {
			t.Fatalf("ParseHostPort(%q) = %q, %d but net.SplitHostPort = %q, %q, %v", s, host, port, h2, p2, err)
		}
		if a, err := netip.ParseAddr(host); err == nil {
			if a.Zone() != "" {
				t.Fatalf("ParseHostPort(%q) accepted zone %q", s, a.Zone())
			}
			if a.Is6() != strings.HasPrefix(s, "[") {
				t.Fatalf("ParseHostPort(%q): bracket use does not match address family", s)
			}
		} else if msg := checkHostname(host); msg != "" {
			t.Fatalf("ParseHostPort(%q) accepted host %q that is neither IP nor name: %s", s, host, msg)
		}
	})
}

func FuzzCheckAddr(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "8.8.8.8", "::ffff:10.0.0.1", "2606:4700::1111", "fe80::1"} {
		a := netip.MustParseAddr(s).As16()
		f.Add(a[:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var a netip.Addr
		switch {
		case len(data) == 4:
			a = netip.AddrFrom4([4]byte(data))
		case len(data) >= 16:
			a = netip.AddrFrom16([16]byte(data[:16]))
		default:
			var b [16]byte
			copy(b[:], data)
			a = netip.AddrFrom16(b)
		}
		u := a.Unmap()
		r, special := Classify(a)
		ru, specialU := Classify(u)
		if special != specialU || r != ru {
			t.Fatalf("Classify(%v) = %v %v, Classify(%v) = %v %v; want equal", a, r, special, u, ru, specialU)
		}
		if u.Is4() {
			m := netip.AddrFrom16(u.As16())
			if rm, sm := Classify(m); rm != r || sm != special {
				t.Fatalf("Classify(%v) = %v %v, Classify(%v) = %v %v; want equal", m, rm, sm, u, r, special)
			}
		}
		var c Checker
		err := c.CheckAddr("f", a)
		if special {
			if !r.Prefix.Contains(u) {
				t.Fatalf("Classify(%v) = %v, which does not contain it", a, r.Prefix)
			}
			fe, ok := fault.As(err)
			if !ok || fe.Kind != fault.KindInvalidArgument || fe.Reason != fault.ReasonEndpointForbidden || fe.Field != "f" {
				t.Fatalf("CheckAddr(%v) = %v, want endpoint forbidden (in %v)", a, err, r.Prefix)
			}
		} else {
			if err != nil {
				t.Fatalf("CheckAddr(%v) = %v, want nil (not special)", a, err)
			}
			// Only IPv4 and 2000::/3 addresses can be unclassified.
			if !u.Is4() && !netip.MustParsePrefix("2000::/3").Contains(u) {
				t.Fatalf("Classify(%v) = not special, but it is outside 2000::/3", a)
			}
		}
		// Allow-listing the address itself (in either form) permits it.
		c.Allow = []netip.Prefix{netip.PrefixFrom(u, u.BitLen())}
		if err := c.CheckAddr("f", a); err != nil {
			t.Fatalf("CheckAddr(%v) with it allow-listed = %v, want nil", a, err)
		}
		if u.Is4() {
			c.Allow = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom16(u.As16()), 128)}
			if err := c.CheckAddr("f", u); err != nil {
				t.Fatalf("CheckAddr(%v) with mapped form allow-listed = %v, want nil", u, err)
			}
		}
	})
}
