// Package nodepeer carries the identity of a verified node certificate
// through a request's context: ctrl's authentication sets it, the handlers
// of the node-facing services read it.
package nodepeer

import (
	"bytes"
	"context"
	"errors"

	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
)

// Peer is who a verified node certificate names.
type Peer struct {
	// NodeID is the certificate's common name.
	NodeID string
	// KeyHash is the SHA-256 of the certificate's public key (PKIX), as
	// pki.PublicKeyHash computes it.
	KeyHash []byte
}

type key struct{}

// With records p in ctx.
func With(ctx context.Context, p Peer) context.Context { return context.WithValue(ctx, key{}, p) }

// From returns the peer of ctx; ok is false for calls without a node
// certificate.
func From(ctx context.Context) (p Peer, ok bool) {
	p, ok = ctx.Value(key{}).(Peer)
	return p, ok
}

// MayConnect checks p against the key registered for its node at the
// node's latest enrollment (nil when none was: a certificate issued by
// hand): only that key may speak for the node.
func (p Peer) MayConnect(registered []byte) error {
	if len(registered) > 0 && !bytes.Equal(registered, p.KeyHash) {
		return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied,
			Message: "this certificate of node " + p.NodeID + " was superseded by a later enrollment"}
	}
	return nil
}

// Admit decides, inside the transaction that acts on the answer, whether p
// may speak for its node: its key must not be denied (store.DeniedNodeKey:
// a revoked node key, whatever certificate carries it), the node must not
// be RETIRED (a retired node ID is a tombstone, whatever certificate names
// it, one issued by hand after the retirement included), and the key must
// be the key of n's latest
// enrollment (MayConnect; n nil is a node not registered yet).
// NodeService/Connect and FetchArtifact and CertificateService/
// RenewCertificate call it; Connect also checks that the certificate names
// the node of its Hello.
//
// tx is a store.NodeTx; the retirement is read when it is a whole store.Tx
// (every dialect's transaction is).
func (p Peer) Admit(ctx context.Context, tx store.NodeTx, n *store.Node) error {
	if len(p.KeyHash) == 0 {
		return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied,
			Message: "no verified node key"}
	}
	_, err := tx.GetDeniedNodeKey(ctx, p.KeyHash)
	switch {
	case err == nil:
		return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied,
			Message: "the key of this certificate of node " + p.NodeID + " was revoked"}
	case !errors.Is(err, store.ErrNotFound):
		return err
	}
	if full, ok := tx.(store.Tx); ok {
		_, rec, err := fleet.GetRecord(ctx, full, p.NodeID)
		switch {
		case err == nil && rec.State == fleet.StateRetired:
			return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied,
				Message: "node " + p.NodeID + " is retired: its ID is a tombstone no certificate speaks for"}
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return err
		}
	}
	if n == nil {
		return nil
	}
	return p.MayConnect(n.CertKeyHash)
}
