package ctrl

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/tunnel"
)

// TestKeyDeniedElsewhereClosesTunnels: a key denied by another replica
// (the denial committed to the store and its topic notified, as the other
// replica's endTunnelKey does) closes this replica's tunnels opened with
// it.
func TestKeyDeniedElsewhereClosesTunnels(t *testing.T) {
	srv, base, p := serve(t)
	tlsc, h := nodeCert(t, p, "node-1")
	tlsc.NextProtos = []string{"http/1.1"}
	u, _ := url.Parse(base)
	conn, err := tls.Dial("tcp", u.Host, tlsc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nUpgrade: %s\r\nConnection: Upgrade\r\nContent-Length: 0\r\n\r\n", tunnel.Path, u.Host, tunnel.Protocol)
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("tunnel: %v %v", res, err)
	}
	for deadline := time.Now().Add(5 * time.Second); srv.tunnels.Count("node-1") == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tunnel was not registered")
		}
	}
	// Another key's notification closes nothing.
	srv.cfg.Store.Notify(tunnel.KeyTopic([]byte("another")))
	srv.cfg.Store.Notify(tunnel.NodeTopic("node-1")) // not isolated: stays
	time.Sleep(100 * time.Millisecond)
	if n := srv.tunnels.Count("node-1"); n != 1 {
		t.Fatalf("%d tunnels open after notifications that refuse nothing, want 1", n)
	}
	// The other replica's denial: the row, then the notification.
	if err := srv.cfg.Store.InTx(t.Context(), func(tx store.Tx) error {
		return tx.DenyNodeKey(t.Context(), &store.DeniedNodeKey{KeyHash: h, NodeID: "node-1", DeniedAt: time.Now(), Reason: "test"})
	}); err != nil {
		t.Fatal(err)
	}
	denied := time.Now()
	srv.cfg.Store.Notify(tunnel.KeyTopic(h))
	for srv.tunnels.Count("node-1") != 0 {
		if time.Since(denied) > 5*time.Second {
			t.Fatal("the tunnel of the key denied elsewhere is still open after 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("closed %v after the notification", time.Since(denied).Round(time.Millisecond))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Errorf("the tunnel was not closed by ctrl: %v", err)
	}
}

// nodeCert issues a node certificate for id from p's CA and returns a
// client TLS config presenting it, and the SHA-256 of its key.
func nodeCert(t *testing.T, p pki.DevPaths, id string) (*tls.Config, []byte) {
	t.Helper()
	dir := t.TempDir()
	cert, key := dir+"/node.pem", dir+"/node-key.pem"
	if err := pki.IssueClient(p.CA, p.CAKey, id, pki.RoleNode, time.Hour, cert, key); err != nil {
		t.Fatal(err)
	}
	tlsc, err := pki.ClientConfig(p.CA, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := pki.LoadClientCertificate(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	h, err := pki.PublicKeyHash(holder.Current().Leaf.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return tlsc, h[:]
}
