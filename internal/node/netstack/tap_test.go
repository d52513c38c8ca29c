//go:build linux

package netstack

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/link/tun"
)

// inNetns runs fn on an OS thread that has joined the network namespace ns (a path
// such as /var/run/netns/NAME). Sockets fn creates belong to that namespace for good.
func inNetns(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open(ns)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		ferr := fn()
		// A thread that cannot go back stays locked and ends with this goroutine.
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// TestTAPInNetns: a TAP in a network namespace the test creates, its fd handed to
// fdbased, and a connection from inside the namespace through the Stack to an echo
// server on the host's loopback; a refused destination is connection refused there.
func TestTAPInNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and a TAP device")
	}
	ipPath, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("needs the ip command (iproute2)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("needs /dev/net/tun")
	}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ipPath, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	name := fmt.Sprintf("kbnetstack-%d", os.Getpid())
	ip("netns", "add", name)
	t.Cleanup(func() { exec.Command(ipPath, "netns", "del", name).Run() })
	nsPath := "/var/run/netns/" + name

	fd := -1
	if err := inNetns(nsPath, func() error {
		var err error
		fd, err = tun.OpenTAP("tap0")
		return err
	}); err != nil {
		t.Fatalf("TAP in the netns: %v", err)
	}
	defer unix.Close(fd)
	ip("-n", name, "link", "set", "lo", "up")
	ip("-n", name, "link", "set", "tap0", "mtu", fmt.Sprint(DefaultMTU), "up")
	ip("-n", name, "addr", "add", wsAddr.String(), "dev", "tap0")
	ip("-n", name, "route", "add", "default", "via", gateway.String())

	echo := echoServer(t)
	before := runtime.NumGoroutine()
	link, err := fdbased.New(&fdbased.Options{
		FDs:            []int{fd},
		MTU:            DefaultMTU,
		EthernetHeader: true,
		Address:        tcpip.LinkAddress("\x02\x6b\x62\x00\x00\x01"),
	})
	if err != nil {
		t.Fatal(err)
	}
	node, err := New(Config{
		Link: link, Address: wsAddr, Gateway: gateway,
		Decide: decider(dialTo(echo), nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			node.Close()
		}
	}()

	dialInside := func(dst netip.AddrPort) (net.Conn, error) {
		var c net.Conn
		err := inNetns(nsPath, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, "tcp", dst.String())
			return err
		})
		return c, err
	}

	start := time.Now()
	if _, err := dialInside(refused); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("refused destination from the netns: %v, want ECONNREFUSED", err)
	}
	t.Logf("refused in %v", time.Since(start))

	// ICMP: gVisor answers echo requests to the gateway's own address only; any other
	// destination stays silent (no probing of what lies beyond through the stack).
	if busybox, err := exec.LookPath("busybox"); err == nil {
		ping := func(dst netip.Addr, wait string) ([]byte, error) {
			return exec.Command(ipPath, "netns", "exec", name, busybox, "ping", "-c", "1", "-W", wait, dst.String()).CombinedOutput()
		}
		if out, err := ping(allowed.Addr(), "1"); err == nil {
			t.Errorf("ping of %s from the netns was answered: %s", allowed.Addr(), out)
		}
		if out, err := ping(gateway, "2"); err != nil {
			t.Errorf("ping of the gateway from the netns: %v: %s", err, out)
		}
	} else {
		t.Log("no busybox: ICMP not checked")
	}

	c, err := dialInside(allowed)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := make([]byte, 64<<20)
	rand.Read(want)
	start = time.Now()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(want)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	if !bytes.Equal(got, want) {
		t.Fatalf("echoed %d bytes, not the 64 MiB sent", len(got))
	}
	t.Logf("64 MiB each way through the TAP in %v (%.0f MiB/s each way)", elapsed, 64/elapsed.Seconds())

	c.Close()
	closed = true
	node.Close()
	// fdbased's dispatch goroutines end with the NIC.
	waitFor(t, func() bool { return runtime.NumGoroutine() <= before })
}
