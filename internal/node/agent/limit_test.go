package agent

import (
	"context"
	"github.com/kibotos/kibotos/internal/nodewire"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
)

// bigCtrl answers a Hello with a desired state of the given size.
type bigCtrl struct {
	nodev1connect.UnimplementedNodeServiceHandler
	size int
}

func (c bigCtrl) Connect(ctx context.Context, s *connect.BidiStream[nodev1.ConnectRequest, nodev1.ConnectResponse]) error {
	if _, err := s.Receive(); err != nil {
		return err
	}
	err := s.Send(&nodev1.ConnectResponse{Desired: &nodev1.DesiredState{Full: true,
		Workspaces: []*nodev1.DesiredWorkspace{{WorkspaceId: strings.Repeat("w", c.size)}}}})
	if err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// TestStreamReadLimit: a message from ctrl beyond nodewire.MaxMessageBytes ends the
// session (resource_exhausted) instead of being buffered and applied.
func TestStreamReadLimit(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(nodev1connect.NewNodeServiceHandler(bigCtrl{size: nodewire.MaxMessageBytes + 1}))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	a := New(Config{NodeID: "n", Endpoint: srv.URL, HTTP: srv.Client(), Runtime: &talkative{events: make(chan Event)},
		Log: slog.New(slog.DiscardHandler)})
	err := a.session(t.Context())
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("session with an oversized message from ctrl = %v, want resource_exhausted", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.desired) != 0 {
		t.Errorf("the oversized desired state was applied: %d workspaces", len(a.desired))
	}
}
