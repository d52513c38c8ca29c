package pki

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// startServer serves, over a real TLS listener on 127.0.0.1, a handler that
// answers with the caller's identity. It returns the base URL.
func startServer(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
				http.Error(w, "no identity", http.StatusUnauthorized)
				return
			}
			id := IdentityOf(r.TLS.VerifiedChains[0][0])
			fmt.Fprintf(w, "%s|%s|%s", id.CommonName, id.Role, id.Serial)
		}),
		TLSConfig:         cfg,
		ReadHeaderTimeout: 10 * time.Second,
		// Refused handshakes are expected; keep them out of the test log.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() { _ = srv.Serve(tls.NewListener(ln, cfg)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String()
}

// get performs one request with a fresh client using cfg.
func get(t *testing.T, cfg *tls.Config, url string) (body string, proto int, err error) {
	t.Helper()
	// net/http only speaks HTTP/2 with a custom TLS config when asked to.
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: slices.Contains(cfg.NextProtos, "h2")}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/whoami", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("status %s: %s", resp.Status, b)
	}
	return string(b), resp.ProtoMajor, nil
}

func mustClientConfig(t *testing.T, ca, cert, key string) *tls.Config {
	t.Helper()
	cfg, err := ClientConfig(ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func mustServerConfig(t *testing.T, p DevPaths) *tls.Config {
	t.Helper()
	cfg, err := ServerConfig(p.Server, p.ServerKey, p.CA)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestServerConfig(t *testing.T) {
	p := mustEnsure(t, t.TempDir())
	cfg := mustServerConfig(t, p)
	if cfg.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("ClientAuth = %v", cfg.ClientAuth)
	}
	if cfg.MinVersion != tls.VersionTLS12 {
		t.Errorf("MinVersion = %x", cfg.MinVersion)
	}
	if strings.Join(cfg.NextProtos, ",") != "h2,http/1.1" {
		t.Errorf("NextProtos = %v", cfg.NextProtos)
	}
	if len(cfg.Certificates) != 1 || cfg.ClientCAs == nil {
		t.Errorf("Certificates %d, ClientCAs %v", len(cfg.Certificates), cfg.ClientCAs)
	}
	if _, err := ServerConfig(p.Server, p.OperatorKey, p.CA); err == nil {
		t.Error("ServerConfig accepted a key of another certificate")
	}
	if _, err := ServerConfig(p.Server, p.ServerKey, p.CAKey); err == nil {
		t.Error("ServerConfig accepted a key file as CA file")
	}
	if _, err := ServerConfig(p.Server, p.ServerKey, filepath.Join(p.Dir, "missing.pem")); err == nil {
		t.Error("ServerConfig accepted a missing CA file")
	}

	c := mustClientConfig(t, p.CA, "", "")
	if len(c.Certificates) != 0 || c.RootCAs == nil || c.MinVersion != tls.VersionTLS12 || strings.Join(c.NextProtos, ",") != "h2,http/1.1" {
		t.Errorf("ClientConfig without certificate: %+v", c)
	}
	if _, err := ClientConfig(p.CA, p.Operator, ""); err == nil {
		t.Error("ClientConfig accepted a certificate without key")
	}
	if _, err := ClientConfig("", "", ""); err == nil {
		t.Error("ClientConfig accepted no CA")
	}
}

func TestMutualTLS(t *testing.T) {
	p := mustEnsure(t, t.TempDir())
	url := startServer(t, mustServerConfig(t, p))

	t.Run("operator", func(t *testing.T) {
		body, proto, err := get(t, mustClientConfig(t, p.CA, p.Operator, p.OperatorKey), url)
		if err != nil {
			t.Fatal(err)
		}
		if proto != 2 {
			t.Errorf("HTTP/%d, want HTTP/2", proto)
		}
		want := "dev-operator|operator|" + mustCert(t, p.Operator).SerialNumber.Text(16)
		if body != want {
			t.Errorf("identity %q, want %q", body, want)
		}
	})

	t.Run("no client certificate", func(t *testing.T) {
		body, _, err := get(t, mustClientConfig(t, p.CA, "", ""), url)
		if err == nil {
			t.Fatalf("request without client certificate succeeded: %q", body)
		}
		t.Logf("refused as expected: %v", err)
	})

	t.Run("certificate from another CA", func(t *testing.T) {
		other := mustEnsure(t, t.TempDir())
		// Trust our server, but present the other PKI's operator certificate.
		cfg := mustClientConfig(t, p.CA, other.Operator, other.OperatorKey)
		body, _, err := get(t, cfg, url)
		if err == nil {
			t.Fatalf("request with a foreign client certificate succeeded: %q", body)
		}
		t.Logf("refused as expected: %v", err)
	})

	t.Run("server from another CA", func(t *testing.T) {
		other := mustEnsure(t, t.TempDir())
		// Present a valid operator certificate, but trust only the other CA.
		cfg := mustClientConfig(t, other.CA, p.Operator, p.OperatorKey)
		if _, _, err := get(t, cfg, url); err == nil {
			t.Fatal("client accepted a server certificate from an untrusted CA")
		}
	})

	t.Run("HTTP/1.1", func(t *testing.T) {
		cfg := mustClientConfig(t, p.CA, p.Operator, p.OperatorKey)
		cfg.NextProtos = []string{"http/1.1"}
		body, proto, err := get(t, cfg, url)
		if err != nil {
			t.Fatal(err)
		}
		if proto != 1 || !strings.HasPrefix(body, "dev-operator|operator|") {
			t.Errorf("HTTP/%d %q", proto, body)
		}
	})
}

// TestVerifyClientChain: a client chain verifies against the CA that issued
// it, for client authentication only, and its identity carries its role.
func TestVerifyClientChain(t *testing.T) {
	p := mustEnsure(t, t.TempDir())
	dir := t.TempDir()
	nodeCert, nodeKey := filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	if err := IssueClient(p.CA, p.CAKey, "node-1", RoleNode, time.Hour, nodeCert, nodeKey); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(mustCert(t, p.CA))
	other := mustEnsure(t, t.TempDir())
	otherRoots := x509.NewCertPool()
	otherRoots.AddCert(mustCert(t, other.CA))

	node, op, srv := mustCert(t, nodeCert), mustCert(t, p.Operator), mustCert(t, p.Server)
	for _, tc := range []struct {
		name  string
		chain []*x509.Certificate
		roots *x509.CertPool
		ok    bool
	}{
		{"operator", []*x509.Certificate{op}, roots, true},
		{"node", []*x509.Certificate{node}, roots, true},
		{"another CA", []*x509.Certificate{op}, otherRoots, false},
		{"a server certificate", []*x509.Certificate{srv}, roots, false},
		{"no certificate", nil, roots, false},
	} {
		if err := VerifyClientChain(tc.chain, tc.roots); (err == nil) != tc.ok {
			t.Errorf("%s: VerifyClientChain = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	for _, tc := range []struct {
		cert *x509.Certificate
		want Identity
	}{
		{op, Identity{CommonName: "dev-operator", Role: RoleOperator, OUs: []string{RoleOperator}, Serial: op.SerialNumber.Text(16)}},
		{node, Identity{CommonName: "node-1", Role: RoleNode, OUs: []string{RoleNode}, Serial: node.SerialNumber.Text(16)}},
		{srv, Identity{CommonName: srv.Subject.CommonName, Serial: srv.SerialNumber.Text(16)}},
		// Several OUs name no role, whichever comes first.
		{&x509.Certificate{Subject: pkix.Name{CommonName: "x", OrganizationalUnit: []string{RoleOperator, "readonly"}}},
			Identity{CommonName: "x", OUs: []string{RoleOperator, "readonly"}}},
	} {
		if got := IdentityOf(tc.cert); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("IdentityOf = %+v, want %+v", got, tc.want)
		}
	}
}
