package enroll

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/pki"
)

// fakeCtrl issues node certificates at Enroll and RenewCertificate.
type fakeCtrl struct {
	nodev1connect.UnimplementedBootstrapServiceHandler
	nodev1connect.UnimplementedCertificateServiceHandler
	issuer          *pki.Issuer
	enrolls, renews atomic.Int32
}

func (f *fakeCtrl) issue(csr []byte) ([]byte, error) {
	pub, _, err := pki.ParseCSR(csr)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	cert, _, err := f.issuer.IssueNode(pub, "n1", time.Hour, time.Now())
	return cert, err
}

func (f *fakeCtrl) Enroll(_ context.Context, r *connect.Request[nodev1.EnrollRequest]) (*connect.Response[nodev1.EnrollResponse], error) {
	f.enrolls.Add(1)
	cert, err := f.issue(r.Msg.GetCsr())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nodev1.EnrollResponse{NodeId: "n1", Certificate: cert}), nil
}

func (f *fakeCtrl) RenewCertificate(_ context.Context, r *connect.Request[nodev1.RenewCertificateRequest]) (*connect.Response[nodev1.RenewCertificateResponse], error) {
	f.renews.Add(1)
	cert, err := f.issue(r.Msg.GetCsr())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nodev1.RenewCertificateResponse{Certificate: cert}), nil
}

// deadURL is the URL of a loopback port nothing listens on.
func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "https://" + addr
}

// TestEnrollAndRenewWithSeveralEndpoints: with a dead endpoint listed
// beside a live one, enrollment gets its certificate (it tries each in
// turn), and renewal goes to the endpoint in use.
func TestEnrollAndRenewWithSeveralEndpoints(t *testing.T) {
	p, err := pki.EnsureDev(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := pki.LoadIssuer(p.CA, p.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeCtrl{issuer: issuer}
	mux := http.NewServeMux()
	mux.Handle(nodev1connect.NewBootstrapServiceHandler(f))
	mux.Handle(nodev1connect.NewCertificateServiceHandler(f))
	srv := httptest.NewUnstartedServer(mux)
	tlsc, err := pki.ServerConfig(p.Server, p.ServerKey, p.CA)
	if err != nil {
		t.Fatal(err)
	}
	tlsc.ClientAuth = tls.VerifyClientCertIfGiven
	srv.TLS = tlsc
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)

	urls := []string{deadURL(t), srv.URL, deadURL(t)}
	dir := filepath.Join(t.TempDir(), "pki")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cert, key, err := Ensure(ctx, Options{Endpoints: urls, CA: p.CA, Dir: dir, Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	if f.enrolls.Load() != 1 {
		t.Fatalf("%d enrollments", f.enrolls.Load())
	}
	set, renewer, err := Clients(urls, nil, p.CA, cert, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Move to the live endpoint, as the stream would.
	for range 3 {
		e, err := set.Current(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if e.URL == srv.URL {
			break
		}
		_, _ = set.Next(ctx)
	}
	if err := renewer.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if f.renews.Load() != 1 {
		t.Fatalf("%d renewals", f.renews.Load())
	}
}
