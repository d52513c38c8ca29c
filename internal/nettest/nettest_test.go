//go:build linux

package nettest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/kibotos/kibotos/internal/socks5"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// get fetches url with client and returns the body.
func get(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	res, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("GET %s: %s, %v", url, res.Status, err)
	}
	return string(b)
}

// clientFrom is an HTTP client whose connections are dialed from inside p.
func clientFrom(p *Peer) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: p.DialContext}}
}

func TestPeerHTTPAndRouting(t *testing.T) {
	t.Parallel()
	a, b := NewPeer(t), NewPeer(t)
	if a.N == b.N || !Range.Contains(a.Addr) || !a.Prefix.Contains(a.HostAddr) || a.Addr.Next() == a.HostAddr {
		t.Fatalf("peers %+v %+v", a, b)
	}
	h, err := a.HTTP(nil)
	if err != nil {
		t.Fatal(err)
	}
	// From the host: the client is the host's end of a's link.
	body := get(t, &http.Client{Timeout: 10 * time.Second}, h.URL("/x"))
	peer, client, err := ParseWhoAmI(body)
	if err != nil || peer != a.Addr || client.Addr() != a.HostAddr {
		t.Fatalf("from the host: %q: %v %v %v", body, peer, client, err)
	}
	// From b, through the host's forwarding: the client is b itself.
	body = get(t, clientFrom(b), h.URL("/y"))
	if _, client, err = ParseWhoAmI(body); err != nil || client.Addr() != b.Addr {
		t.Fatalf("from peer b: %q, %v", body, err)
	}
	reqs := h.Requests()
	if len(reqs) != 2 || reqs[0].Path != "/x" || reqs[1].Remote.Addr() != b.Addr {
		t.Fatalf("requests %+v", reqs)
	}
	// Nothing but Range is routed from a peer.
	if _, err := a.DialContext(ctx(t), "tcp", "192.0.2.1:80"); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("a dial outside Range from a peer: %v, want network unreachable", err)
	}
}

func TestTCPModes(t *testing.T) {
	t.Parallel()
	p := NewPeer(t)
	c := ctx(t)
	dial := func(s *TCPServer) *net.TCPConn {
		t.Helper()
		conn, err := net.DialTimeout("tcp", s.Addr.String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		return conn.(*net.TCPConn)
	}

	t.Run("echo", func(t *testing.T) {
		s, err := p.TCP(Echo, 0)
		if err != nil {
			t.Fatal(err)
		}
		conn := dial(s)
		msg := strings.Repeat("echo ", 20000)
		go io.WriteString(conn, msg)
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, got); err != nil || string(got) != msg {
			t.Fatalf("echo: %v", err)
		}
		sc, err := s.Next(c)
		if err != nil {
			t.Fatal(err)
		}
		if sc.Remote.Addr() != p.HostAddr {
			t.Errorf("remote %v", sc.Remote)
		}
		conn.Close()
		if at, err := sc.Ended(); err != nil || at.Before(sc.Accepted) {
			t.Errorf("ended %v %v", at, err)
		}
	})
	t.Run("sink", func(t *testing.T) {
		s, err := p.TCP(Sink, 0)
		if err != nil {
			t.Fatal(err)
		}
		conn := dial(s)
		const n = 8 << 20
		if _, err := io.CopyN(conn, zeros{}, n); err != nil {
			t.Fatal(err)
		}
		conn.CloseWrite()
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || strings.TrimSpace(line) != strconv.Itoa(n) {
			t.Fatalf("sink answered %q, %v", line, err)
		}
	})
	t.Run("source", func(t *testing.T) {
		s, err := p.TCP(Source, 0)
		if err != nil {
			t.Fatal(err)
		}
		conn := dial(s)
		fmt.Fprintf(conn, "%d\n", 3<<20)
		n, err := io.Copy(io.Discard, conn)
		if err != nil || n != 3<<20 {
			t.Fatalf("source sent %d, %v", n, err)
		}
		// Endless until the client closes.
		conn = dial(s)
		io.WriteString(conn, "0\n")
		if _, err := io.CopyN(io.Discard, conn, 16<<20); err != nil {
			t.Fatal(err)
		}
		conn.Close()
		for _, sc := range s.Conns() {
			if _, err := sc.Ended(); err != nil {
				t.Errorf("source conn ended with %v", err)
			}
		}
	})
	t.Run("hold", func(t *testing.T) {
		s, err := p.TCP(Hold, 0)
		if err != nil {
			t.Fatal(err)
		}
		conn := dial(s)
		sc, err := s.Next(c)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-sc.Done():
			t.Fatal("held connection ended by itself")
		case <-time.After(100 * time.Millisecond):
		}
		if s.Open() != 1 {
			t.Fatalf("open %d", s.Open())
		}
		sc.Close() // the server's side ends it: the client sees EOF
		if _, err := conn.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("client read after server close: %v", err)
		}
		<-sc.Done()
		if s.Open() != 0 {
			t.Fatalf("open %d", s.Open())
		}
	})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestDNS(t *testing.T) {
	t.Parallel()
	p := NewPeer(t)
	d, err := p.DNS()
	if err != nil {
		t.Fatal(err)
	}
	pub, lo := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("127.0.0.1")
	six := netip.MustParseAddr("2001:db8::1")
	d.Set("multi.test", pub, netip.MustParseAddr("10.0.0.1"), six)
	d.Set("mapped.test", netip.MustParseAddr("::ffff:127.0.0.1"))
	d.SetSequence("rebind.test", []netip.Addr{pub}, []netip.Addr{lo})

	ask := func(network, name string, qtype uint16) *dns.Msg {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		c := &dns.Client{Net: network, Timeout: 5 * time.Second}
		r, _, err := c.Exchange(m, d.Addr.String())
		if err != nil {
			t.Fatalf("%s %s: %v", network, name, err)
		}
		return r
	}
	addrs := func(r *dns.Msg) []string {
		var out []string
		for _, rr := range r.Answer {
			switch rr := rr.(type) {
			case *dns.A:
				out = append(out, rr.A.String())
			case *dns.AAAA:
				out = append(out, rr.AAAA.String())
			}
			if rr.Header().Ttl != 0 {
				t.Errorf("TTL %d", rr.Header().Ttl)
			}
		}
		return out
	}
	for _, network := range []string{"udp", "tcp"} {
		if got := addrs(ask(network, "MULTI.test", dns.TypeA)); !slices.Equal(got, []string{"198.51.100.7", "10.0.0.1"}) {
			t.Errorf("%s multi A = %v", network, got)
		}
		if got := addrs(ask(network, "multi.test", dns.TypeAAAA)); !slices.Equal(got, []string{"2001:db8::1"}) {
			t.Errorf("%s multi AAAA = %v", network, got)
		}
		if got := addrs(ask(network, "mapped.test", dns.TypeAAAA)); !slices.Equal(got, []string{"127.0.0.1"}) { // miekg prints ::ffff:a.b.c.d as a.b.c.d
			t.Errorf("%s mapped AAAA = %v", network, got)
		}
		if got := addrs(ask(network, "mapped.test", dns.TypeA)); len(got) != 0 {
			t.Errorf("%s mapped A = %v, want none", network, got)
		}
		if r := ask(network, "nope.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
			t.Errorf("%s unknown name: rcode %d", network, r.Rcode)
		}
	}
	// Rebinding: the first A answer public, every later one loopback.
	for i, want := range []string{"198.51.100.7", "127.0.0.1", "127.0.0.1"} {
		if got := addrs(ask("udp", "rebind.test", dns.TypeA)); !slices.Equal(got, []string{want}) {
			t.Errorf("rebind #%d = %v, want %s", i, got, want)
		}
	}
	qs := d.QueriesFor("rebind.test.")
	if len(qs) != 3 || qs[0].Net != "udp" || qs[0].From.Addr() != p.HostAddr || qs[0].Type != dns.TypeA {
		t.Errorf("queries %+v", qs)
	}
	if n := len(d.Queries()); n != 13 {
		t.Errorf("%d queries recorded, want 13", n)
	}
}

func TestDante(t *testing.T) {
	t.Parallel()
	RequireTools(t, "danted")
	proxy, dest := NewPeer(t), NewPeer(t)
	h, err := dest.HTTP(nil)
	if err != nil {
		t.Fatal(err)
	}
	echo, err := dest.TCP(Echo, 0)
	if err != nil {
		t.Fatal(err)
	}
	blocked, err := dest.TCP(Echo, 0)
	if err != nil {
		t.Fatal(err)
	}
	open, err := proxy.Dante(DanteOptions{Block: []netip.AddrPort{blocked.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := proxy.Dante(DanteOptions{Auth: true})
	if err != nil {
		t.Fatal(err)
	}
	if auth.User == "" || auth.Password == "" || open.User != "" {
		t.Fatalf("users %q %q", auth.User, open.User)
	}
	c := ctx(t)

	// httpVia GETs the who-am-I page through the proxy.
	httpVia := func(d *Dante, cl *socks5.Client) (string, error) {
		tr := &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			conn, err := net.Dial("tcp", d.Addr.String())
			if err != nil {
				return nil, err
			}
			if _, err := cl.Connect(ctx, conn, socks5.AddrFromAddrPort(netip.MustParseAddrPort(addr))); err != nil {
				conn.Close()
				return nil, err
			}
			return conn, nil
		}}
		defer tr.CloseIdleConnections()
		res, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(h.URL("/"))
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return string(b), err
	}
	for _, tc := range []struct {
		d  *Dante
		cl *socks5.Client
	}{{open, &socks5.Client{}}, {auth, &socks5.Client{Username: auth.User, Password: auth.Password}}} {
		body, err := httpVia(tc.d, tc.cl)
		if err != nil {
			t.Fatalf("through %s: %v\n%s", tc.d.Addr, err, tc.d.Log())
		}
		if _, client, err := ParseWhoAmI(body); err != nil || client.Addr() != proxy.Addr {
			t.Fatalf("through %s the server saw %q, want the proxy's address %s", tc.d.Addr, body, proxy.Addr)
		}
	}
	if _, err := httpVia(auth, &socks5.Client{Username: auth.User, Password: "wrong"}); !errors.Is(err, socks5.ErrAuthFailed) {
		t.Errorf("wrong password: %v", err)
	}
	if _, err := httpVia(auth, &socks5.Client{}); !errors.Is(err, socks5.ErrNoAcceptableMethod) {
		t.Errorf("no credentials: %v", err)
	}
	// With RFC 1929 danted names the user in its log too.
	if got, err := auth.WaitConnect(c, h.Addr); err != nil || got.Client.Addr() != proxy.HostAddr || got.User != auth.User {
		t.Errorf("danted's record of the authenticated CONNECT: %+v, %v\n%s", got, err, auth.Log())
	}
	conn, err := net.Dial("tcp", open.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := (&socks5.Client{}).Connect(c, conn, socks5.AddrFromAddrPort(blocked.Addr)); !errors.Is(err, socks5.ErrNotAllowed) {
		t.Errorf("blocked destination: %v", err)
	}
	conn2, err := net.Dial("tcp", open.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if _, err := (&socks5.Client{}).Connect(c, conn2, socks5.AddrFromAddrPort(echo.Addr)); err != nil {
		t.Fatal(err)
	}
	got, err := open.WaitConnect(c, echo.Addr)
	if err != nil || got.Client.Addr() != proxy.HostAddr {
		t.Errorf("danted's record of the CONNECT: %+v, %v\n%s", got, err, open.Log())
	}
	if cs := open.Connects(); len(cs) != 2 || cs[0].Dest != h.Addr || cs[1].Dest != echo.Addr {
		t.Errorf("connects %+v, want the one to %s and the one to %s (the blocked one was not passed)", cs, h.Addr, echo.Addr)
	}
	t.Run("udp associate to a DNS server", func(t *testing.T) {
		d, err := dest.DNS()
		if err != nil {
			t.Fatal(err)
		}
		d.Set("via.test", netip.MustParseAddr("198.51.100.9"))
		ctl, err := net.Dial("tcp", auth.Addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer ctl.Close()
		pc, err := (&socks5.Client{Username: auth.User, Password: auth.Password}).Associate(c, ctl, func(ctx context.Context, relay netip.AddrPort) (net.Conn, error) {
			var nd net.Dialer
			return nd.DialContext(ctx, "udp", relay.String())
		})
		if err != nil {
			t.Fatalf("associate: %v\n%s", err, auth.Log())
		}
		defer pc.Close()
		m := new(dns.Msg)
		m.SetQuestion("via.test.", dns.TypeA)
		q, _ := m.Pack()
		pc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := pc.WriteToAddr(q, socks5.AddrFromAddrPort(d.Addr)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1500)
		n, _, err := pc.ReadFromAddr(buf)
		if err != nil {
			t.Fatal(err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil || len(r.Answer) != 1 {
			t.Fatalf("answer %v, %v", r, err)
		}
		if qs := d.QueriesFor("via.test"); len(qs) != 1 || qs[0].From.Addr() != proxy.Addr {
			t.Fatalf("the DNS server saw %+v, want one query from the proxy %s", qs, proxy.Addr)
		}
	})
	t.Run("tls", func(t *testing.T) {
		RequireTools(t, "socat")
		f, err := proxy.TLS(auth.Addr)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := net.Dial("tcp", f.Addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		tc, err := socks5.TLSClient(c, raw, f.ServerName, f.CAPEM)
		if err != nil {
			t.Fatalf("TLS: %v\n%s", err, f.Output())
		}
		if _, err := (&socks5.Client{Username: auth.User, Password: auth.Password}).Connect(c, tc, socks5.AddrFromAddrPort(echo.Addr)); err != nil {
			t.Fatal(err)
		}
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(tc, "over tls\n")
		if line, err := bufio.NewReader(tc).ReadString('\n'); err != nil || line != "over tls\n" {
			t.Fatalf("echo over TLS: %q %v", line, err)
		}
		other, err := NewTestPKI(TLSServerName)
		if err != nil {
			t.Fatal(err)
		}
		raw2, err := net.Dial("tcp", f.Addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw2.Close()
		if _, err := socks5.TLSClient(c, raw2, f.ServerName, other.CAPEM); err == nil {
			t.Error("a foreign CA was accepted")
		}
	})
}

// TestCloseRemovesEverything: Close leaves no namespace, link, process or
// user; a Peer on the number of a crashed one removes what it left.
func TestCloseRemovesEverything(t *testing.T) {
	RequireRoot(t)
	RequireTools(t, "ip", "danted")
	ipPath, _ := exec.LookPath("ip")
	p, err := openPeer(ipPath, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d, err := p.Dante(DanteOptions{Auth: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.HTTP(nil); err != nil {
		t.Fatal(err)
	}
	gone := func(p *Peer) {
		t.Helper()
		if _, err := os.Stat("/run/netns/" + p.Name); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s: %v", p.Name, err)
		}
		if _, err := net.InterfaceByName(p.HostLink); err == nil {
			t.Errorf("link %s is left", p.HostLink)
		}
		if u := usersWithPrefix(userPrefix(p.N)); len(u) > 0 {
			t.Errorf("users left: %v", u)
		}
		if p.dir != "" {
			if _, err := os.Stat(p.dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("directory %s: %v", p.dir, err)
			}
		}
	}
	// A crash: the lock goes, everything else stays (the process of danted
	// too). The next peer on the number removes it and makes its own.
	n, pid := p.N, d.PID()
	p.unlock()
	p.closed = true
	q, err := openPeer(ipPath, n)
	if err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("danted (pid %d) of the crashed peer still runs", pid)
	}
	if u := usersWithPrefix(userPrefix(n)); len(u) > 0 {
		t.Errorf("users of the crashed peer left: %v", u)
	}
	os.RemoveAll(p.dir) // a crashed run's directory stays in $TMPDIR
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	gone(q)
	// The number is free again.
	r, err := openPeer(ipPath, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Dante(DanteOptions{Auth: true}); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	gone(r)
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// TestNetprobe runs the workspace client inside a Peer (as it runs inside a
// workspace) against servers in another.
func TestNetprobe(t *testing.T) {
	t.Parallel()
	client, server := NewPeer(t), NewPeer(t)
	bin := filepath.Join(t.TempDir(), "netprobe")
	build := exec.Command("go", "build", "-o", bin, "./netprobe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build netprobe: %v\n%s", err, out)
	}
	run := func(args ...string) string {
		t.Helper()
		pr, err := client.Start(bin, args...)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-pr.Exited:
		case <-time.After(30 * time.Second):
			t.Fatalf("netprobe %v did not end: %s", args, pr.Output())
		}
		return pr.Output()
	}
	h, err := server.HTTP(nil)
	if err != nil {
		t.Fatal(err)
	}
	if out := run("get", h.URL("/")); !strings.HasPrefix(out, WhoAmIBody(server.Addr, netip.AddrPort{})[:40]) || !strings.Contains(out, "client "+client.Addr.String()+":") {
		t.Errorf("get: %q", out)
	}
	closed, err := server.Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	out := run("dial", h.Addr.String(), closedAddr, "192.0.2.1:80")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], h.Addr.String()+" ok ") || !strings.HasPrefix(lines[1], closedAddr+" refused ") || !strings.HasPrefix(lines[2], "192.0.2.1:80 unreachable ") {
		t.Errorf("dial:\n%s", out)
	}

	d, err := server.DNS()
	if err != nil {
		t.Fatal(err)
	}
	d.Set("a.test", netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2"))
	for _, tcp := range []string{"-tcp=false", "-tcp"} {
		if out := run("dns", tcp, "-server", d.Addr.String(), "a.test", "b.test"); out != "a.test NOERROR 198.51.100.1,198.51.100.2\nb.test NXDOMAIN \n" {
			t.Errorf("dns %s: %q", tcp, out)
		}
	}
	if qs := d.Queries(); len(qs) != 4 || qs[0].Net != "udp" || qs[2].Net != "tcp" || qs[0].From.Addr() != client.Addr {
		t.Errorf("queries %+v", qs)
	}

	sink, err := server.TCP(Sink, 0)
	if err != nil {
		t.Fatal(err)
	}
	source, err := server.TCP(Source, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"up", sink.Addr.String()}, {"down", source.Addr.String()}} {
		var res struct {
			Bytes   int64
			Seconds float64
		}
		out := run(c[0], c[1], "10000000")
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.Bytes != 10000000 || res.Seconds <= 0 {
			t.Errorf("%s: %q", c[0], out)
		}
	}
	var cr struct {
		Micros []float64
		Failed int
	}
	if out := run("connect", sink.Addr.String(), "20"); json.Unmarshal([]byte(out), &cr) != nil || len(cr.Micros) != 20 || cr.Failed != 0 {
		t.Errorf("connect: %q", out)
	}
	if out := run("idle", sink.Addr.String(), "50", "0"); !strings.HasPrefix(out, "open 50 0") || !strings.HasSuffix(out, "closed\n") {
		t.Errorf("idle: %q", out)
	}

	hs, err := server.TCP(Hold, 0)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := client.Start(bin, "hold", hs.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	sc, err := hs.Next(c)
	if err != nil {
		t.Fatal(err)
	}
	sc.Close()
	select {
	case <-pr.Exited:
	case <-c.Done():
		t.Fatal("hold did not end when the server closed")
	}
	if out := pr.Output(); !strings.HasPrefix(out, "connected "+client.Addr.String()) || !strings.Contains(out, "\nclosed after ") || !strings.HasSuffix(out, " eof\n") {
		t.Errorf("hold: %q", out)
	}

	// watch: refused, then ok once something listens.
	port, err := server.freePort()
	if err != nil {
		t.Fatal(err)
	}
	pw, err := client.Start(bin, "watch", netip.AddrPortFrom(server.Addr, port).String(), "2")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a few refused rounds first
	opened := time.Now()
	if _, err := server.TCP(Sink, port); err != nil {
		t.Fatal(err)
	}
	<-pw.Exited
	wl := strings.Split(strings.TrimSpace(pw.Output()), "\n")
	if len(wl) != 2 || !strings.HasSuffix(wl[0], " refused") || !strings.HasSuffix(wl[1], " ok") {
		t.Fatalf("watch: %q", pw.Output())
	}
	ns, _ := strconv.ParseInt(strings.Fields(wl[1])[0], 10, 64)
	if lag := time.Unix(0, ns).Sub(opened); lag < -time.Millisecond || lag > 200*time.Millisecond {
		t.Errorf("watch saw the listener %v after it opened", lag)
	}
}
