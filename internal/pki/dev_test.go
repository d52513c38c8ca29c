package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// files returns the six files of p, keyed by path, with their key flag.
func devFiles(p DevPaths) map[string]bool {
	return map[string]bool{
		p.CA: false, p.CAKey: true,
		p.Operator: false, p.OperatorKey: true,
		p.Server: false, p.ServerKey: true,
	}
}

func snapshot(t *testing.T, p DevPaths) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for path := range devFiles(p) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		out[path] = data
	}
	return out
}

func mustCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	certs, err := readCertificates(path)
	if err != nil {
		t.Fatal(err)
	}
	return certs[0]
}

func mustEnsure(t *testing.T, dataDir string, hosts ...string) DevPaths {
	t.Helper()
	p, err := EnsureDev(dataDir, hosts)
	if err != nil {
		t.Fatalf("EnsureDev: %v", err)
	}
	return p
}

func verifyWith(t *testing.T, caPath string, cert *x509.Certificate, usage x509.ExtKeyUsage, name string) error {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(mustCert(t, caPath))
	_, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

func TestDevPathsIn(t *testing.T) {
	p := DevPathsIn("/data")
	want := DevPaths{
		Dir:         filepath.Join("/data", "pki"),
		CA:          filepath.Join("/data", "pki", "ca.pem"),
		CAKey:       filepath.Join("/data", "pki", "ca-key.pem"),
		Operator:    filepath.Join("/data", "pki", "operator.pem"),
		OperatorKey: filepath.Join("/data", "pki", "operator-key.pem"),
		Server:      filepath.Join("/data", "pki", "server.pem"),
		ServerKey:   filepath.Join("/data", "pki", "server-key.pem"),
	}
	if p != want {
		t.Fatalf("DevPathsIn = %+v, want %+v", p, want)
	}
}

func TestEnsureDevCreates(t *testing.T) {
	dataDir := t.TempDir()
	p := mustEnsure(t, dataDir, "ctrl.example", "10.1.2.3")
	if p != DevPathsIn(dataDir) {
		t.Fatalf("paths %+v, want %+v", p, DevPathsIn(dataDir))
	}

	// Exactly the PKI directory, no temporary leftovers.
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "pki" {
		t.Fatalf("data dir holds %v, want only pki", entries)
	}
	entries, err = os.ReadDir(p.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 6 {
		t.Fatalf("pki dir holds %d entries, want 6: %v", len(entries), entries)
	}

	if runtime.GOOS != "windows" {
		info, err := os.Stat(p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Mode().Perm(); got != 0o700 {
			t.Errorf("pki dir mode %o, want 700", got)
		}
		for path, isKey := range devFiles(p) {
			info, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			want := fs.FileMode(0o644)
			if isKey {
				want = 0o600
			}
			if got := info.Mode().Perm(); got != want {
				t.Errorf("%s mode %o, want %o", filepath.Base(path), got, want)
			}
		}
	}

	// PEM types and key algorithm.
	for path, isKey := range devFiles(p) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		block, rest := pem.Decode(data)
		if block == nil || len(bytes.TrimSpace(rest)) != 0 {
			t.Fatalf("%s: want exactly one PEM block", path)
		}
		if isKey {
			if block.Type != "PRIVATE KEY" {
				t.Fatalf("%s: PEM type %q", path, block.Type)
			}
			key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			ec, ok := key.(*ecdsa.PrivateKey)
			if !ok || ec.Curve != elliptic.P256() {
				t.Fatalf("%s: key %T is not ECDSA P-256", path, key)
			}
		} else if block.Type != "CERTIFICATE" {
			t.Fatalf("%s: PEM type %q", path, block.Type)
		}
	}

	ca := mustCert(t, p.CA)
	if !ca.IsCA || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("CA: IsCA=%v KeyUsage=%v", ca.IsCA, ca.KeyUsage)
	}
	if d := ca.NotAfter.Sub(ca.NotBefore); d < DevCAValidity {
		t.Errorf("CA validity %s, want at least %s", d, DevCAValidity)
	}

	op := mustCert(t, p.Operator)
	if op.Subject.CommonName != "dev-operator" || !slices.Equal(op.Subject.OrganizationalUnit, []string{"operator"}) {
		t.Errorf("operator subject %v", op.Subject)
	}
	if !slices.Equal(op.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("operator ExtKeyUsage %v", op.ExtKeyUsage)
	}
	if op.IsCA {
		t.Error("operator certificate is a CA")
	}
	if d := op.NotAfter.Sub(op.NotBefore); d > DevOperatorValidity+clockSkew || DevOperatorValidity > 365*24*time.Hour {
		t.Errorf("operator validity %s, want at most a year", d)
	}

	srv := mustCert(t, p.Server)
	if !slices.Equal(srv.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("server ExtKeyUsage %v", srv.ExtKeyUsage)
	}
	for _, name := range []string{"localhost", "ctrl.example"} {
		if !slices.Contains(srv.DNSNames, name) {
			t.Errorf("server DNSNames %v lack %q", srv.DNSNames, name)
		}
	}
	for _, ip := range []string{"127.0.0.1", "::1", "10.1.2.3"} {
		if !slices.ContainsFunc(srv.IPAddresses, net.ParseIP(ip).Equal) {
			t.Errorf("server IPAddresses %v lack %s", srv.IPAddresses, ip)
		}
	}
	if d := srv.NotAfter.Sub(srv.NotBefore); d < DevLeafValidity {
		t.Errorf("server validity %s, want at least %s", d, DevLeafValidity)
	}

	// Serials are random, positive and large.
	serials := map[string]bool{}
	for _, c := range []*x509.Certificate{ca, op, srv} {
		if c.SerialNumber.Sign() <= 0 || c.SerialNumber.BitLen() > 128 {
			t.Errorf("serial %v out of range", c.SerialNumber)
		}
		serials[c.SerialNumber.String()] = true
	}
	if len(serials) != 3 {
		t.Error("serial numbers repeat")
	}
}

func TestEnsureDevCAVerifiesLeaves(t *testing.T) {
	p := mustEnsure(t, t.TempDir(), "ctrl.example")
	srv := mustCert(t, p.Server)
	for _, name := range []string{"localhost", "127.0.0.1", "::1", "ctrl.example"} {
		if err := verifyWith(t, p.CA, srv, x509.ExtKeyUsageServerAuth, name); err != nil {
			t.Errorf("server certificate for %q: %v", name, err)
		}
	}
	if err := verifyWith(t, p.CA, srv, x509.ExtKeyUsageServerAuth, "other.example"); err == nil {
		t.Error("server certificate verified for a name it does not carry")
	}
	op := mustCert(t, p.Operator)
	if err := verifyWith(t, p.CA, op, x509.ExtKeyUsageClientAuth, ""); err != nil {
		t.Errorf("operator certificate: %v", err)
	}
	if err := verifyWith(t, p.CA, op, x509.ExtKeyUsageServerAuth, ""); err == nil {
		t.Error("operator certificate verified for server authentication")
	}

	// Another development PKI does not verify this one's certificates.
	other := mustEnsure(t, t.TempDir())
	if err := verifyWith(t, other.CA, op, x509.ExtKeyUsageClientAuth, ""); err == nil {
		t.Error("operator certificate verified against another CA")
	}
}

func TestEnsureDevReuses(t *testing.T) {
	dataDir := t.TempDir()
	p := mustEnsure(t, dataDir, "ctrl.example")
	before := snapshot(t, p)
	// Same hosts in another spelling, and a subset, change nothing.
	for _, hosts := range [][]string{{"ctrl.example"}, {"CTRL.example.", "localhost"}, nil} {
		mustEnsure(t, dataDir, hosts...)
		after := snapshot(t, p)
		for path := range before {
			if !bytes.Equal(before[path], after[path]) {
				t.Fatalf("EnsureDev(%q) changed %s", hosts, filepath.Base(path))
			}
		}
	}
	entries, _ := os.ReadDir(p.Dir)
	if len(entries) != 6 {
		t.Fatalf("pki dir holds %d entries after reuse, want 6", len(entries))
	}
}

func TestEnsureDevNewHostReissuesOnlyServer(t *testing.T) {
	dataDir := t.TempDir()
	p := mustEnsure(t, dataDir, "old.example")
	before := snapshot(t, p)
	oldSrv := mustCert(t, p.Server)

	mustEnsure(t, dataDir, "new.example", "192.0.2.7")
	after := snapshot(t, p)
	for path := range before {
		changed := !bytes.Equal(before[path], after[path])
		if changed != (path == p.Server) {
			t.Errorf("%s changed=%v", filepath.Base(path), changed)
		}
	}
	srv := mustCert(t, p.Server)
	if srv.SerialNumber.Cmp(oldSrv.SerialNumber) == 0 {
		t.Error("server certificate kept its serial")
	}
	for _, name := range []string{"localhost", "old.example", "new.example", "192.0.2.7"} {
		if err := verifyWith(t, p.CA, srv, x509.ExtKeyUsageServerAuth, name); err != nil {
			t.Errorf("re-issued server certificate for %q: %v", name, err)
		}
	}
	if _, err := ServerConfig(p.Server, p.ServerKey, p.CA); err != nil {
		t.Errorf("re-issued server certificate does not load with its key: %v", err)
	}

	// The re-issued certificate now covers everything: no further change.
	mustEnsure(t, dataDir, "new.example")
	if !bytes.Equal(after[p.Server], snapshot(t, p)[p.Server]) {
		t.Error("server certificate re-issued again")
	}
}

func TestEnsureDevCompletesMissingFiles(t *testing.T) {
	for _, missing := range [][]string{
		{"operator.pem"},
		{"operator-key.pem"},
		{"operator.pem", "operator-key.pem"},
		{"server.pem", "server-key.pem"},
		{"server-key.pem"},
		{"operator.pem", "server.pem"},
	} {
		t.Run(strings.Join(missing, "+"), func(t *testing.T) {
			dataDir := t.TempDir()
			p := mustEnsure(t, dataDir)
			before := snapshot(t, p)
			for _, name := range missing {
				if err := os.Remove(filepath.Join(p.Dir, name)); err != nil {
					t.Fatal(err)
				}
			}
			mustEnsure(t, dataDir)
			after := snapshot(t, p)
			for _, path := range []string{p.CA, p.CAKey} {
				if !bytes.Equal(before[path], after[path]) {
					t.Errorf("%s changed: the CA must be reused", filepath.Base(path))
				}
			}
			if err := verifyWith(t, p.CA, mustCert(t, p.Operator), x509.ExtKeyUsageClientAuth, ""); err != nil {
				t.Errorf("operator: %v", err)
			}
			if err := verifyWith(t, p.CA, mustCert(t, p.Server), x509.ExtKeyUsageServerAuth, "localhost"); err != nil {
				t.Errorf("server: %v", err)
			}
			for _, pair := range [][2]string{{p.Operator, p.OperatorKey}, {p.Server, p.ServerKey}} {
				if _, err := loadKeyPair(pair[0], pair[1]); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

func TestEnsureDevRepairsMismatchedServerKey(t *testing.T) {
	dataDir := t.TempDir()
	p := mustEnsure(t, dataDir)
	// Simulate a crash between writing a new key and its certificate.
	key, err := newKey()
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := encodePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(p.ServerKey, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ServerConfig(p.Server, p.ServerKey, p.CA); err == nil {
		t.Fatal("mismatched pair loaded")
	}
	mustEnsure(t, dataDir)
	if _, err := ServerConfig(p.Server, p.ServerKey, p.CA); err != nil {
		t.Fatalf("after repair: %v", err)
	}
}

func TestEnsureDevCAKeyMissing(t *testing.T) {
	dataDir := t.TempDir()
	p := mustEnsure(t, dataDir)
	if err := os.Remove(p.CAKey); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p.Operator); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(p.Dir)
	_, err := EnsureDev(dataDir, []string{"new.example"})
	if err == nil {
		t.Fatal("EnsureDev succeeded without the CA key")
	}
	if !strings.Contains(err.Error(), "ca-key.pem") || !strings.Contains(err.Error(), "missing") {
		t.Errorf("unclear error: %v", err)
	}
	after, _ := os.ReadDir(p.Dir)
	if len(after) != len(before) {
		t.Errorf("EnsureDev changed the directory: %v -> %v", before, after)
	}
}

func TestEnsureDevCACertMissing(t *testing.T) {
	dataDir := t.TempDir()
	p := mustEnsure(t, dataDir)
	before := snapshot(t, p)
	oldCA := mustCert(t, p.CA)
	if err := os.Remove(p.CA); err != nil {
		t.Fatal(err)
	}
	mustEnsure(t, dataDir)
	after := snapshot(t, p)
	for path := range before {
		if path != p.CA && !bytes.Equal(before[path], after[path]) {
			t.Errorf("%s changed", filepath.Base(path))
		}
	}
	ca := mustCert(t, p.CA)
	if ca.Subject.String() != oldCA.Subject.String() || !bytes.Equal(ca.SubjectKeyId, oldCA.SubjectKeyId) {
		t.Errorf("re-created CA: subject %v / %x, want %v / %x", ca.Subject, ca.SubjectKeyId, oldCA.Subject, oldCA.SubjectKeyId)
	}
	// Certificates issued before still verify against the re-created CA.
	if err := verifyWith(t, p.CA, mustCert(t, p.Operator), x509.ExtKeyUsageClientAuth, ""); err != nil {
		t.Errorf("old operator certificate: %v", err)
	}
}

// TestEnsureDevShortensOperator: an operator certificate valid for longer
// than DevOperatorValidity (five years, as earlier releases issued it) is
// replaced at the next start; one within it is kept.
func TestEnsureDevShortensOperator(t *testing.T) {
	dataDir := t.TempDir()
	p := mustEnsure(t, dataDir)
	fresh := mustCert(t, p.Operator)
	mustEnsure(t, dataDir)
	if again := mustCert(t, p.Operator); !again.Equal(fresh) {
		t.Error("a start replaced an operator certificate within DevOperatorValidity")
	}
	if err := IssueClient(p.CA, p.CAKey, DevOperatorCommonName, RoleOperator, 5*365*24*time.Hour, p.Operator, p.OperatorKey); err != nil {
		t.Fatal(err)
	}
	mustEnsure(t, dataDir)
	op := mustCert(t, p.Operator)
	if limit := time.Now().Add(DevOperatorValidity + clockSkew); op.NotAfter.After(limit) {
		t.Errorf("operator certificate valid until %v after a start, want at most %v", op.NotAfter, limit)
	}
	if err := verifyWith(t, p.CA, op, x509.ExtKeyUsageClientAuth, ""); err != nil {
		t.Errorf("new operator certificate: %v", err)
	}
}

func TestEnsureDevUnusableCA(t *testing.T) {
	dataDir := t.TempDir()
	p := mustEnsure(t, dataDir)
	other := mustEnsure(t, t.TempDir())
	otherKey, err := os.ReadFile(other.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(p.CAKey, otherKey, 0o600); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, p)
	if _, err := EnsureDev(dataDir, nil); err == nil || !strings.Contains(err.Error(), "does not belong") {
		t.Fatalf("EnsureDev with a foreign CA key: %v", err)
	}
	after := snapshot(t, p)
	for path := range before {
		if !bytes.Equal(before[path], after[path]) {
			t.Errorf("%s changed", filepath.Base(path))
		}
	}
}

func TestEnsureDevInvalidHosts(t *testing.T) {
	for _, h := range []string{"ctrl.example:8443", "https://ctrl.example", "a b", "fe80::1%eth0"} {
		dataDir := t.TempDir()
		if _, err := EnsureDev(dataDir, []string{h}); err == nil {
			t.Errorf("EnsureDev accepted host %q", h)
		}
		if _, err := os.Stat(DevPathsIn(dataDir).Dir); err == nil {
			t.Errorf("EnsureDev created a PKI for invalid host %q", h)
		}
	}
	if _, err := EnsureDev("", nil); err == nil {
		t.Error("EnsureDev accepted an empty data directory")
	}
	p := mustEnsure(t, t.TempDir(), "[2001:db8::1]", " spaced.example ")
	srv := mustCert(t, p.Server)
	if !slices.ContainsFunc(srv.IPAddresses, net.ParseIP("2001:db8::1").Equal) || !slices.Contains(srv.DNSNames, "spaced.example") {
		t.Errorf("SANs %v %v", srv.DNSNames, srv.IPAddresses)
	}
}

func TestEnsureDevConcurrentFirstUse(t *testing.T) {
	dataDir := t.TempDir()
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := EnsureDev(dataDir, nil)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	p := DevPathsIn(dataDir)
	if err := verifyWith(t, p.CA, mustCert(t, p.Operator), x509.ExtKeyUsageClientAuth, ""); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dataDir)
	if len(entries) != 1 {
		t.Errorf("data dir holds %v, want only pki", entries)
	}
}

func TestIssueClient(t *testing.T) {
	p := mustEnsure(t, t.TempDir())
	dir := filepath.Join(t.TempDir(), "nodes", "n1")
	certPath, keyPath := filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	if err := IssueClient(p.CA, p.CAKey, "node-1", RoleNode, 24*time.Hour, certPath, keyPath); err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" {
		info, err := os.Stat(keyPath)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Mode().Perm(); got != 0o600 {
			t.Errorf("key mode %o, want 600", got)
		}
	}
	cert := mustCert(t, certPath)
	if cert.Subject.CommonName != "node-1" || !slices.Equal(cert.Subject.OrganizationalUnit, []string{"node"}) {
		t.Errorf("subject %v", cert.Subject)
	}
	if d := cert.NotAfter.Sub(cert.NotBefore); d < 24*time.Hour || d > 24*time.Hour+time.Hour {
		t.Errorf("validity %s, want about 24h", d)
	}
	if err := verifyWith(t, p.CA, cert, x509.ExtKeyUsageClientAuth, ""); err != nil {
		t.Error(err)
	}
	if _, err := loadKeyPair(certPath, keyPath); err != nil {
		t.Error(err)
	}

	// Validity is capped at the CA's expiry.
	long := filepath.Join(dir, "long.pem")
	if err := IssueClient(p.CA, p.CAKey, "node-2", RoleNode, 2*DevCAValidity, long, filepath.Join(dir, "long-key.pem")); err != nil {
		t.Fatal(err)
	}
	if na, caNA := mustCert(t, long).NotAfter, mustCert(t, p.CA).NotAfter; na.After(caNA) {
		t.Errorf("NotAfter %v beyond CA's %v", na, caNA)
	}

	bad := []struct {
		name          string
		cn, role      string
		validity      time.Duration
		caCert, caKey string
	}{
		{"empty cn", "", "node", time.Hour, p.CA, p.CAKey},
		{"empty role", "n", "", time.Hour, p.CA, p.CAKey},
		{"zero validity", "n", "node", 0, p.CA, p.CAKey},
		{"leaf as CA", "n", "node", time.Hour, p.Operator, p.OperatorKey},
		{"missing CA key", "n", "node", time.Hour, p.CA, filepath.Join(dir, "nope.pem")},
		{"mismatched CA key", "n", "node", time.Hour, p.CA, p.ServerKey},
	}
	for _, tc := range bad {
		if err := IssueClient(tc.caCert, tc.caKey, tc.cn, tc.role, tc.validity, filepath.Join(dir, "x.pem"), filepath.Join(dir, "x-key.pem")); err == nil {
			t.Errorf("%s: IssueClient succeeded", tc.name)
		}
	}
}

func TestErrorsHideKeyMaterial(t *testing.T) {
	p := mustEnsure(t, t.TempDir())
	dir := t.TempDir()

	secret := make([]byte, 96)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	garbledPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: secret})
	realKey, err := os.ReadFile(p.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	// A real key truncated: the parser sees key bytes and fails.
	block, _ := pem.Decode(realKey)
	truncated := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: block.Bytes[:len(block.Bytes)-7]})
	// Not PEM at all.
	plain := []byte("TOPSECRETKEYMATERIAL " + base64.StdEncoding.EncodeToString(secret))

	for name, content := range map[string][]byte{"garbled": garbledPEM, "truncated": truncated, "plain": plain} {
		keyPath := filepath.Join(dir, name+"-key.pem")
		if err := os.WriteFile(keyPath, content, 0o600); err != nil {
			t.Fatal(err)
		}
		checks := map[string]error{
			"IssueClient":  IssueClient(p.CA, keyPath, "n", "node", time.Hour, filepath.Join(dir, "n.pem"), filepath.Join(dir, "n-key.pem")),
			"ClientConfig": second(ClientConfig(p.CA, p.Operator, keyPath)),
			"ServerConfig": second(ServerConfig(p.Server, keyPath, p.CA)),
		}
		for fn, err := range checks {
			if err == nil {
				t.Fatalf("%s/%s: no error", name, fn)
			}
			msg := err.Error()
			for _, leak := range leakForms(content, secret, block.Bytes) {
				if strings.Contains(msg, leak) {
					t.Errorf("%s/%s: error leaks key material: %v", name, fn, err)
				}
			}
		}
	}
}

func second[T any](_ T, err error) error { return err }

// leakForms returns substrings that must not appear in an error: pieces of
// the file contents and of raw key bytes in the encodings an error might use.
func leakForms(content []byte, raws ...[]byte) []string {
	var out []string
	for _, line := range strings.Split(string(content), "\n") {
		if line = strings.TrimSpace(line); len(line) >= 16 && !strings.HasPrefix(line, "-----") {
			out = append(out, line[:16], line[len(line)-16:])
		}
	}
	for _, raw := range raws {
		for i := 0; i+8 <= len(raw); i += 8 {
			chunk := raw[i : i+8]
			out = append(out,
				string(chunk),
				hex.EncodeToString(chunk),
				strings.Trim(fmt.Sprint(chunk), "[]"),
				fmt.Sprintf("%x", chunk),
			)
		}
	}
	return out
}
