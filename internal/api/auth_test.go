package api_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/enroll"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/store"
)

// issueWithOUs signs a client certificate with the deployment's CA for
// common name cn and exactly the OUs given (none when empty), as a CA that
// issues certificates for other roles would; it returns the files.
func issueWithOUs(t *testing.T, e *ctrltest.Env, cn string, ous ...string) (certFile, keyFile string) {
	t.Helper()
	caCert, err := pki.LoadLeaf(e.PKI.CA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(e.PKI.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	caKey, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: cn, OrganizationalUnit: ous},
		NotBefore:    now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, caCert, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// connectNode opens a NodeService stream with hc as node id, sends its
// Hello and returns the first answer's error (nil when ctrl sent the
// desired state).
func connectNode(t *testing.T, e *ctrltest.Env, hc *http.Client, id string) error {
	t.Helper()
	stream := nodev1connect.NewNodeServiceClient(hc, e.URL).Connect(t.Context())
	defer func() { _ = stream.CloseResponse() }()
	if err := stream.Send(&nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Hello{Hello: &nodev1.Hello{
		NodeId: id, Capacity: &nodev1.Capacity{MemoryMib: 1024, CpuMillis: 1000}}}}); err != nil {
		_, err = stream.Receive()
		return err
	}
	_, err := stream.Receive()
	_ = stream.CloseRequest()
	return err
}

// TestRoleNeedsExactOU: a certificate the CA signed calls only the API of
// its role, named exactly by its only OU. Any other OU, several or none, is
// permission_denied on every API, with a detail naming the OU it has and
// the one the API needs; an operator certificate cannot call NodeService
// and a node certificate cannot call the Workspace API.
func TestRoleNeedsExactOU(t *testing.T) {
	t.Parallel()
	e, _ := newEnv(t)
	nodeCert, nodeKey := filepath.Join(t.TempDir(), "node.pem"), filepath.Join(t.TempDir(), "node-key.pem")
	if err := pki.IssueClient(e.PKI.CA, e.PKI.CAKey, "node-x", pki.RoleNode, time.Hour, nodeCert, nodeKey); err != nil {
		t.Fatal(err)
	}
	type certs struct{ cert, key string }
	certOf := func(ous ...string) certs {
		c, k := issueWithOUs(t, e, "someone", ous...)
		return certs{c, k}
	}
	for _, tc := range []struct {
		name      string
		c         certs
		workspace bool // may call the Workspace API
		node      bool // may call NodeService
		has       string
	}{
		{"operator", certs{e.PKI.Operator, e.PKI.OperatorKey}, true, false, `OU "operator"`},
		{"node", certs{nodeCert, nodeKey}, false, true, `OU "node"`},
		{"readonly", certOf("readonly"), false, false, `OU "readonly"`},
		{"no OU", certOf(), false, false, "no OU"},
		{"Operator in another case", certOf("Operator"), false, false, `OU "Operator"`},
		{"operator as a prefix", certOf("operators"), false, false, `OU "operators"`},
		{"operator and another", certOf("readonly", "operator"), false, false, `OUs "operator", "readonly"`},
		{"node and operator", certOf("node", "operator"), false, false, `OUs "node", "operator"`},
		{"empty OU", certOf(""), false, false, `OU ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc := e.Client(t, tc.c.cert, tc.c.key)
			for pname, opts := range ctrltest.Protocols {
				c := e.Clients(hc, opts...)
				_, err := c.Workspace.ListWorkspaces(t.Context(), connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
				if tc.workspace {
					if err != nil {
						t.Errorf("%s: ListWorkspaces = %v", pname, err)
					}
				} else {
					d := wantErr(t, err, connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
					if !strings.Contains(d.GetMessage(), tc.has) || !strings.Contains(d.GetMessage(), `OU "operator"`) {
						t.Errorf("%s: message %q, want it to name %s and the OU required", pname, d.GetMessage(), tc.has)
					}
				}
				_, err = c.Egress.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md("x-" + tc.name), Spec: socks("127.0.0.1:1080")}))
				if !tc.workspace {
					wantErr(t, err, connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
				}
			}
			err := connectNode(t, e, hc, "node-x")
			if tc.node {
				if err != nil {
					t.Errorf("NodeService = %v", err)
				}
				return
			}
			d := wantErr(t, err, connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
			if !strings.Contains(d.GetMessage(), tc.has) || !strings.Contains(d.GetMessage(), `OU "node"`) {
				t.Errorf("NodeService: message %q, want it to name %s and the OU required", d.GetMessage(), tc.has)
			}
			_, err = nodev1connect.NewCertificateServiceClient(hc, e.URL).RenewCertificate(t.Context(), connect.NewRequest(&nodev1.RenewCertificateRequest{}))
			wantErr(t, err, connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
		})
	}
	list, err := e.Clients(e.HTTP).Egress.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
	if err != nil || len(list.Msg.GetEgresses()) != 1 {
		t.Errorf("%d egresses stored (%v), want only the operator's", len(list.Msg.GetEgresses()), err)
	}
}

// TestDeniedNodeKey: once a node's key is denied, no certificate with that
// key connects, renews or re-enrolls, whether ctrl issued it at enrollment
// or someone issued it by hand; other nodes are not affected.
func TestDeniedNodeKey(t *testing.T) {
	e := ctrltest.New(t, ctrltest.Options{Enrollment: true})
	c := e.Clients(e.HTTP)
	ctx := t.Context()
	res := createEnrollment(t, c, "en-deny", "node-d", 0)
	dir := t.TempDir()
	cert, key, err := enroll.Ensure(ctx, enroll.Options{Endpoint: e.URL, CA: e.PKI.CA, Dir: dir, Token: res.GetToken()})
	if err != nil {
		t.Fatal(err)
	}
	byHand := func(id string) (string, string) {
		d := t.TempDir()
		cf, kf := filepath.Join(d, "node.pem"), filepath.Join(d, "node-key.pem")
		if err := pki.IssueClient(e.PKI.CA, e.PKI.CAKey, id, pki.RoleNode, time.Hour, cf, kf); err != nil {
			t.Fatal(err)
		}
		return cf, kf
	}
	handCert, handKey := byHand("node-h")
	otherCert, otherKey := byHand("node-o")
	for _, n := range []struct{ id, cert, key string }{{"node-d", cert, key}, {"node-h", handCert, handKey}, {"node-o", otherCert, otherKey}} {
		if err := connectNode(t, e, e.Client(t, n.cert, n.key), n.id); err != nil {
			t.Fatalf("%s before the denial: %v", n.id, err)
		}
	}
	deny := func(id, certFile string) {
		leaf, err := pki.LoadLeaf(certFile)
		if err != nil {
			t.Fatal(err)
		}
		h, _ := pki.PublicKeyHash(leaf.PublicKey)
		// What reconciler.DenyNodeKey writes (it also ends this ctrl's
		// streams of the key; its own test covers that).
		err = e.Store.InTx(ctx, func(tx store.Tx) error {
			return tx.DenyNodeKey(ctx, &store.DeniedNodeKey{KeyHash: h[:], NodeID: id, DeniedAt: time.Now(), Reason: "test"})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	deny("node-d", cert)
	deny("node-h", handCert)

	for _, n := range []struct{ id, cert, key string }{{"node-d", cert, key}, {"node-h", handCert, handKey}} {
		hc, renewer, err := enroll.Client(e.URL, e.PKI.CA, n.cert, n.key, nil)
		if err != nil {
			t.Fatal(err)
		}
		d := wantErr(t, connectNode(t, e, hc, n.id), connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
		if !strings.Contains(d.GetMessage(), "revoked") {
			t.Errorf("%s: connect refused with %q", n.id, d.GetMessage())
		}
		if err := renewer.Renew(ctx); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("%s: renewal with a denied key = %v, want permission_denied", n.id, err)
		}
	}
	// Re-enrolling with the denied key: refused, even with a fresh token
	// bound to the node.
	again := createEnrollment(t, c, "en-deny-again", "node-d", 0)
	signer, err := pki.EnsureKey(key)
	if err != nil {
		t.Fatal(err)
	}
	req, err := pki.CreateCSR(signer)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bootstrap(t, e).Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: again.GetToken(), Csr: req}))
	if d := wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false); !strings.Contains(d.GetMessage(), "revoked") {
		t.Errorf("re-enrollment with the denied key refused with %q", d.GetMessage())
	}
	// ... and the old token, used with that key, gives its certificate no
	// more.
	_, err = bootstrap(t, e).Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: res.GetToken(), Csr: req}))
	wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
	// A new key enrolls the node again (the token was not used by the
	// refusal), and connects.
	cert2, key2, err := enroll.Ensure(ctx, enroll.Options{Endpoint: e.URL, CA: e.PKI.CA, Dir: t.TempDir(), Token: again.GetToken()})
	if err != nil {
		t.Fatalf("re-enrollment with a new key = %v", err)
	}
	if err := connectNode(t, e, e.Client(t, cert2, key2), "node-d"); err != nil {
		t.Errorf("node-d with a new key: %v", err)
	}
	if err := connectNode(t, e, e.Client(t, otherCert, otherKey), "node-o"); err != nil {
		t.Errorf("another node after the denials: %v", err)
	}
}
