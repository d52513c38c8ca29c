package netguard

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kibotos/kibotos/internal/fault"
)

// corpusFile is the SSRF corpus; its format is described at its top.
const corpusFile = "testdata/ssrf.txt"

// Verdicts of the corpus.
const (
	verdictForbidden = "forbidden"
	verdictMalformed = "malformed"
	verdictRebind    = "rebind"
	verdictAllow     = "allow"
)

// corpusEntry is one line of the corpus.
type corpusEntry struct {
	line    int
	verdict string
	dest    string
	answers [][]netip.Addr // successive DNS answers for the host
	why     string
}

func (e corpusEntry) String() string {
	return fmt.Sprintf("%s:%d %s %s", corpusFile, e.line, e.verdict, e.dest)
}

// refused reports whether the entry must be refused at dial time.
func (e corpusEntry) refused() bool { return e.verdict != verdictAllow }

// literal returns the entry's host as an IP address (brackets removed, zone
// kept), if it is one.
func (e corpusEntry) literal() (netip.Addr, bool) {
	host := e.dest
	if strings.HasPrefix(host, "[") {
		if i := strings.IndexByte(host, ']'); i > 0 {
			host = host[1:i]
		}
	} else if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.Count(host, ":") == 1 {
		host = host[:i]
	}
	a, err := netip.ParseAddr(host)
	return a, err == nil
}

// host returns the host part as ParseHostPort would, or "" when it does not
// parse.
func (e corpusEntry) host() string {
	h, _, err := ParseHostPort("f", e.dest)
	if err != nil {
		return ""
	}
	return h
}

func readCorpus(t *testing.T) []corpusEntry {
	t.Helper()
	f, err := os.Open(corpusFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []corpusEntry
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		body, why, ok := strings.Cut(line, " -- ")
		why = strings.TrimSpace(why)
		if !ok || why == "" {
			t.Fatalf("%s:%d: no \"-- why\" column", corpusFile, n)
		}
		fields := strings.Fields(body)
		if len(fields) < 2 || len(fields) > 3 {
			t.Fatalf("%s:%d: want VERDICT HOST:PORT [dns=...], got %q", corpusFile, n, body)
		}
		e := corpusEntry{line: n, verdict: fields[0], dest: fields[1], why: why}
		switch e.verdict {
		case verdictForbidden, verdictMalformed, verdictRebind, verdictAllow:
		default:
			t.Fatalf("%s:%d: unknown verdict %q", corpusFile, n, e.verdict)
		}
		if len(fields) == 3 {
			spec, ok := strings.CutPrefix(fields[2], "dns=")
			if !ok {
				t.Fatalf("%s:%d: third field %q is not dns=", corpusFile, n, fields[2])
			}
			for ans := range strings.SplitSeq(spec, "/") {
				var addrs []netip.Addr
				for s := range strings.SplitSeq(ans, ",") {
					a, err := netip.ParseAddr(s)
					if err != nil {
						t.Fatalf("%s:%d: dns answer %q: %v", corpusFile, n, s, err)
					}
					addrs = append(addrs, a)
				}
				e.answers = append(e.answers, addrs)
			}
		}
		if e.verdict == verdictRebind && len(e.answers) < 2 {
			t.Fatalf("%s:%d: a rebind entry needs two answers", corpusFile, n)
		}
		if prev, dup := seen[e.dest]; dup {
			t.Fatalf("%s:%d: %s already on line %d", corpusFile, n, e.dest, prev)
		}
		seen[e.dest] = n
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// corpusResolver answers one corpus entry's host with its successive answers
// and counts lookups.
type corpusResolver struct {
	host    string
	answers [][]netip.Addr
	calls   int
}

func (r *corpusResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.calls++
	if network != "ip" || host != r.host || len(r.answers) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	i := min(r.calls, len(r.answers)) - 1
	return append([]netip.Addr(nil), r.answers[i]...), nil
}

// recordingDial is a dial function that records what it was asked to dial
// and connects to nothing (one end of a net.Pipe).
type recordingDial struct {
	mu    sync.Mutex
	calls []string
}

func (d *recordingDial) dial(_ context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.calls = append(d.calls, network+" "+address)
	d.mu.Unlock()
	c1, c2 := net.Pipe()
	c2.Close()
	return c1, nil
}

// TestSSRFCorpusShape checks the corpus's size and that its DNS answers say
// what the verdicts claim.
func TestSSRFCorpusShape(t *testing.T) {
	entries := readCorpus(t)
	var refused, allowed int
	for _, e := range entries {
		if e.refused() {
			refused++
		} else {
			allowed++
		}
		special := func(as []netip.Addr) bool {
			for _, a := range as {
				if _, ok := Classify(a); ok {
					return true
				}
			}
			return false
		}
		switch e.verdict {
		case verdictAllow:
			for _, ans := range e.answers {
				if special(ans) {
					t.Errorf("%v: an allowed entry has a special-purpose DNS answer %v", e, ans)
				}
			}
		case verdictRebind:
			if special(e.answers[0]) || !special(e.answers[len(e.answers)-1]) {
				t.Errorf("%v: a rebind entry must answer public first and special-purpose last", e)
			}
		}
	}
	t.Logf("%s: %d refused, %d allowed", corpusFile, refused, allowed)
	if refused < 80 || allowed < 20 {
		t.Errorf("%s has %d refused and %d allowed forms, want at least 80 and 20", corpusFile, refused, allowed)
	}
}

// TestSSRFCorpusLiterals checks Classify and CheckAddr on every corpus entry
// whose host is an IP literal (zones included): forbidden and malformed
// literals are special-purpose, allowed ones are not.
func TestSSRFCorpusLiterals(t *testing.T) {
	var c Checker
	n := 0
	for _, e := range readCorpus(t) {
		a, ok := e.literal()
		if !ok {
			continue
		}
		n++
		r, special := Classify(a)
		err := c.CheckAddr("f", a)
		switch e.verdict {
		case verdictAllow:
			if special || err != nil {
				t.Errorf("%v: Classify = %v %v, CheckAddr = %v; want a public address", e, r, special, err)
			}
		case verdictForbidden, verdictMalformed:
			if !special {
				t.Errorf("%v: Classify(%v) = not special, want special-purpose", e, a)
			}
			wantFault(t, e.String()+": CheckAddr", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "f")
		default:
			t.Errorf("%v: a %s entry cannot be a literal", e, e.verdict)
		}
	}
	if n == 0 {
		t.Fatal("no literal in the corpus")
	}
}

// inetAton decodes s as the C library's inet_aton does: one to four
// dot-separated parts, each decimal, octal (leading 0) or hex (0x), the
// last part filling the remaining bytes.
func inetAton(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var vals []uint64
	for _, p := range parts {
		base := 10
		switch {
		case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
			base, p = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, p = 8, p[1:]
		}
		v, err := strconv.ParseUint(p, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals = append(vals, v)
	}
	var n uint64
	for i, v := range vals {
		if i < len(vals)-1 {
			if v > 255 {
				return netip.Addr{}, false
			}
			n |= v << (8 * (3 - i))
			continue
		}
		if v >= 1<<(8*(4-i)) {
			return netip.Addr{}, false
		}
		n |= v
	}
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

// TestSSRFCorpusNumericSpellings decodes the malformed hosts that inet_aton
// reads as IPv4 addresses: each must denote a special-purpose address (the
// parser refuses them all, but the corpus must say what they mean).
func TestSSRFCorpusNumericSpellings(t *testing.T) {
	for _, s := range []string{"2130706433", "0x7f.1", "0177.0.0.1", "127.1", "0"} {
		if a, ok := inetAton(s); !ok || a != netip.IPv4Unspecified() && a != netip.MustParseAddr("127.0.0.1") {
			t.Fatalf("inetAton(%q) = %v, %v", s, a, ok)
		}
	}
	n := 0
	for _, e := range readCorpus(t) {
		if e.verdict != verdictMalformed {
			continue
		}
		host, _, _ := strings.Cut(e.dest, ":")
		a, ok := inetAton(host)
		if !ok {
			continue
		}
		n++
		if _, special := Classify(a); !special {
			t.Errorf("%v: inet_aton reads %v, which is not special-purpose", e, a)
		}
	}
	t.Logf("%d numeric spellings decoded", n)
	if n < 15 {
		t.Errorf("%d numeric spellings in the corpus, want at least 15", n)
	}
}

// TestSSRFCorpusCreateAndDial runs every corpus entry through CheckEndpoint
// (create time) and then through a Dialer whose resolver is the entry's
// fake DNS and whose dial function records what it is asked to dial:
// refused entries never reach the dial function, allowed ones reach it with
// the checked literal.
func TestSSRFCorpusCreateAndDial(t *testing.T) {
	const field = "spec.socks5.address"
	var refused, refusedAtDial, allowed, allowedAtDial int
	for _, e := range readCorpus(t) {
		for _, network := range []string{"tcp", "udp"} {
			what := fmt.Sprintf("%v (%s)", e, network)
			res := &corpusResolver{host: e.host(), answers: e.answers}
			checker := &Checker{Resolver: res}
			ctx := context.Background()

			// Create time.
			err := checker.CheckEndpoint(ctx, field, e.dest)
			createLookups := res.calls
			switch e.verdict {
			case verdictForbidden:
				wantFault(t, what+": CheckEndpoint", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, field)
			case verdictMalformed:
				wantFault(t, what+": CheckEndpoint", err, fault.KindInvalidArgument, fault.ReasonInvalidArgument, field)
			case verdictRebind, verdictAllow:
				if err != nil {
					t.Errorf("%s: CheckEndpoint = %v, want nil", what, err)
				}
			}
			if createLookups > 1 || e.answers == nil && createLookups != 0 {
				t.Errorf("%s: CheckEndpoint made %d lookups", what, createLookups)
			}

			// Dial time: the same resolver, which has given its first answer.
			rec := &recordingDial{}
			d := &Dialer{Checker: checker, DialFunc: rec.dial}
			conn, err := d.DialContext(ctx, network, e.dest)
			if conn != nil {
				conn.Close()
			}
			if n := res.calls - createLookups; n > 1 {
				t.Errorf("%s: DialContext made %d lookups, want at most 1", what, n)
			}
			if e.refused() {
				refused++
				switch e.verdict {
				case verdictMalformed:
					wantFault(t, what+": DialContext", err, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "address")
				default:
					wantFault(t, what+": DialContext", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "address")
				}
				if len(rec.calls) != 0 {
					t.Errorf("%s: refused, but the dial function was called with %v", what, rec.calls)
				}
				if err != nil && len(rec.calls) == 0 {
					refusedAtDial++
				}
				if (e.verdict == verdictMalformed || e.answers == nil) && res.calls != 0 {
					t.Errorf("%s: %d lookups for a form refused without DNS", what, res.calls)
				}
				continue
			}
			allowed++
			if err != nil {
				t.Errorf("%s: DialContext = %v, want a connection", what, err)
				continue
			}
			if len(rec.calls) != 1 {
				t.Errorf("%s: dial function called %d times, want once", what, len(rec.calls))
				continue
			}
			allowedAtDial++
			gotNet, gotAddr, _ := strings.Cut(rec.calls[0], " ")
			ap, perr := netip.ParseAddrPort(gotAddr)
			if gotNet != network || perr != nil || ap.Addr().Zone() != "" || ap.Addr().Is4In6() {
				t.Errorf("%s: dialed %q, want %s to an unmapped IP literal without zone", what, rec.calls[0], network)
				continue
			}
			if err := (&Checker{}).CheckAddr("f", ap.Addr()); err != nil {
				t.Errorf("%s: dialed %v, which the checker refuses: %v", what, ap, err)
			}
			// The literal dialed is the first address of the answer the
			// dial saw (or the literal written in the destination).
			var want netip.Addr
			if a, ok := e.literal(); ok {
				want = a.Unmap()
			} else {
				i := min(res.calls, len(e.answers)) - 1
				want = e.answers[i][0].Unmap().WithZone("")
			}
			_, port, _ := ParseHostPort("f", e.dest)
			if ap != netip.AddrPortFrom(want, port) {
				t.Errorf("%s: dialed %v, want %v", what, ap, netip.AddrPortFrom(want, port))
			}
		}
	}
	t.Logf("dial: %d/%d refused forms refused, %d/%d allowed forms dialed", refusedAtDial, refused, allowedAtDial, allowed)
}

// TestLocalhostNamesAreNotResolved: a name under localhost is loopback (RFC
// 6761 §6.3) even when a resolver would answer a public address, and the
// resolver is not asked. Before IsLocalhost, "evil.localhost" with a public
// DNS answer was allowed, and "localhost." was sent to the DNS server.
func TestLocalhostNamesAreNotResolved(t *testing.T) {
	for _, host := range []string{"localhost", "LOCALHOST", "localhost.", "a.localhost", "a.b.LocalHost."} {
		res := &corpusResolver{host: host, answers: [][]netip.Addr{{netip.MustParseAddr("93.184.216.34")}}}
		c := &Checker{Resolver: res}
		_, err := c.Resolve(context.Background(), "f", host+":80")
		wantFault(t, "Resolve("+host+":80)", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "f")
		if res.calls != 0 {
			t.Errorf("Resolve(%s:80) asked the resolver", host)
		}

		// Allow-listing loopback makes it the loopback addresses allowed.
		c.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		got, err := c.Resolve(context.Background(), "f", host+":80")
		if want := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:80")}; err != nil || len(got) != 1 || got[0] != want[0] {
			t.Errorf("Resolve(%s:80) with 127.0.0.0/8 allowed = %v, %v; want %v", host, got, err, want)
		}
		c.Allow = append(c.Allow, netip.MustParsePrefix("::1/128"))
		got, err = c.Resolve(context.Background(), "f", host+":80")
		if err != nil || len(got) != 2 || got[1] != netip.MustParseAddrPort("[::1]:80") {
			t.Errorf("Resolve(%s:80) with 127.0.0.0/8,::1 allowed = %v, %v; want 127.0.0.1 and ::1", host, got, err)
		}
	}
	for _, host := range []string{"mylocalhost", "localhost.example", "localhostx", "xlocalhost.", "localhost.localdomain"} {
		if IsLocalhost(host) {
			t.Errorf("IsLocalhost(%q) = true, want false", host)
		}
	}
}

// TestResolveDropsZone: a resolver (the hosts file) may return a zoned
// address; the zone is dropped so that what is dialed is what was checked.
// Before, a zoned public answer was returned and dialed with its zone.
func TestResolveDropsZone(t *testing.T) {
	res := &corpusResolver{host: "z.example", answers: [][]netip.Addr{{netip.MustParseAddr("2606:4700:4700::1111%eth0")}}}
	got, err := (&Checker{Resolver: res}).Resolve(context.Background(), "f", "z.example:53")
	if err != nil || len(got) != 1 || got[0] != netip.MustParseAddrPort("[2606:4700:4700::1111]:53") {
		t.Errorf("Resolve(z.example:53) = %v, %v; want [2606:4700:4700::1111]:53", got, err)
	}
}

// TestDialerTriesCheckedLiteralsInOrder: when the first checked address
// fails, the next one is dialed, each as its literal; the error of the first
// attempt is returned when all fail.
func TestDialerTriesCheckedLiteralsInOrder(t *testing.T) {
	res := &corpusResolver{host: "two.example", answers: [][]netip.Addr{{
		netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("::ffff:1.1.1.1"), netip.MustParseAddr("2606:4700:4700::1111")}}}
	var calls []string
	first := errors.New("first refused")
	d := &Dialer{Checker: &Checker{Resolver: res}, DialFunc: func(_ context.Context, network, address string) (net.Conn, error) {
		calls = append(calls, address)
		if len(calls) == 1 {
			return nil, first
		}
		return nil, errors.New("later refused")
	}}
	_, err := d.DialContext(context.Background(), "tcp", "two.example:443")
	if !errors.Is(err, first) {
		t.Errorf("DialContext = %v, want the first attempt's error", err)
	}
	if want := []string{"8.8.8.8:443", "1.1.1.1:443", "[2606:4700:4700::1111]:443"}; strings.Join(calls, " ") != strings.Join(want, " ") {
		t.Errorf("dialed %v, want %v", calls, want)
	}
	if res.calls != 1 {
		t.Errorf("%d lookups for one dial, want 1", res.calls)
	}
}

// TestDialerZeroChecker: a Dialer without a Checker refuses special-purpose
// literals before its dial function and dials public ones as written.
func TestDialerZeroChecker(t *testing.T) {
	rec := &recordingDial{}
	d := &Dialer{DialFunc: rec.dial}
	_, err := d.DialContext(context.Background(), "tcp", "[::ffff:169.254.169.254]:80")
	wantFault(t, "DialContext([::ffff:169.254.169.254]:80)", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "address")
	conn, err := d.DialContext(context.Background(), "tcp", "[::ffff:8.8.8.8]:53")
	if err != nil {
		t.Fatalf("DialContext([::ffff:8.8.8.8]:53) = %v", err)
	}
	conn.Close()
	if strings.Join(rec.calls, ",") != "tcp 8.8.8.8:53" {
		t.Errorf("dialed %v, want only tcp 8.8.8.8:53", rec.calls)
	}
}
