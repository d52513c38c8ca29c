package api_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/enroll"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/store"
)

// TestNodeIdentity: a node speaks only as the node its certificate names,
// and not at all once that node is retired.
//
//   - The certificate of node-x sending a Hello for node-y (registered or
//     not) is refused, permission_denied, and nothing is written for
//     node-y.
//   - Once node-y is retired, its certificate is refused, permission_denied,
//     on every node-facing call (Connect, RenewCertificate, FetchArtifact;
//     data tunnels admit with the same nodepeer.Admit); so is a
//     certificate issued by hand for node-y after the retirement, with a
//     key nobody denied: the node ID is a tombstone.
func TestNodeIdentity(t *testing.T) {
	e := ctrltest.New(t, ctrltest.Options{Enrollment: true})
	ctx := t.Context()
	byHand := func(id string) (string, string) {
		d := t.TempDir()
		cf, kf := filepath.Join(d, "node.pem"), filepath.Join(d, "node-key.pem")
		if err := pki.IssueClient(e.PKI.CA, e.PKI.CAKey, id, pki.RoleNode, time.Hour, cf, kf); err != nil {
			t.Fatal(err)
		}
		return cf, kf
	}
	xCert, xKey := byHand("node-x")
	yCert, yKey := byHand("node-y")
	if err := connectNode(t, e, e.Client(t, yCert, yKey), "node-y"); err != nil {
		t.Fatalf("node-y with its own certificate: %v", err)
	}
	nodes := ctrlv1connect.NewNodeServiceClient(e.HTTP, e.URL)
	before := getNode(t, nodes, "node-y")

	for _, id := range []string{"node-y", "node-z"} {
		err := connectNode(t, e, e.Client(t, xCert, xKey), id)
		d := wantErr(t, err, connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
		if !strings.Contains(d.GetMessage(), "does not name the node") {
			t.Errorf("node-x's certificate saying Hello for %s: refused with %q", id, d.GetMessage())
		}
	}
	if after := getNode(t, nodes, "node-y"); after.GetRegistrationVersion() != before.GetRegistrationVersion() {
		t.Errorf("node-y changed by another node's Hello: %v → %v", before, after)
	}
	_, err := nodes.GetNode(ctx, connect.NewRequest(&ctrlv1.GetNodeRequest{NodeId: "node-z"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("node-z after node-x's Hello for it: %v, want not_found", err)
	}
	_ = e.Store.View(ctx, func(tx store.Tx) error {
		if _, err := tx.GetNode(ctx, "node-z"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("node-z stored after node-x's Hello for it: %v", err)
		}
		return nil
	})
	// node-x itself is fine.
	if err := connectNode(t, e, e.Client(t, xCert, xKey), "node-x"); err != nil {
		t.Errorf("node-x with its own certificate: %v", err)
	}

	// Retire node-y (drained, empty).
	v := getNode(t, nodes, "node-y").GetRegistrationVersion()
	if _, err := nodeOp(nodes, "drain", "id-drain-y", "node-y", v); err != nil {
		t.Fatalf("drain node-y: %v", err)
	}
	if _, err := nodeOp(nodes, "retire", "id-retire-y", "node-y", v); err != nil {
		t.Fatalf("retire node-y: %v", err)
	}
	lateCert, lateKey := byHand("node-y") // a new key, denied by nobody
	for _, c := range []struct{ name, cert, key string }{{"its certificate", yCert, yKey}, {"a certificate issued after the retirement", lateCert, lateKey}} {
		hc, renewer, err := enroll.Client(e.URL, e.PKI.CA, c.cert, c.key, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := connectNode(t, e, hc, "node-y"); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("retired node-y, %s: Connect = %v, want permission_denied", c.name, err)
		}
		if err := renewer.Renew(ctx); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("retired node-y, %s: RenewCertificate = %v, want permission_denied", c.name, err)
		}
		s, err := nodev1connect.NewNodeServiceClient(hc, e.URL).FetchArtifact(ctx, connect.NewRequest(&nodev1.FetchArtifactRequest{Digest: "sha256:" + strings.Repeat("0", 64)}))
		if err == nil {
			for s.Receive() {
			}
			err = s.Err()
			_ = s.Close()
		}
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("retired node-y, %s: FetchArtifact = %v, want permission_denied", c.name, err)
		}
	}
	// Another node is not affected.
	if err := connectNode(t, e, e.Client(t, xCert, xKey), "node-x"); err != nil {
		t.Errorf("node-x after node-y's retirement: %v", err)
	}
}
