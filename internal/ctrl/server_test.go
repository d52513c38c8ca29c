package ctrl

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/store/sqlite"
)

// serve starts a Server on a TLS listener with a development PKI.
func serve(t *testing.T) (*Server, string, pki.DevPaths) {
	t.Helper()
	p, err := pki.EnsureDev(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv, err := New(t.Context(), Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	tlsc, err := pki.ServerConfig(p.Server, p.ServerKey, p.CA)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, ln, tlsc) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv, "https://" + ln.Addr().String(), p
}

// TestVerificationOncePerConnection: the client chain is verified at a
// connection's first request and not again for its later ones, over
// HTTP/2 and HTTP/1.1 alike, and every new connection is verified anew
// (a refused one included).
func TestVerificationOncePerConnection(t *testing.T) {
	srv, url, p := serve(t)
	other, err := pki.EnsureDev(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	client := func(cert, key string, h2 bool) *http.Client {
		tlsc, err := pki.ClientConfig(p.CA, cert, key)
		if err != nil {
			t.Fatal(err)
		}
		// Present the certificate even when the server's CertificateRequest
		// names another CA (Go clients then send none by themselves).
		presented := tlsc.Certificates[0]
		tlsc.Certificates = nil
		tlsc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &presented, nil }
		if h2 {
			return &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}}
		}
		tlsc.NextProtos = []string{"http/1.1"}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tlsc, MaxConnsPerHost: 1,
			TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}}
	}
	call := func(hc *http.Client) error {
		_, err := ctrlv1connect.NewServerInfoServiceClient(hc, url).GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		return err
	}
	want := int64(0)
	for _, tc := range []struct {
		name    string
		hc      *http.Client
		refused bool
	}{
		{"HTTP/2", client(p.Operator, p.OperatorKey, true), false},
		{"HTTP/1.1", client(p.Operator, p.OperatorKey, false), false},
		{"another CA", client(other.Operator, other.OperatorKey, true), true},
	} {
		for conn := range 2 {
			for i := range 5 {
				err := call(tc.hc)
				if tc.refused != (connect.CodeOf(err) == connect.CodeUnauthenticated) || (!tc.refused && err != nil) {
					t.Fatalf("%s: call %d = %v", tc.name, i, err)
				}
			}
			want++
			if got := srv.verifications.Load(); got != want {
				t.Errorf("%s, connection %d: %d verifications after 5 calls, want %d in all", tc.name, conn, got, want)
			}
			tc.hc.CloseIdleConnections() // the next round opens a new connection
		}
	}
}
