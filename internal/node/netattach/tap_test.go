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
	"testing"
	"time"

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
