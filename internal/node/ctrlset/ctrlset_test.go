package ctrlset

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
		err  string
	}{
		{in: []string{"https://a:7443"}, want: []string{"https://a:7443"}},
		{in: []string{"https://a:7443/, https://b:7443", "https://c"}, want: []string{"https://a:7443", "https://b:7443", "https://c"}},
		{in: []string{"https://a:7443", "https://a:7443/"}, want: []string{"https://a:7443"}},
		{in: []string{"https://[::1]:7443,,"}, want: []string{"https://[::1]:7443"}},
		{in: []string{""}, err: "no ctrl URL"},
		{in: []string{" , "}, err: "no ctrl URL"},
		{in: []string{"http://a:7443"}, err: "scheme must be https"},
		{in: []string{"a:7443"}, err: "scheme must be https"},
		{in: []string{"https://:7443"}, err: "no host"},
		{in: []string{"https://a:7443/api"}, err: "only https://HOST[:PORT]"},
		{in: []string{"https://u:p@a:7443"}, err: "only https://HOST[:PORT]"},
		{in: []string{"https://a:7443?x=1"}, err: "only https://HOST[:PORT]"},
		{in: []string{"https://a:7443#f"}, err: "only https://HOST[:PORT]"},
		{in: []string{"https://a:99999"}, err: "bad port"},
		{in: []string{strings.Repeat("https://a,", 0) + manyURLs(MaxURLs+1)}, err: "at most"},
	} {
		got, err := Parse(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse(%q) = %v, %v; want error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func manyURLs(n int) string {
	var s []string
	for i := range n {
		s = append(s, fmt.Sprintf("https://c%d:7443", i))
	}
	return strings.Join(s, ",")
}

func TestFlag(t *testing.T) {
	var f Flag
	_ = f.Set("https://a:1,https://b:1")
	_ = f.Set("https://c:1")
	got, err := Parse(f)
	if err != nil || len(got) != 3 || f.String() != "https://a:1,https://b:1,https://c:1" {
		t.Fatalf("flag %q: %v, %v", f.String(), got, err)
	}
}

// resolver answers from a table; a missing name fails.
type resolver map[string][]string

func (r resolver) resolve(_ context.Context, host string) ([]netip.Addr, error) {
	addrs, ok := r[host]
	if !ok {
		return nil, errors.New("no such host")
	}
	var out []netip.Addr
	for _, a := range addrs {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

func first(int) int { return 0 }

func newSet(t *testing.T, r resolver, urls ...string) *Set {
	t.Helper()
	s, err := New(Config{URLs: urls, TLS: &tls.Config{}, Resolve: r.resolve, Intn: first})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func addrs(list []Endpoint) []string {
	var out []string
	for _, e := range list {
		out = append(out, e.Host+"="+e.Addr)
	}
	return out
}

func TestEndpoints(t *testing.T) {
	r := resolver{"a.test": {"127.0.0.3", "127.0.0.2", "127.0.0.3", "::ffff:127.0.0.4"}, "empty.test": {}}
	for _, tc := range []struct {
		urls []string
		want []string
		err  bool
	}{
		// A name is one endpoint per address, sorted, without duplicates
		// (IPv4-mapped addresses as IPv4); the port is the URL's, 443 by
		// default; the host name stays the server name.
		{urls: []string{"https://a.test:7443"}, want: []string{"a.test=127.0.0.2:7443", "a.test=127.0.0.3:7443", "a.test=127.0.0.4:7443"}},
		{urls: []string{"https://a.test"}, want: []string{"a.test=127.0.0.2:443", "a.test=127.0.0.3:443", "a.test=127.0.0.4:443"}},
		// An address is not resolved.
		{urls: []string{"https://127.0.0.9:1", "https://[::1]:2"}, want: []string{"127.0.0.9=127.0.0.9:1", "::1=[::1]:2"}},
		// A name that does not resolve, or to nothing, is left out...
		{urls: []string{"https://127.0.0.9:1", "https://gone.test:1", "https://empty.test:1"}, want: []string{"127.0.0.9=127.0.0.9:1"}},
		// ...and when none is left, it is an error.
		{urls: []string{"https://gone.test:1", "https://empty.test:1"}, err: true},
	} {
		// Intn returning 0 shuffles deterministically: reverse the
		// expectation's URL order accordingly by building the Set and
		// reading its order.
		s := newSet(t, r, tc.urls...)
		got, err := s.Endpoints(t.Context())
		if tc.err {
			if err == nil {
				t.Errorf("%v: %v, want an error", tc.urls, addrs(got))
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.urls, err)
		}
		g := addrs(got)
		slices.Sort(g)
		w := slices.Clone(tc.want)
		slices.Sort(w)
		if !slices.Equal(g, w) {
			t.Errorf("%v: %v, want %v", tc.urls, g, w)
		}
		for _, e := range got {
			if !strings.Contains(e.URL, e.Host) {
				t.Errorf("endpoint %+v: the host is not the URL's", e)
			}
		}
	}
}

func TestRotation(t *testing.T) {
	r := resolver{"a.test": {"127.0.0.1", "127.0.0.2"}, "b.test": {"127.0.0.3"}}
	s := newSet(t, r, "https://a.test:1", "https://b.test:1")
	list, err := s.Endpoints(t.Context())
	if err != nil || len(list) != 3 {
		t.Fatal(list, err)
	}
	// Round robin over every address of every URL, in the Set's order,
	// from the start chosen at random (here the first).
	for round := range 3 {
		for i := range list {
			changed := s.Changed()
			e, err := s.Next(t.Context())
			if err != nil || e != list[i] {
				t.Fatalf("round %d, step %d: %+v, %v; want %+v", round, i, e, err, list[i])
			}
			select {
			case <-changed:
			default:
				t.Fatalf("round %d, step %d: Changed not closed", round, i)
			}
			if c, _ := s.Current(t.Context()); c != e {
				t.Fatalf("Current %+v after Next %+v", c, e)
			}
		}
	}
	// The address in use disappears from the name: the rotation goes on
	// from where it was.
	cur, _ := s.Current(t.Context())
	var kept []string
	for _, a := range r[cur.Host] {
		if a+":1" != cur.Addr {
			kept = append(kept, a)
		}
	}
	r[cur.Host] = append(kept, "127.0.0.5")
	e, err := s.Next(t.Context())
	if err != nil || e == cur {
		t.Fatalf("after the address went: %+v, %v", e, err)
	}
	now, _ := s.Endpoints(t.Context())
	if !slices.Contains(now, e) {
		t.Fatalf("after the address went: %+v, not in %v", e, addrs(now))
	}
	// One endpoint: Next stays on it and Changed is not closed.
	one := newSet(t, r, "https://127.0.0.1:1")
	e1, _ := one.Next(t.Context())
	changed := one.Changed()
	if e2, _ := one.Next(t.Context()); e2 != e1 {
		t.Fatalf("%+v then %+v", e1, e2)
	}
	select {
	case <-changed:
		t.Fatal("Changed closed without a change")
	default:
	}
}

func TestShuffledStart(t *testing.T) {
	// The URL order is shuffled and the first endpoint drawn: with enough
	// nodes every endpoint is somebody's first.
	seen := map[string]bool{}
	for range 200 {
		s, err := New(Config{URLs: []string{"https://127.0.0.1:1", "https://127.0.0.2:1", "https://127.0.0.3:1"}, TLS: &tls.Config{}})
		if err != nil {
			t.Fatal(err)
		}
		e, _ := s.Current(t.Context())
		seen[e.Addr] = true
	}
	if len(seen) != 3 {
		t.Fatalf("first endpoints: %v", seen)
	}
}

func TestBackoff(t *testing.T) {
	for _, f := range []float64{0, 0.5, 0.999} {
		b := Backoff{Min: 100 * time.Millisecond, Max: 3 * time.Second, Float64: func() float64 { return f }}
		d := 100 * time.Millisecond
		for i := range 10 {
			got := b.Next()
			if got < d/2 || got > d {
				t.Fatalf("f=%v step %d: %v, want in [%v, %v]", f, i, got, d/2, d)
			}
			d = min(2*d, 3*time.Second)
		}
		b.Reset()
		if got := b.Next(); got > 100*time.Millisecond {
			t.Fatalf("after Reset: %v", got)
		}
	}
}

// tlsServer is an HTTP/2 TLS server on loopback whose certificate names
// example.com and 127.0.0.1 (httptest's).
func tlsServer(t *testing.T, h http.Handler) (*httptest.Server, *tls.Config) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return srv, &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}}
}

func TestClientDialsTheAddressAndVerifiesTheName(t *testing.T) {
	srv, tlsc := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.Host, r.Proto)
	}))
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	r := resolver{"example.com": {"127.0.0.1"}, "other.test": {"127.0.0.1"}}
	s, err := New(Config{URLs: []string{"https://example.com:" + port}, TLS: tlsc, Resolve: r.resolve})
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Current(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Client(e).Get(e.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	var body [64]byte
	n, _ := res.Body.Read(body[:])
	res.Body.Close()
	if got := string(body[:n]); got != "example.com:"+port+" HTTP/2.0" {
		t.Fatalf("served %q", got)
	}
	// The same address under a name the certificate does not hold is
	// refused: the server name is the URL's host, not the address.
	s2, _ := New(Config{URLs: []string{"https://other.test:" + port}, TLS: tlsc, Resolve: r.resolve})
	e2, _ := s2.Current(t.Context())
	if _, err := s2.Client(e2).Get(e2.URL + "/"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("other.test: %v, want a certificate error", err)
	}
}

func TestDialCurrentFollows(t *testing.T) {
	srvA, tlsc := tlsServer(t, http.NotFoundHandler())
	srvB, _ := tlsServer(t, http.NotFoundHandler())
	// Both httptest servers share one certificate.
	s, err := New(Config{URLs: []string{srvA.URL, srvB.URL}, TLS: tlsc, Intn: first})
	if err != nil {
		t.Fatal(err)
	}
	conn, e, err := s.DialCurrent(t.Context(), nil, []string{"http/1.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if conn.RemoteAddr().String() != e.Addr {
		t.Fatalf("dialed %s, endpoint %s", conn.RemoteAddr(), e.Addr)
	}
	// The stream moves: the connection to the old endpoint is closed.
	next, _ := s.Next(t.Context())
	if next == e {
		t.Fatal("Next stayed")
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("read after the move: %v, want the connection closed", err)
	}
	conn2, e2, err := s.DialCurrent(t.Context(), nil, []string{"http/1.1"})
	if err != nil {
		t.Fatal(err)
	}
	conn2.Close()
	if e2 != next {
		t.Fatalf("dialed %+v, current %+v", e2, next)
	}
}

// TestDialEndpointEach: the data tunnels dial every endpoint, each its own
// address, whichever is in use, and the connections stay when the stream
// moves.
func TestDialEndpointEach(t *testing.T) {
	srvA, tlsc := tlsServer(t, http.NotFoundHandler())
	srvB, _ := tlsServer(t, http.NotFoundHandler())
	s, err := New(Config{URLs: []string{srvA.URL, srvB.URL}, TLS: tlsc, Intn: first})
	if err != nil {
		t.Fatal(err)
	}
	list, err := s.Endpoints(t.Context())
	if err != nil || len(list) != 2 {
		t.Fatalf("Endpoints = %v, %v", list, err)
	}
	var conns []net.Conn
	for _, e := range list {
		conn, err := s.DialEndpoint(t.Context(), e, nil, []string{"http/1.1"})
		if err != nil {
			t.Fatalf("DialEndpoint(%s): %v", e.Addr, err)
		}
		defer conn.Close()
		if conn.RemoteAddr().String() != e.Addr {
			t.Fatalf("dialed %s for %s", conn.RemoteAddr(), e.Addr)
		}
		conns = append(conns, conn)
	}
	if _, err := s.Next(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == nil || !strings.Contains(err.Error(), "timeout") {
			t.Fatalf("read after the move: %v, want a timeout (the connection stays)", err)
		}
	}
}
