package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
)

// stingyGuest answers every SendInput with success and accepts nothing
// (until its context ends, as a real client does).
type stingyGuest struct {
	guestv1connect.ProcessServiceClient
	calls atomic.Int64
}

func (g *stingyGuest) SendInput(ctx context.Context, _ *connect.Request[guestv1.SendInputRequest]) (*connect.Response[guestv1.SendInputResponse], error) {
	if err := ctx.Err(); err != nil {
		return nil, connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	g.calls.Add(1)
	return connect.NewResponse(&guestv1.SendInputResponse{}), nil
}

// TestSendAllWaitsForStingyGuest: a guest that answers success but takes
// nothing makes sendAll wait between calls, not spin until its deadline.
func TestSendAllWaitsForStingyGuest(t *testing.T) {
	t.Parallel()
	g := &stingyGuest{}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err := sendAll(ctx, &ProcessClient{ProcessServiceClient: g}, "p", []byte("input"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("sendAll to a guest that takes nothing = %v, want %v", err, context.DeadlineExceeded)
	}
	if n := g.calls.Load(); n > 40 {
		t.Errorf("sendAll made %d SendInput calls in 200ms, want at most 40 (one per 10ms wait)", n)
	}
}
