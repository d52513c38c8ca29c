package network

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/pipe"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/node/netstack"
)

// Destinations of the workspace in these tests are stand-ins in TEST-NET-2 (gVisor
// drops loopback destinations arriving on a link): the test's rewrite maps every
// 198.51.100.N:P to 127.0.0.1:P once a connection is decided and checked, so that
// several destinations lead to one loopback listener.
var standIns = netip.MustParsePrefix("198.51.100.0/24")

// standIn is the workspace's destination for a loopback listener.
func standIn(tb testing.TB, loopback string) netip.AddrPort {
	tb.Helper()
	ap := netip.MustParseAddrPort(loopback)
	if ap.Addr() != netip.MustParseAddr("127.0.0.1") {
		tb.Fatalf("%s is not on 127.0.0.1", loopback)
	}
	return netip.AddrPortFrom(netip.MustParseAddr("198.51.100.1"), ap.Port())
}

func rewriteStandIn(ap netip.AddrPort) netip.AddrPort {
	if !standIns.Contains(ap.Addr()) {
		return ap
	}
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ap.Port())
}

// dialLog records the node's socket dials of a test and refuses any address off
// loopback without sending anything.
type dialLog struct {
	mu    sync.Mutex
	addrs []string
}

func (l *dialLog) dial(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error) {
	l.mu.Lock()
	l.addrs = append(l.addrs, network+" "+addr.String())
	l.mu.Unlock()
	if !addr.Addr().IsLoopback() {
		return nil, fmt.Errorf("test dialer: %s is off loopback, not dialed", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr.String())
}

func (l *dialLog) seen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.addrs...)
}

// testConfig allow-lists the stand-ins and loopback (test peers) and dials through log.
func testConfig(log *dialLog) Config {
	return Config{
		Checker:     &netguard.Checker{Allow: []netip.Prefix{standIns, netip.MustParsePrefix("127.0.0.0/8")}},
		DialTimeout: 5 * time.Second,
		dial:        log.dial,
		rewrite:     rewriteStandIn,
	}
}

// ws is a workspace: a gVisor stack joined to a Network by a pipe.
type ws struct {
	s *stack.Stack
	n *Network
}

func newWS(tb testing.TB, cfg Config, nc *nodev1.NetworkConfig) *ws {
	tb.Helper()
	wsEnd, nodeEnd := pipe.New("", "", netstack.DefaultMTU)
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	if err := s.CreateNIC(1, wsEnd); err != nil {
		tb.Fatal(err)
	}
	if err := s.AddProtocolAddress(1, tcpip.ProtocolAddress{
		Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{
			Address: tcpip.AddrFromSlice(WorkspaceAddr.AsSlice()), PrefixLen: WorkspacePrefix.Bits(),
		},
	}, stack.AddressProperties{}); err != nil {
		tb.Fatal(err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFromSlice(Gateway.AsSlice()), NIC: 1}})
	bufs := tcpip.TCPReceiveBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: 1 << 20, Max: 8 << 20}
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &bufs)
	n, err := New(cfg, nodeEnd, nc)
	if err != nil {
		s.Close()
		tb.Fatal(err)
	}
	w := &ws{s: s, n: n}
	tb.Cleanup(w.close)
	return w
}

func (w *ws) close() {
	w.n.Close()
	w.s.Close()
	w.s.Wait()
}

func (w *ws) dial(ctx context.Context, dst netip.AddrPort) (*gonet.TCPConn, error) {
	return gonet.DialContextTCP(ctx, w.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(dst.Addr().AsSlice()), Port: dst.Port()}, ipv4.ProtocolNumber)
}

// mustDial dials dst and checks one echo round trip.
func (w *ws) mustDial(tb testing.TB, dst netip.AddrPort) *gonet.TCPConn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := w.dial(ctx, dst)
	if err != nil {
		tb.Fatalf("dial %v: %v", dst, err)
	}
	tb.Cleanup(func() { c.Close() })
	roundTrip(tb, c)
	return c
}

// mustRefuse dials dst and wants a RST.
func (w *ws) mustRefuse(tb testing.TB, dst netip.AddrPort) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := w.dial(ctx, dst)
	d := time.Since(start)
	if err == nil {
		c.Close()
		tb.Fatalf("dial %v succeeded, want connection refused", dst)
	}
	if !strings.Contains(err.Error(), "refused") {
		tb.Fatalf("dial %v: %v, want connection refused", dst, err)
	}
	return d
}

var seq atomic.Int64

// roundTrip writes a line and wants it echoed.
func roundTrip(tb testing.TB, c net.Conn) {
	tb.Helper()
	if err := tryRoundTrip(c); err != nil {
		tb.Fatal(err)
	}
}

func tryRoundTrip(c net.Conn) error {
	msg := fmt.Sprintf("ping %d\n", seq.Add(1))
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if string(buf) != msg {
		return fmt.Errorf("echoed %q, want %q", buf, msg)
	}
	return nil
}

// ended waits until c is ended by the node (a read fails other than by timeout).
func ended(tb testing.TB, c net.Conn, within time.Duration) time.Duration {
	tb.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(within))
	defer c.SetReadDeadline(time.Time{})
	_, err := c.Read(make([]byte, 1))
	d := time.Since(start)
	if err == nil {
		tb.Fatal("read data on a connection that should have ended")
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		tb.Fatalf("connection still open after %v", within)
	}
	return d
}

// echoServer echoes on 127.0.0.1 until the test ends.
func echoServer(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	return l.Addr().String()
}

// fakeSOCKS is a minimal SOCKS5 CONNECT proxy on loopback (RFC 1928 with optional
// RFC 1929) for the tests that need no real Dante: it records every CONNECT target.
type fakeSOCKS struct {
	addr       string
	user, pass string
	mu         sync.Mutex
	targets    []string
}

func newFakeSOCKS(tb testing.TB, user, pass string) *fakeSOCKS {
	return newFakeSOCKSOn(tb, user, pass, nil)
}

// newFakeSOCKSOn is a fakeSOCKS inside TLS when tc is not nil.
func newFakeSOCKSOn(tb testing.TB, user, pass string, tc *tls.Config) *fakeSOCKS {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	if tc != nil {
		l = tls.NewListener(l, tc)
	}
	f := &fakeSOCKS{addr: l.Addr().String(), user: user, pass: pass}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	tb.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				up, err := f.handshake(c)
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, up)
				mu.Unlock()
				defer up.Close()
				done := make(chan struct{})
				go func() {
					io.Copy(up, c)
					up.(*net.TCPConn).CloseWrite()
					close(done)
				}()
				io.Copy(c, up)
				c.(interface{ CloseWrite() error }).CloseWrite()
				<-done
			}()
		}
	}()
	return f
}

func (f *fakeSOCKS) handshake(c net.Conn) (net.Conn, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil || hdr[0] != 5 {
		return nil, errors.New("greeting")
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return nil, err
	}
	want := byte(0)
	if f.user != "" {
		want = 2
	}
	if !strings.ContainsRune(string(methods), rune(want)) {
		c.Write([]byte{5, 0xff})
		return nil, errors.New("no method")
	}
	c.Write([]byte{5, want})
	if want == 2 {
		var v [2]byte
		io.ReadFull(c, v[:])
		u := make([]byte, v[1])
		io.ReadFull(c, u)
		var pl [1]byte
		io.ReadFull(c, pl[:])
		p := make([]byte, pl[0])
		io.ReadFull(c, p)
		if string(u) != f.user || string(p) != f.pass {
			c.Write([]byte{1, 1})
			return nil, errors.New("auth")
		}
		c.Write([]byte{1, 0})
	}
	var req [4]byte
	if _, err := io.ReadFull(c, req[:]); err != nil || req[1] != 1 || req[3] != 1 {
		c.Write([]byte{5, 7, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, errors.New("request")
	}
	var a [6]byte
	if _, err := io.ReadFull(c, a[:]); err != nil {
		return nil, err
	}
	dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(a[:4])), binary.BigEndian.Uint16(a[4:]))
	f.mu.Lock()
	f.targets = append(f.targets, dst.String())
	f.mu.Unlock()
	up, err := net.DialTimeout("tcp", dst.String(), 5*time.Second)
	if err != nil {
		c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, err
	}
	c.Write([]byte{5, 0, 0, 1, 127, 0, 0, 1, 0, 0})
	return up, nil
}

func (f *fakeSOCKS) connects() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.targets)
}

// Building configurations.

func dest(cidr string) *ctrlv1.Destination { return &ctrlv1.Destination{Cidr: cidr} }

func hostDest(ap netip.AddrPort) *ctrlv1.Destination {
	return &ctrlv1.Destination{Cidr: netip.PrefixFrom(ap.Addr(), 32).String(), PortMin: uint32(ap.Port()), PortMax: uint32(ap.Port())}
}

func public(rev uint64) *ctrlv1.NetworkPolicy {
	return &ctrlv1.NetworkPolicy{Revision: rev, Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET}
}

func route(egressID string, ds ...*ctrlv1.Destination) *ctrlv1.EgressRoute {
	return &ctrlv1.EgressRoute{EgressId: egressID, Destinations: ds}
}

func socksEgress(id string, rev uint64, addr string, drain uint32) *nodev1.NetworkEgress {
	return &nodev1.NetworkEgress{
		EgressId: id, Revision: rev, DrainSeconds: drain,
		Spec: &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: addr}}},
	}
}

func withAuth(e *nodev1.NetworkEgress, user, pass string) *nodev1.NetworkEgress {
	e.Spec.GetSocks5().Username, e.Spec.GetSocks5().Password = user, pass
	return e
}

// settled waits until the goroutine count is back to before.
func settled(tb testing.TB, before int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			tb.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not reached in 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
