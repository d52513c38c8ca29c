package netguard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/fault"
)

// fakeAnswer is what fakeResolver returns for one name.
type fakeAnswer struct {
	addrs []string
	err   error
}

// fakeResolver answers from a map and counts lookups.
type fakeResolver struct {
	answers      map[string]fakeAnswer
	calls        int
	sawDeadline  bool
	lastNetwork  string
	blockOnQuery bool
}

func (r *fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.calls++
	r.lastNetwork = network
	_, r.sawDeadline = ctx.Deadline()
	if r.blockOnQuery {
		<-ctx.Done()
		return nil, &net.DNSError{Err: ctx.Err().Error(), Name: host, IsTimeout: true}
	}
	ans, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	if ans.err != nil {
		return nil, ans.err
	}
	var out []netip.Addr
	for _, s := range ans.addrs {
		out = append(out, netip.MustParseAddr(s))
	}
	return out, nil
}

func newFake() *fakeResolver {
	return &fakeResolver{answers: map[string]fakeAnswer{
		"public.example":    {addrs: []string{"8.8.8.8", "2001:4860:4860::8888"}},
		"mixed.example":     {addrs: []string{"8.8.8.8", "10.0.0.1"}},
		"mixed6.example":    {addrs: []string{"2606:4700::1111", "fd00::1"}},
		"mapped.example":    {addrs: []string{"::ffff:8.8.8.8"}},
		"mappedbad.example": {addrs: []string{"1.1.1.1", "::ffff:127.0.0.1"}},
		"testnet.example":   {addrs: []string{"192.0.2.10"}},
		"loop.example":      {addrs: []string{"127.0.0.1", "::1"}},
		"empty.example":     {addrs: nil},
		"nodata.example":    {err: &net.DNSError{Err: "no such host", Name: "nodata.example", IsNotFound: true}},
		"temp.example":      {err: &net.DNSError{Err: "server misbehaving", Name: "temp.example", IsTemporary: true}},
		"timeout.example":   {err: &net.DNSError{Err: "i/o timeout", Name: "timeout.example", IsTimeout: true, IsTemporary: true}},
		"notfoundtemp.example": {err: &net.DNSError{Err: "no such host", Name: "notfoundtemp.example",
			IsNotFound: true, IsTemporary: true}},
		"other.example":     {err: errors.New("connection refused")},
		"wrapped.example":   {err: &net.OpError{Op: "dial", Err: errors.New("network unreachable")}},
		"dup.example":       {addrs: []string{"8.8.8.8", "::ffff:8.8.8.8", "1.1.1.1", "8.8.8.8"}},
		"bigmixed.example":  {addrs: []string{"1.1.1.1", "8.8.4.4", "9.9.9.9", "2606:4700::1111", "169.254.169.254"}},
		"sixtofour.example": {addrs: []string{"2002:808:808::1"}},
	}}
}

func TestCheckEndpoint(t *testing.T) {
	const field = "spec.resolver.address"
	tests := []struct {
		in        string
		kind      fault.Kind // KindInternal (zero) means success
		reason    fault.Reason
		retryable bool
		lookups   int
	}{
		{in: "public.example:53", lookups: 1},
		{in: "mapped.example:53", lookups: 1},
		{in: "8.8.8.8:53"},
		{in: "[2606:4700::1111]:53"},
		{in: "[::ffff:8.8.8.8]:53"},
		{in: "mixed.example:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden, lookups: 1},
		{in: "mixed6.example:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden, lookups: 1},
		{in: "mappedbad.example:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden, lookups: 1},
		{in: "testnet.example:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden, lookups: 1},
		{in: "loop.example:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden, lookups: 1},
		{in: "bigmixed.example:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden, lookups: 1},
		{in: "sixtofour.example:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden, lookups: 1},
		{in: "127.0.0.1:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden},
		{in: "[::1]:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden},
		{in: "[::ffff:10.0.0.1]:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden},
		{in: "198.18.0.1:53", kind: fault.KindInvalidArgument, reason: fault.ReasonEndpointForbidden},
		{in: "nxdomain.example:53", kind: fault.KindInvalidArgument, reason: fault.ReasonInvalidArgument, lookups: 1},
		{in: "nodata.example:53", kind: fault.KindInvalidArgument, reason: fault.ReasonInvalidArgument, lookups: 1},
		{in: "empty.example:53", kind: fault.KindInvalidArgument, reason: fault.ReasonInvalidArgument, lookups: 1},
		{in: "temp.example:53", kind: fault.KindUnavailable, reason: fault.ReasonUnavailable, retryable: true, lookups: 1},
		{in: "timeout.example:53", kind: fault.KindUnavailable, reason: fault.ReasonUnavailable, retryable: true, lookups: 1},
		{in: "notfoundtemp.example:53", kind: fault.KindUnavailable, reason: fault.ReasonUnavailable, retryable: true, lookups: 1},
		{in: "other.example:53", kind: fault.KindUnavailable, reason: fault.ReasonUnavailable, retryable: true, lookups: 1},
		{in: "wrapped.example:53", kind: fault.KindUnavailable, reason: fault.ReasonUnavailable, retryable: true, lookups: 1},
		{in: "public.example", kind: fault.KindInvalidArgument, reason: fault.ReasonInvalidArgument},
		{in: "[fe80::1%eth0]:53", kind: fault.KindInvalidArgument, reason: fault.ReasonInvalidArgument},
	}
	for _, tt := range tests {
		r := newFake()
		c := &Checker{Resolver: r}
		err := c.CheckEndpoint(context.Background(), field, tt.in)
		what := "CheckEndpoint(" + tt.in + ")"
		if tt.kind == fault.KindInternal {
			if err != nil {
				t.Errorf("%s = %v, want nil", what, err)
			}
		} else if fe := wantFault(t, what, err, tt.kind, tt.reason, field); fe != nil && fe.Retryable != tt.retryable {
			t.Errorf("%s Retryable = %v, want %v", what, fe.Retryable, tt.retryable)
		}
		if r.calls != tt.lookups {
			t.Errorf("%s made %d lookups, want %d", what, r.calls, tt.lookups)
		}
		if r.calls > 0 && (!r.sawDeadline || r.lastNetwork != "ip") {
			t.Errorf("%s lookup had deadline %v network %q, want a deadline and \"ip\"", what, r.sawDeadline, r.lastNetwork)
		}
	}
}

func TestCheckEndpointMessageDoesNotLeakResolvedAddress(t *testing.T) {
	c := &Checker{Resolver: newFake()}
	err := c.CheckEndpoint(context.Background(), "f", "mixed.example:53")
	fe := wantFault(t, "CheckEndpoint(mixed.example:53)", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "f")
	if fe != nil && (strings.Contains(fe.Message, "10.0.0.1") || !strings.Contains(fe.Message, "mixed.example")) {
		t.Errorf("CheckEndpoint(mixed.example:53) message %q, want the name and not the resolved address", fe.Message)
	}
}

func TestCheckEndpointAllowList(t *testing.T) {
	allow, err := ParseAllowList("127.0.0.0/8,::1/128")
	if err != nil {
		t.Fatal(err)
	}
	c := &Checker{Allow: allow, Resolver: newFake()}
	for _, in := range []string{"loop.example:53", "127.0.0.1:53", "[::1]:53", "[::ffff:127.0.0.1]:53", "public.example:53"} {
		if err := c.CheckEndpoint(context.Background(), "f", in); err != nil {
			t.Errorf("CheckEndpoint(%s) with allow-list = %v, want nil", in, err)
		}
	}
	for _, in := range []string{"mixed.example:53", "10.0.0.1:53", "[::2]:53"} {
		err := c.CheckEndpoint(context.Background(), "f", in)
		wantFault(t, "CheckEndpoint("+in+") with allow-list", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "f")
	}
}

func TestResolveTimeout(t *testing.T) {
	r := newFake()
	r.blockOnQuery = true
	c := &Checker{Resolver: r}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := c.Resolve(ctx, "f", "slow.example:53")
	fe := wantFault(t, "Resolve(slow.example:53)", err, fault.KindUnavailable, fault.ReasonUnavailable, "f")
	if fe != nil && !fe.Retryable {
		t.Errorf("Resolve(slow.example:53) Retryable = false, want true")
	}

	// A cancelled context is a transient failure too.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	_, err = c.Resolve(ctx, "f", "slow.example:53")
	wantFault(t, "Resolve(cancelled)", err, fault.KindUnavailable, fault.ReasonUnavailable, "f")
}

func TestResolveReturnsCheckedLiterals(t *testing.T) {
	c := &Checker{Resolver: newFake()}
	tests := []struct {
		in   string
		want []string
	}{
		{"public.example:1080", []string{"8.8.8.8:1080", "[2001:4860:4860::8888]:1080"}},
		{"mapped.example:53", []string{"8.8.8.8:53"}},
		{"dup.example:53", []string{"8.8.8.8:53", "1.1.1.1:53"}},
		{"1.1.1.1:53", []string{"1.1.1.1:53"}},
		{"[::ffff:1.1.1.1]:53", []string{"1.1.1.1:53"}},
		{"[2606:4700::1111]:853", []string{"[2606:4700::1111]:853"}},
	}
	for _, tt := range tests {
		got, err := c.Resolve(context.Background(), "f", tt.in)
		if err != nil {
			t.Errorf("Resolve(%s) = %v, want %v", tt.in, err, tt.want)
			continue
		}
		var want []netip.AddrPort
		for _, s := range tt.want {
			want = append(want, netip.MustParseAddrPort(s))
		}
		if !slices.Equal(got, want) {
			t.Errorf("Resolve(%s) = %v, want %v", tt.in, got, want)
		}
	}
	got, err := c.Resolve(context.Background(), "f", "mixed.example:53")
	wantFault(t, "Resolve(mixed.example:53)", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "f")
	if got != nil {
		t.Errorf("Resolve(mixed.example:53) returned addresses %v with an error, want none", got)
	}
}

// TestLocalhostRealResolver uses net.DefaultResolver.
func TestLocalhostRealResolver(t *testing.T) {
	ctx := context.Background()
	var c Checker
	err := c.CheckEndpoint(ctx, "spec.socks5.address", "localhost:1080")
	wantFault(t, "CheckEndpoint(localhost:1080)", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "spec.socks5.address")

	allow, err := ParseAllowList("127.0.0.0/8,::1/128")
	if err != nil {
		t.Fatal(err)
	}
	c.Allow = allow
	if err := c.CheckEndpoint(ctx, "spec.socks5.address", "localhost:1080"); err != nil {
		t.Errorf("CheckEndpoint(localhost:1080) with 127.0.0.0/8,::1/128 allowed = %v, want nil", err)
	}
	got, err := c.Resolve(ctx, "spec.socks5.address", "localhost:1080")
	if err != nil || len(got) == 0 {
		t.Fatalf("Resolve(localhost:1080) = %v, %v, want loopback addresses", got, err)
	}
	for _, ap := range got {
		if !ap.Addr().IsLoopback() || ap.Port() != 1080 {
			t.Errorf("Resolve(localhost:1080) returned %v, want loopback:1080", ap)
		}
	}
}

func TestDialer(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	r := &fakeResolver{answers: map[string]fakeAnswer{
		"svc.example": {addrs: []string{"127.0.0.1"}},
	}}
	hostport := net.JoinHostPort("svc.example", strconv.Itoa(port))
	ctx := context.Background()

	d := &Dialer{Checker: &Checker{Resolver: r}}
	conn, err := d.DialContext(ctx, "tcp", hostport)
	if conn != nil {
		conn.Close()
	}
	wantFault(t, "DialContext(svc.example) without allow-list", err, fault.KindInvalidArgument, fault.ReasonEndpointForbidden, "address")

	d.Checker.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	conn, err = d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		t.Fatalf("DialContext(svc.example) with allow-list = %v, want a connection", err)
	}
	if got := conn.RemoteAddr().(*net.TCPAddr).AddrPort(); got != netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)) {
		t.Errorf("DialContext(svc.example) connected to %v, want 127.0.0.1:%d", got, port)
	}
	conn.Close()

	var addrErr *net.AddrError
	if _, err := d.DialContext(ctx, "tcp6", hostport); !errors.As(err, &addrErr) {
		t.Errorf("DialContext(tcp6, IPv4-only name) = %v, want *net.AddrError", err)
	}
	if _, err := d.DialContext(ctx, "unix", hostport); err == nil {
		t.Errorf("DialContext(unix) = nil error, want unknown network")
	}
}
