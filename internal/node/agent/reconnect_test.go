package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
)

// dropCtrl accepts each stream (the full desired state) and ends it after
// hold, recording when each Hello arrived.
type dropCtrl struct {
	nodev1connect.UnimplementedNodeServiceHandler
	hold  time.Duration
	mu    sync.Mutex
	hello []time.Time
}

func (c *dropCtrl) Connect(ctx context.Context, s *connect.BidiStream[nodev1.ConnectRequest, nodev1.ConnectResponse]) error {
	if _, err := s.Receive(); err != nil {
		return err
	}
	c.mu.Lock()
	c.hello = append(c.hello, time.Now())
	c.mu.Unlock()
	if err := s.Send(&nodev1.ConnectResponse{Desired: &nodev1.DesiredState{Full: true}}); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(c.hold):
	}
	return connect.NewError(connect.CodeUnavailable, errors.New("replica going away"))
}

func (c *dropCtrl) hellos() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.hello...)
}

// TestReconnectBackoff: after a stream ctrl accepted and that stayed open
// a second or more, the agent connects again within the minimum back-off
// however many such streams ended before (replicas dying a few seconds
// apart); streams dropped at once still meet a doubling wait.
func TestReconnectBackoff(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hold     time.Duration
		hellos   int
		maxGap   time.Duration // between a stream's end and the next Hello
		minLater time.Duration // the last gaps' least, when they must grow
	}{
		{name: "accepted and open 1.2 s", hold: 1200 * time.Millisecond, hellos: 5, maxGap: 3 * ReconnectMin},
		{name: "dropped at once", hold: 0, hellos: 6, minLater: 3 * ReconnectMin / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &dropCtrl{hold: tc.hold}
			mux := http.NewServeMux()
			mux.Handle(nodev1connect.NewNodeServiceHandler(c))
			srv := httptest.NewUnstartedServer(mux)
			srv.EnableHTTP2 = true
			srv.StartTLS()
			t.Cleanup(srv.Close)
			hc := srv.Client()
			// The tunnels' own copy, taken before the stream's transport
			// configures HTTP/2 on the one it has.
			dataTLS := hc.Transport.(*http.Transport).TLSClientConfig.Clone()
			a := New(Config{NodeID: "n", Endpoint: srv.URL, HTTP: hc, DataTLS: dataTLS, Runtime: &netRuntime{events: make(chan Event)},
				Log: slog.New(slog.DiscardHandler), Heartbeat: time.Hour})
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); _ = a.Run(ctx) }()
			deadline := time.Now().Add(20 * time.Second)
			for len(c.hellos()) < tc.hellos && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			<-done
			h := c.hellos()
			if len(h) < tc.hellos {
				t.Fatalf("%d streams in 20 s, want %d", len(h), tc.hellos)
			}
			var gaps []time.Duration
			for i := 1; i < len(h); i++ {
				gaps = append(gaps, h[i].Sub(h[i-1])-tc.hold)
			}
			t.Logf("gaps between a stream's end and the next Hello: %v", gaps)
			for i, g := range gaps {
				if tc.maxGap > 0 && g > tc.maxGap {
					t.Errorf("gap %d: %v, want at most %v", i, g, tc.maxGap)
				}
			}
			if tc.minLater > 0 && gaps[len(gaps)-1] < tc.minLater {
				t.Errorf("last gap %v after streams dropped at once, want a doubled wait of at least %v", gaps[len(gaps)-1], tc.minLater)
			}
		})
	}
}
