//go:build linux

package netattach

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates network namespaces, TAP devices and nftables tables")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		tb.Skip("needs /dev/net/tun")
	}
}

// newNetns makes a fresh network namespace with lo up and returns it; it
// lives until tb ends (and whatever still pins it is gone).
func newNetns(tb testing.TB) *os.File {
	tb.Helper()
	type res struct {
		f   *os.File
		err error
	}
	c := make(chan res, 1)
	go func() {
		// The thread never leaves the new namespace: it stays locked and
		// ends with this goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			c <- res{nil, err}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		c <- res{f, err}
	}()
	r := <-c
	if r.err != nil {
		tb.Fatalf("new network namespace: %v", r.err)
	}
	tb.Cleanup(func() { r.f.Close() })
	h := handleIn(tb, r.f)
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		tb.Fatalf("lo up: %v", err)
	}
	return r.f
}

// handleIn is a netlink handle bound to ns, closed when tb ends.
func handleIn(tb testing.TB, ns *os.File) *netlink.Handle {
	tb.Helper()
	var h *netlink.Handle
	if err := inNetns(ns, func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(h.Close)
	return h
}

// in runs fn with the calling thread inside ns: sockets fn opens belong to
// ns for good. A nil ns is the test's own.
func in(tb testing.TB, ns *os.File, fn func()) {
	tb.Helper()
	if ns == nil {
		fn()
		return
	}
	if err := inNetns(ns, func() error { fn(); return nil }); err != nil {
		tb.Fatal(err)
	}
}

// listenIn listens on addr inside ns with an echo server, closed when tb
// ends, and returns its address.
func listenIn(tb testing.TB, ns *os.File, network, addr string) string {
	tb.Helper()
	var l net.Listener
	var err error
	in(tb, ns, func() { l, err = net.Listen(network, addr) })
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

// dialIn dials addr from inside ns, with SO_MARK = b.Mark unless b is nil.
func dialIn(tb testing.TB, ns *os.File, b *Backstop, network, addr string) (net.Conn, error) {
	tb.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if b != nil {
		d.Control = b.Control
	}
	var c net.Conn
	var err error
	in(tb, ns, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err = d.DialContext(ctx, network, addr)
	})
	return c, err
}

// echoes checks one round trip on c and closes it.
func echoes(tb testing.TB, c net.Conn) {
	tb.Helper()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		tb.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		tb.Fatalf("echo: %q, %v", b, err)
	}
}

// waitFor polls cond for at most 5s.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			tb.Fatalf("%s: not reached in 5s; goroutines:\n%s", what, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// busybox returns the path of busybox, or skips tb.
func busybox(tb testing.TB) string {
	tb.Helper()
	p, err := exec.LookPath("busybox")
	if err != nil {
		tb.Skip("needs busybox")
	}
	return p
}

func isRefused(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "refused") || strings.Contains(err.Error(), "reset"))
}
