package enroll

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/node/ctrlset"
	"github.com/kibotos/kibotos/internal/pki"
)

// Renewer keeps a node certificate fresh: once less than a third of its
// lifetime is left, it asks ctrl (CertificateService) for a new one for the
// same key, writes it over the old file and makes new connections present
// it. The key never changes, so a renewal lost halfway (a crash before the
// file was written) is harmless: the old certificate is still valid and the
// next check renews again.
type Renewer struct {
	// Endpoint is ctrl's URL; HTTP a client whose TLS config presents
	// Holder (pki.ClientConfigWith). Ctrl, when set, replaces both: the
	// renewal goes to the endpoint the node's stream uses.
	Endpoint string
	HTTP     *http.Client
	Ctrl     *ctrlset.Set
	// Cert and Key are the files of the certificate and its key.
	Cert, Key string
	// Holder is the certificate new connections present.
	Holder *pki.ClientCertificate
	// Every is the interval between checks; zero is one hour.
	Every time.Duration
	Log   *slog.Logger
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

func (r *Renewer) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Due reports whether the current certificate should be renewed: less than
// a third of its lifetime left.
func (r *Renewer) Due() bool {
	leaf := r.Holder.Current().Leaf
	if leaf == nil {
		return false
	}
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotAfter.Sub(r.now()) < life/3
}

// Run checks at start and then every r.Every until ctx is done.
func (r *Renewer) Run(ctx context.Context) {
	every := r.Every
	if every <= 0 {
		every = time.Hour
	}
	for {
		if r.Due() {
			if err := r.Renew(ctx); err != nil && ctx.Err() == nil {
				r.log().Warn("node certificate renewal failed; will retry", "error", err.Error(),
					"expires", r.Holder.Current().Leaf.NotAfter.Format(time.RFC3339))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func (r *Renewer) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

// Renew gets a new certificate for the same key now.
func (r *Renewer) Renew(ctx context.Context) error {
	// The key in use, not the file: a renewal never makes a new key.
	key, ok := r.Holder.Current().PrivateKey.(crypto.Signer)
	if !ok {
		return errors.New("renew: the node key cannot sign")
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		return err
	}
	hc, endpoint := r.HTTP, strings.TrimRight(r.Endpoint, "/")
	if r.Ctrl != nil {
		e, err := r.Ctrl.Current(ctx)
		if err != nil {
			return fmt.Errorf("renew: %w", err)
		}
		hc, endpoint = r.Ctrl.Client(e), e.URL
	}
	client := nodev1connect.NewCertificateServiceClient(hc, endpoint)
	res, err := client.RenewCertificate(ctx, connect.NewRequest(&nodev1.RenewCertificateRequest{Csr: csr}))
	if err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	if err := pki.WriteCertificate(r.Cert, res.Msg.GetCertificate(), key); err != nil {
		return err
	}
	if err := r.Holder.Reload(r.Cert, r.Key); err != nil {
		return err
	}
	r.log().Info("node certificate renewed", "expires", r.Holder.Current().Leaf.NotAfter.Format(time.RFC3339))
	return nil
}

// Client loads the node certificate and returns an HTTP/2 client to ctrl
// that presents it, and the Renewer that keeps it fresh (run it with
// Run).
func Client(endpoint, ca, cert, key string, log *slog.Logger) (*http.Client, *Renewer, error) {
	holder, err := pki.LoadClientCertificate(cert, key)
	if err != nil {
		return nil, nil, err
	}
	tlsc, err := pki.ClientConfigWith(ca, holder)
	if err != nil {
		return nil, nil, err
	}
	hc := &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}}
	return hc, &Renewer{Endpoint: endpoint, HTTP: hc, Cert: cert, Key: key, Holder: holder, Log: log}, nil
}

// Clients is Client for several ctrl URLs (ctrlset.Parse): it returns the
// Set the node reaches ctrl through, presenting the node certificate, and
// the Renewer, which renews at the endpoint in use. resolve is the
// resolver of host names (nil: the system's).
func Clients(urls []string, resolve func(context.Context, string) ([]netip.Addr, error), ca, cert, key string, log *slog.Logger) (*ctrlset.Set, *Renewer, error) {
	holder, err := pki.LoadClientCertificate(cert, key)
	if err != nil {
		return nil, nil, err
	}
	tlsc, err := pki.ClientConfigWith(ca, holder)
	if err != nil {
		return nil, nil, err
	}
	set, err := ctrlset.New(ctrlset.Config{URLs: urls, TLS: tlsc, Resolve: resolve, Log: log})
	if err != nil {
		return nil, nil, err
	}
	return set, &Renewer{Ctrl: set, Cert: cert, Key: key, Holder: holder, Log: log}, nil
}
