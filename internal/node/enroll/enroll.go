// Package enroll is the node's side of enrollment: it turns an operator's
// enrollment token into the node's certificate, once, and keeps the
// certificate and key under the node's state directory.
//
// The key is created and saved before the token is presented, so a node that
// dies before saving its certificate presents the same key again and ctrl
// answers with the same certificate (a used token accepts only the key it
// was used with).
package enroll

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/node/ctrlset"
	"github.com/kibotos/kibotos/internal/pki"
)

// Options configure Ensure.
type Options struct {
	// Endpoint is ctrl's URL; Endpoints, when set, replaces it: several
	// URLs (ctrlset.Parse), each address of each tried in turn.
	Endpoint  string
	Endpoints []string
	// Resolve resolves the host names of Endpoints (nil: the system's
	// resolver).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// CA is the CA that signed ctrl's server certificate (PEM file).
	CA string
	// Dir receives node.pem and node-key.pem.
	Dir string
	// Token is the enrollment token; needed only when Dir holds no
	// certificate yet.
	Token string
	// NodeID is the ID to ask for; empty accepts the token's or the host
	// name.
	NodeID string
	// Log receives progress; nil discards it.
	Log *slog.Logger
}

// Paths returns the certificate and key paths under dir.
func Paths(dir string) (cert, key string) {
	return filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
}

// ErrNoCredentials: there is no certificate and no token to get one.
var ErrNoCredentials = errors.New("no node certificate yet and no enrollment token: create one with `kibo enrollment create` and pass it with --enroll-token or --enroll-token-file")

// Ensure returns the paths of the node's certificate and key, enrolling
// with o.Token first when there is no certificate yet. Transient failures
// (ctrl unreachable) are retried until ctx is done; a refused token is
// returned at once.
func Ensure(ctx context.Context, o Options) (cert, key string, err error) {
	cert, key = Paths(o.Dir)
	if _, err := os.Stat(cert); err == nil {
		return cert, key, nil
	}
	if o.Token == "" {
		return "", "", ErrNoCredentials
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	signer, err := pki.EnsureKey(key)
	if err != nil {
		return "", "", err
	}
	csr, err := pki.CreateCSR(signer)
	if err != nil {
		return "", "", err
	}
	tlsc, err := pki.ClientConfig(o.CA, "", "")
	if err != nil {
		return "", "", err
	}
	urls := o.Endpoints
	if len(urls) == 0 {
		urls = []string{strings.TrimRight(o.Endpoint, "/")}
	}
	set, err := ctrlset.New(ctrlset.Config{URLs: urls, TLS: tlsc, Timeout: 30 * time.Second, Resolve: o.Resolve, Log: log})
	if err != nil {
		return "", "", err
	}
	host, _ := os.Hostname()
	req := &nodev1.EnrollRequest{Token: o.Token, NodeId: o.NodeID, Hostname: host, Csr: csr}
	backoff := ctrlset.Backoff{Min: 200 * time.Millisecond, Max: 5 * time.Second}
	for {
		// Each attempt goes to the next endpoint: a dead replica does not
		// hold the enrollment up.
		e, err := set.Next(ctx)
		var res *connect.Response[nodev1.EnrollResponse]
		if err == nil {
			res, err = nodev1connect.NewBootstrapServiceClient(set.Client(e), e.URL).Enroll(ctx, connect.NewRequest(req))
		} else {
			err = connect.NewError(connect.CodeUnavailable, err)
		}
		if err == nil {
			if err := pki.WriteCertificate(cert, res.Msg.GetCertificate(), signer); err != nil {
				return "", "", err
			}
			log.Info("enrolled", "node_id", res.Msg.GetNodeId())
			return cert, key, nil
		}
		if !transient(err) {
			return "", "", fmt.Errorf("enrollment: %w", err)
		}
		log.Warn("enrollment: ctrl not reachable; retrying at the next endpoint", "url", e.URL, "error", err.Error())
		backoff.Wait(ctx)
		if ctx.Err() != nil {
			return "", "", ctx.Err()
		}
	}
}

func transient(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeUnknown, connect.CodeAborted, connect.CodeInternal:
		return true
	}
	return false
}
