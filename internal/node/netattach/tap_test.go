//go:build linux

package netattach

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/kibotos/kibotos/internal/node/netstack"
)

// TestTAPBulkBothWays: 8 MiB each way at once between the workspace and a host echo
// server through the TAP's endpoint and the node's stack, arriving intact, with the
// link's MTU and with a smaller one the workspace set itself (the node's 64 KiB TCP
// packets then segmented by the workspace's kernel, the workspace's own sent whole with
// TSO). The TAP carries a virtio-net header and offers the workspace its offloads.
func TestTAPBulkBothWays(t *testing.T) {
	requireRoot(t)
	for _, mtu := range []int{int(testOpts.MTU), 1500} {
		t.Run(fmt.Sprint("mtu ", mtu), func(t *testing.T) {
			ws := newNetns(t)
			h := handleIn(t, ws)
			echo := listenIn(t, nil, "tcp", "127.0.0.1:0")
			link, err := AttachNetns(ws, testOpts)
			if err != nil {
				t.Fatal(err)
			}
			defer link.Close()
			if _, ok := link.Endpoint.(stack.GSOEndpoint); !ok {
				t.Fatal("the endpoint does not offer GSO to the stack: it would compute every checksum")
			}
			l, err := h.LinkByName(Name)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.LinkSetMTU(l, mtu); err != nil {
				t.Fatal(err)
			}
			s, err := netstack.New(netstack.Config{Link: link.Endpoint, Address: testOpts.Address, Gateway: testOpts.Gateway, MTU: testOpts.MTU,
				Decide: func(context.Context, netip.AddrPort) (netstack.Decision, error) {
					return netstack.Decision{Dial: func(ctx context.Context) (net.Conn, error) {
						return (&net.Dialer{}).DialContext(ctx, "tcp", echo)
					}, Path: "direct"}, nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			c, err := dialIn(t, ws, nil, "tcp", "198.51.100.7:80")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			want := make([]byte, 8<<20)
			rand.Read(want)
			errc := make(chan error, 1)
			go func() {
				_, err := c.Write(want)
				errc <- err
			}()
			got := make([]byte, len(want))
			if _, err := io.ReadFull(c, got); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("the echo differs from what was sent")
			}
		})
	}
}

// lockedDispatcher takes a lock to deliver a frame, as gVisor's stack takes its own to
// route a reply.
type lockedDispatcher struct {
	mu        *sync.Mutex
	delivered chan struct{}
}

func (d lockedDispatcher) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {
	select {
	case d.delivered <- struct{}{}:
	default:
	}
	d.mu.Lock()
	d.mu.Unlock()
}

func (d lockedDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

// TestDetachWhileDelivering: detaching the endpoint (gVisor's RemoveNIC, which holds
// the stack's lock) returns while the reader waits for that lock to deliver a frame;
// Wait, called without the lock, returns once the reader is gone.
func TestDetachWhileDelivering(t *testing.T) {
	requireRoot(t)
	ws := newNetns(t)
	link, err := AttachNetns(ws, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	var stackMu sync.Mutex
	d := lockedDispatcher{mu: &stackMu, delivered: make(chan struct{}, 1)}
	stackMu.Lock()
	link.Endpoint.Attach(d)
	// A datagram to the outside makes the workspace's kernel ask for the gateway's
	// address: a broadcast frame the endpoint takes.
	c, err := dialIn(t, ws, nil, "udp", "198.51.100.7:9")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.delivered:
	case <-time.After(5 * time.Second):
		t.Fatal("no frame reached the dispatcher")
	}
	detached := make(chan struct{})
	go func() {
		link.Endpoint.Attach(nil)
		close(detached)
	}()
	select {
	case <-detached:
	case <-time.After(5 * time.Second):
		stackMu.Unlock()
		t.Fatal("detaching waited for the reader, which waits for the lock the detacher holds")
	}
	if link.Endpoint.IsAttached() {
		t.Error("still attached after Attach(nil)")
	}
	stackMu.Unlock()
	waited := make(chan struct{})
	go func() {
		link.Endpoint.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("the reader did not end after detaching")
	}
}
