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

	"github.com/kibotos/kibotos/internal/node/netattach"
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

// tapNetns creates a network namespace with the workspace's TAP in it, as
// internal/node/netattach makes it in production (eth0: wsAddr, default route via
// gateway, the node's link endpoint on its descriptor), and returns the namespace's
// name, the ip command and the link, all removed when tb ends. It skips tb when not root
// or a tool is missing.
func tapNetns(tb testing.TB) (name, ipPath string, link *netattach.Link) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates a network namespace and a TAP device")
	}
	ipPath, err := exec.LookPath("ip")
	if err != nil {
		tb.Skip("needs the ip command (iproute2)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		tb.Skip("needs /dev/net/tun")
	}
	name = fmt.Sprintf("kbnetstack-%d", os.Getpid())
	if out, err := exec.Command(ipPath, "netns", "add", name).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add: %v: %s", err, out)
	}
	tb.Cleanup(func() { exec.Command(ipPath, "netns", "del", name).Run() })
	if out, err := exec.Command(ipPath, "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		tb.Fatalf("lo up: %v: %s", err, out)
	}
	ns, err := os.Open(nsPath(name))
	if err != nil {
		tb.Fatal(err)
	}
	defer ns.Close()
	link, err = netattach.AttachNetns(ns, netattach.Options{Address: wsAddr, Gateway: gateway, MTU: DefaultMTU})
	if err != nil {
		tb.Fatalf("TAP in the netns: %v", err)
	}
	tb.Cleanup(func() { link.Close() })
	return name, ipPath, link
}

func nsPath(name string) string { return "/var/run/netns/" + name }

// tapStack is the Stack on the TAP's link endpoint; closed when tb ends (before the
// link).
func tapStack(tb testing.TB, link *netattach.Link, cfg Config) *Stack {
	tb.Helper()
	cfg.Link, cfg.Address, cfg.Gateway = link.Endpoint, wsAddr, gateway
	node, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { node.Close() })
	return node
}

// dialInside dials dst from inside the netns.
func dialInside(name string, dst netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := inNetns(nsPath(name), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", dst.String())
		return err
	})
	return c, err
}

// TestTAPInNetns: the workspace's TAP in a network namespace the test creates, and a
// connection from inside the namespace through the Stack to an echo server on the
// host's loopback; a refused destination is connection refused there.
func TestTAPInNetns(t *testing.T) {
	name, ipPath, link := tapNetns(t)
	echo := echoServer(t)
	before := runtime.NumGoroutine()
	node := tapStack(t, link, Config{Decide: decider(dialTo(echo), nil)})
	dialInside := func(dst netip.AddrPort) (net.Conn, error) { return dialInside(name, dst) }

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
	node.Close()
	// The link's reader ends with the NIC.
	waitFor(t, func() bool { return runtime.NumGoroutine() <= before })
}

// BenchmarkTAPThroughput: one connection from inside a netns through the TAP, its link
// and the Stack to a process on the host's loopback (up: the workspace sends; down: it
// receives). The production path, less the workspace's sandbox.
func BenchmarkTAPThroughput(b *testing.B) {
	name, _, link := tapNetns(b)
	chunk := make([]byte, 256<<10)
	for _, dir := range []string{"up", "down"} {
		b.Run(dir, func(b *testing.B) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			node := tapStack(b, link, Config{Decide: decider(dialTo(l.Addr().String()), nil)})
			defer node.Close()
			done := make(chan int64, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					done <- 0
					return
				}
				defer c.Close()
				if dir == "up" {
					n, _ := io.Copy(io.Discard, c)
					done <- n
					return
				}
				var n int64
				for range b.N {
					m, err := c.Write(chunk)
					n += int64(m)
					if err != nil {
						break
					}
				}
				c.(*net.TCPConn).CloseWrite()
				done <- n
			}()
			c, err := dialInside(name, allowed)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.SetBytes(int64(len(chunk)))
			b.ResetTimer()
			var n int64
			if dir == "up" {
				for range b.N {
					if _, err := c.Write(chunk); err != nil {
						b.Fatal(err)
					}
				}
				c.(*net.TCPConn).CloseWrite()
				n = <-done
			} else {
				n, _ = io.Copy(io.Discard, c)
				<-done
			}
			b.StopTimer()
			if want := int64(b.N) * int64(len(chunk)); n != want {
				b.Fatalf("%d bytes arrived, want %d", n, want)
			}
		})
	}
}
