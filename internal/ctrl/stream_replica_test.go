package ctrl

import (
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/tunnel"
)

// TestKeyDeniedElsewhereEndsStream: a node's control stream held by this
// replica ends, permission_denied, when another replica denies the
// stream's key (the deny-list row, then the key's notification), and not
// at a notification of another key.
func TestKeyDeniedElsewhereEndsStream(t *testing.T) {
	srv, base, p := serve(t)
	tlsc, h := nodeCert(t, p, "node-1")
	hc := &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}}
	stream := nodev1connect.NewNodeServiceClient(hc, base).Connect(t.Context())
	if err := stream.Send(&nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Hello{Hello: &nodev1.Hello{NodeId: "node-1",
		Capacity: &nodev1.Capacity{MemoryMib: 1024, CpuMillis: 1000}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Receive(); err != nil {
		t.Fatalf("the full desired state: %v", err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Receive(); err != nil {
				ended <- err
				return
			}
		}
	}()
	srv.cfg.Store.Notify(tunnel.KeyTopic([]byte("another")))
	select {
	case err := <-ended:
		t.Fatalf("the stream ended at another key's notification: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := srv.cfg.Store.InTx(t.Context(), func(tx store.Tx) error {
		return tx.DenyNodeKey(t.Context(), &store.DeniedNodeKey{KeyHash: h, NodeID: "node-1", DeniedAt: time.Now(), Reason: "test"})
	}); err != nil {
		t.Fatal(err)
	}
	denied := time.Now()
	srv.cfg.Store.Notify(tunnel.KeyTopic(h))
	select {
	case err := <-ended:
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("stream ended with %v, want permission_denied", err)
		}
		t.Logf("ended %v after the notification", time.Since(denied).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the stream of the key denied elsewhere is still open after 5 s")
	}
}
