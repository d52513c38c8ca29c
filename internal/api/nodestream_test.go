package api_test

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/pki"
)

// TestNodeLeavingIsNoError: a node that ends its stream, or whose
// connection drops, has gone away; ctrl logs it disconnected, and never as
// an internal error of its own (the EOF connect-go reports for a dropped
// connection was logged at ERROR with an error ID).
func TestNodeLeavingIsNoError(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	cert, key := filepath.Join(t.TempDir(), "node.pem"), filepath.Join(t.TempDir(), "node-key.pem")
	if err := pki.IssueClient(e.PKI.CA, e.PKI.CAKey, "node-x", pki.RoleNode, time.Hour, cert, key); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		leave func(stream *connect.BidiStreamForClient[nodev1.ConnectRequest, nodev1.ConnectResponse], conn net.Conn)
	}{
		{"closes its stream", func(s *connect.BidiStreamForClient[nodev1.ConnectRequest, nodev1.ConnectResponse], _ net.Conn) {
			_ = s.CloseRequest()
		}},
		{"drops its connection", func(_ *connect.BidiStreamForClient[nodev1.ConnectRequest, nodev1.ConnectResponse], c net.Conn) {
			_ = c.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tlsc, err := pki.ClientConfig(e.PKI.CA, cert, key)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var conn net.Conn
			hc := &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc,
				DialTLSContext: func(ctx context.Context, network, addr string, cfg *tls.Config) (net.Conn, error) {
					c, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, network, addr)
					mu.Lock()
					conn = c
					mu.Unlock()
					return c, err
				}}}
			before := strings.Count(e.Log.String(), `"node disconnected"`)
			stream := nodev1connect.NewNodeServiceClient(hc, e.URL).Connect(t.Context())
			defer func() { _ = stream.CloseResponse() }()
			if err := stream.Send(&nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Hello{Hello: &nodev1.Hello{
				NodeId: "node-x", Capacity: &nodev1.Capacity{MemoryMib: 1024, CpuMillis: 1000}}}}); err != nil {
				t.Fatal(err)
			}
			if _, err := stream.Receive(); err != nil {
				t.Fatalf("full state: %v", err)
			}
			mu.Lock()
			tc.leave(stream, conn)
			mu.Unlock()
			deadline := time.Now().Add(10 * time.Second)
			for strings.Count(e.Log.String(), `"node disconnected"`) == before {
				if time.Now().After(deadline) {
					t.Fatal("ctrl did not log the node disconnected within 10 s")
				}
				time.Sleep(10 * time.Millisecond)
			}
			// The handler's error is logged after its return, which follows
			// "node disconnected": watch the log for a while.
			for range 25 {
				for line := range strings.Lines(e.Log.String()) {
					if strings.Contains(line, `"level":"ERROR"`) {
						t.Fatalf("ctrl logged an error for a node leaving: %s", line)
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
