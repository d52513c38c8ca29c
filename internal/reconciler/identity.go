package reconciler

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/apierr"
	"github.com/kibotos/kibotos/internal/fault"
)

type nodeIDKey struct{}

// peer is who a verified node certificate names.
type peer struct {
	node    string
	keyHash []byte // SHA-256 of the certificate's public key (PKIX)
}

// WithNodeIdentity records the node a verified certificate names, and the
// hash of its public key (pki.PublicKeyHash).
func WithNodeIdentity(ctx context.Context, node string, keyHash []byte) context.Context {
	return context.WithValue(ctx, nodeIDKey{}, peer{node: node, keyHash: keyHash})
}

func nodeIdentity(ctx context.Context) peer {
	p, _ := ctx.Value(nodeIDKey{}).(peer)
	return p
}

func detailOf(fe *fault.Error) *ctrlv1.ErrorDetail { return apierr.Detail(fe) }

func tsOf(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }
