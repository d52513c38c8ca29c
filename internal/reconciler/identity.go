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

// WithNodeIdentity records the node a verified certificate names.
func WithNodeIdentity(ctx context.Context, node string) context.Context {
	return context.WithValue(ctx, nodeIDKey{}, node)
}

func nodeIdentity(ctx context.Context) string {
	s, _ := ctx.Value(nodeIDKey{}).(string)
	return s
}

func detailOf(fe *fault.Error) *ctrlv1.ErrorDetail { return apierr.Detail(fe) }

func tsOf(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }
