package socks5

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

// fakeRelay is a UDP relay on 127.0.0.1 that answers each datagram with a
// fragment (to be dropped), a malformed datagram (to be dropped), then the
// datagram itself with its header, as an echo through the proxy would.
func fakeRelay(t *testing.T) *net.UDPConn {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFromUDP(buf)
			if err != nil {
				return
			}
			frag := append([]byte(nil), buf[:n]...)
			frag[2] = 1
			pc.WriteToUDP(frag, from)
			pc.WriteToUDP([]byte{0, 0, 0, 9, 9}, from)
			pc.WriteToUDP(buf[:n], from)
		}
	}()
	return pc
}

// associateProxy accepts one control connection on 127.0.0.1, answers a UDP
// ASSOCIATE with relay, then holds the connection until the client closes it
// or closeControl is closed.
func associateProxy(t *testing.T, relay Addr, closeControl <-chan struct{}) net.Addr {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if err := expect(c, []byte{5, 1, 0}); err != nil {
			t.Error(err)
			return
		}
		c.Write([]byte{5, 0})
		if err := expect(c, []byte{5, 3, 0, 1, 0, 0, 0, 0, 0, 0}); err != nil {
			t.Error(err)
			return
		}
		c.Write(append([]byte{5, 0, 0}, enc(relay)...))
		go func() { <-closeControl; c.Close() }()
		c.Read(make([]byte, 1))
	}()
	return ln.Addr()
}

func dialUDP(got *netip.AddrPort) func(ctx context.Context, relay netip.AddrPort) (net.Conn, error) {
	return func(ctx context.Context, relay netip.AddrPort) (net.Conn, error) {
		*got = relay
		var d net.Dialer
		return d.DialContext(ctx, "udp", relay.String())
	}
}

func TestAssociate(t *testing.T) {
	relay := fakeRelay(t)
	relayAP := relay.LocalAddr().(*net.UDPAddr).AddrPort()
	closeControl := make(chan struct{})
	proxy := associateProxy(t, AddrFromAddrPort(relayAP), closeControl)
	control, err := net.Dial("tcp", proxy.String())
	if err != nil {
		t.Fatal(err)
	}
	var dialed netip.AddrPort
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pc, err := (&Client{}).Associate(ctx, control, dialUDP(&dialed))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if dialed != relayAP || pc.Relay() != relayAP {
		t.Errorf("dialed %v, want the relay %v", dialed, relayAP)
	}
	pc.SetDeadline(time.Now().Add(5 * time.Second))
	for _, dst := range []Addr{v4, v6, name} {
		msg := []byte("datagram to " + dst.String())
		if n, err := pc.WriteTo(msg, dst); err != nil || n != len(msg) {
			t.Fatalf("write %d, %v", n, err)
		}
		buf := make([]byte, 2048)
		n, src, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		if src != dst || !bytes.Equal(buf[:n], msg) {
			t.Errorf("got %q from %v, want %q from %v (fragments and malformed datagrams dropped)", buf[:n], src, msg, dst)
		}
	}
	// A *net.UDPAddr works as a destination too.
	if _, err := pc.WriteTo([]byte("u"), net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:9"))); err != nil {
		t.Fatal(err)
	}
	// The proxy closing the control connection ends the association.
	close(closeControl)
	select {
	case <-pc.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("association outlived its control connection")
	}
	if _, _, err := pc.ReadFrom(make([]byte, 10)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after the end: %v", err)
	}
}

// TestAssociateUnspecifiedRelay: a relay of 0.0.0.0 means the proxy's address.
func TestAssociateUnspecifiedRelay(t *testing.T) {
	relay := fakeRelay(t)
	port := relay.LocalAddr().(*net.UDPAddr).Port
	proxy := associateProxy(t, Addr{IP: netip.IPv4Unspecified(), Port: uint16(port)}, make(chan struct{}))
	control, err := net.Dial("tcp", proxy.String())
	if err != nil {
		t.Fatal(err)
	}
	var dialed netip.AddrPort
	pc, err := (&Client{}).Associate(context.Background(), control, dialUDP(&dialed))
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)); dialed != want {
		t.Errorf("dialed %v, want %v", dialed, want)
	}
	// Closing the association closes the control connection.
	pc.Close()
	if _, err := control.Write([]byte{0}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("control after Close: %v", err)
	}
}

func TestAssociateBadRelay(t *testing.T) {
	for _, relay := range []Addr{{Name: "relay.test", Port: 1}, {IP: netip.MustParseAddr("127.0.0.1"), Port: 0}} {
		proxy := associateProxy(t, relay, make(chan struct{}))
		control, err := net.Dial("tcp", proxy.String())
		if err != nil {
			t.Fatal(err)
		}
		var dialed netip.AddrPort
		_, err = (&Client{}).Associate(context.Background(), control, dialUDP(&dialed))
		if !errors.Is(err, ErrProtocol) || dialed.IsValid() {
			t.Errorf("relay %v: %v, dialed %v", relay, err, dialed)
		}
		control.Close()
	}
}
