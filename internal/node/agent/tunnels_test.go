package agent

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/node/ctrlset"
	"github.com/kibotos/kibotos/internal/tunnel"
)

// selfSigned returns a client certificate of its own.
func selfSigned(t *testing.T, cn string) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// fakeCtrl is a TLS listener that accepts data tunnels into its own
// Registry and records the client certificate of each.
type fakeCtrl struct {
	srv *httptest.Server
	reg *tunnel.Registry
	mu  sync.Mutex
	got [][]byte // the leaf of each tunnel's client certificate
}

func newFakeCtrl(t *testing.T) *fakeCtrl {
	f := &fakeCtrl{reg: &tunnel.Registry{}}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != tunnel.Path || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.NotFound(w, r)
			return
		}
		f.mu.Lock()
		f.got = append(f.got, r.TLS.PeerCertificates[0].Raw)
		f.mu.Unlock()
		_ = f.reg.Accept(w, r, "node-1", []byte("key"))
	}))
	f.srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	f.srv.StartTLS()
	t.Cleanup(func() { f.srv.Close(); f.reg.Close() })
	return f
}

func (f *fakeCtrl) opened(cert *tls.Certificate) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, g := range f.got {
		if bytes.Equal(g, cert.Certificate[0]) {
			n++
		}
	}
	return n
}

// TestTunnelsToEveryEndpoint: the node keeps a tunnel to each ctrl
// endpoint, whichever one is in use, and a renewed certificate re-dials
// every one of them with it.
func TestTunnelsToEveryEndpoint(t *testing.T) {
	certEvery = 20 * time.Millisecond
	defer func() { certEvery = tunnel.CertCheck }()
	a, b := newFakeCtrl(t), newFakeCtrl(t)
	pool := x509.NewCertPool()
	pool.AddCert(a.srv.Certificate()) // httptest servers share their certificate
	oldCert, newCert := selfSigned(t, "node-1"), selfSigned(t, "node-1")
	var cur atomic.Pointer[tls.Certificate]
	cur.Store(oldCert)
	tlsc := &tls.Config{RootCAs: pool, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cur.Load(), nil }}
	set, err := ctrlset.New(ctrlset.Config{URLs: []string{a.srv.URL, b.srv.URL}, TLS: tlsc})
	if err != nil {
		t.Fatal(err)
	}
	ag := New(Config{NodeID: "node-1", Ctrl: set, Log: slog.New(slog.DiscardHandler)})
	done := make(chan struct{})
	go func() { defer close(done); ag.keepTunnels(t.Context(), tlsc, http.NotFoundHandler()) }()
	t.Cleanup(func() { <-done })

	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
		}
	}
	wait("a tunnel to each endpoint", func() bool { return a.reg.Count("node-1") == 1 && b.reg.Count("node-1") == 1 })
	// The stream moves: the tunnels stay where they are.
	if _, err := set.Next(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if a.opened(oldCert) != 1 || b.opened(oldCert) != 1 {
		t.Fatalf("tunnels opened again after the stream moved: %d, %d", a.opened(oldCert), b.opened(oldCert))
	}
	cur.Store(newCert)
	wait("both re-dialed with the renewed certificate", func() bool {
		return a.opened(newCert) == 1 && b.opened(newCert) == 1 && a.reg.Count("node-1") == 1 && b.reg.Count("node-1") == 1
	})
}
