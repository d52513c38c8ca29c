package agent

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
)

// beatCtrl hands the heartbeats it receives to beats.
type beatCtrl struct {
	nodev1connect.UnimplementedNodeServiceHandler
	beats chan *nodev1.Heartbeat
}

func (c beatCtrl) Connect(ctx context.Context, s *connect.BidiStream[nodev1.ConnectRequest, nodev1.ConnectResponse]) error {
	for {
		msg, err := s.Receive()
		if err != nil {
			return err
		}
		if hb := msg.GetHeartbeat(); hb != nil {
			select {
			case c.beats <- hb:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// TestHeartbeatMemory: every heartbeat carries the condition Config.Memory
// samples at that moment; without Memory it carries none.
func TestHeartbeatMemory(t *testing.T) {
	for _, withMemory := range []bool{true, false} {
		ctl := beatCtrl{beats: make(chan *nodev1.Heartbeat)}
		mux := http.NewServeMux()
		mux.Handle(nodev1connect.NewNodeServiceHandler(ctl))
		srv := httptest.NewUnstartedServer(mux)
		srv.EnableHTTP2 = true
		srv.StartTLS()
		var n atomic.Uint64
		cfg := Config{NodeID: "n", Endpoint: srv.URL, HTTP: srv.Client(), Runtime: &talkative{events: make(chan Event)},
			Log: slog.New(slog.DiscardHandler), Heartbeat: 10 * time.Millisecond}
		if withMemory {
			cfg.Memory = func() *nodev1.MemoryCondition {
				return &nodev1.MemoryCondition{Level: nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_MODERATE, UsedMib: n.Add(1), LimitMib: 100,
					Workspaces: []*nodev1.WorkspaceMemory{{WorkspaceId: "ws-1", UsedMib: 7}}}
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); _ = New(cfg).session(ctx) }()
		for i := uint64(1); i <= 2; i++ {
			hb := <-ctl.beats
			var want *nodev1.MemoryCondition
			if withMemory {
				want = &nodev1.MemoryCondition{Level: nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_MODERATE, UsedMib: i, LimitMib: 100,
					Workspaces: []*nodev1.WorkspaceMemory{{WorkspaceId: "ws-1", UsedMib: 7}}}
			}
			if d := cmp.Diff(want, hb.GetMemory(), protocmp.Transform()); d != "" {
				t.Errorf("memory=%v: heartbeat %d (-want +got):\n%s", withMemory, i, d)
			}
		}
		cancel()
		<-done
		srv.Close()
	}
}
