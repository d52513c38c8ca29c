package agent

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// invRuntime installs the template version a start asks for, telling
// the agent twice (a burst) through OnInventoryChange.
type invRuntime struct {
	artRuntime
	imu       sync.Mutex
	templates []*nodev1.TemplateInfo
	notify    func()
}

func (r *invRuntime) OnInventoryChange(f func()) { r.notify = f }

func (r *invRuntime) Start(ctx context.Context, s Spec) error {
	if err := r.artRuntime.Start(ctx, s); err != nil {
		return err
	}
	if s.TemplateVersion != "" {
		r.imu.Lock()
		r.templates = append(r.templates, &nodev1.TemplateInfo{TemplateId: s.TemplateID, Version: s.TemplateVersion,
			Digest: s.TemplateSource.GetDigest()})
		r.imu.Unlock()
		r.notify()
		r.notify()
	}
	return nil
}

func (r *invRuntime) Templates() []*nodev1.TemplateInfo {
	r.imu.Lock()
	defer r.imu.Unlock()
	return append([]*nodev1.TemplateInfo(nil), r.templates...)
}

// invCtrl sends one desired state after the Hello and records the
// Hello and the Inventories it receives.
type invCtrl struct {
	nodev1connect.UnimplementedNodeServiceHandler
	desired   *nodev1.DesiredState
	hello     chan *nodev1.Hello
	inventory chan *nodev1.Inventory
}

func (c invCtrl) Connect(ctx context.Context, s *connect.BidiStream[nodev1.ConnectRequest, nodev1.ConnectResponse]) error {
	m, err := s.Receive()
	if err != nil {
		return err
	}
	c.hello <- m.GetHello()
	if err := s.Send(&nodev1.ConnectResponse{Desired: c.desired}); err != nil {
		return err
	}
	for {
		m, err := s.Receive()
		if err != nil {
			return err
		}
		if inv := m.GetInventory(); inv != nil {
			c.inventory <- inv
		}
	}
}

// TestInstallSendsInventory: a start that installs a template version
// (the runtime says the holdings changed) makes the agent send one
// Inventory, for the burst, with the complete lists of templates and
// platforms, as Hello has them.
func TestInstallSendsInventory(t *testing.T) {
	digest := "sha256:bb"
	c := invCtrl{hello: make(chan *nodev1.Hello, 1), inventory: make(chan *nodev1.Inventory, 4),
		desired: &nodev1.DesiredState{Full: true, Workspaces: []*nodev1.DesiredWorkspace{{WorkspaceId: "ws-1", Generation: 1,
			Power: nodev1.Power_POWER_RUNNING, TemplateId: "tiny", TemplateVersion: "1",
			TemplateSource: &nodev1.ArtifactSource{Digest: digest, SizeBytes: 10}}}}}
	mux := http.NewServeMux()
	mux.Handle(nodev1connect.NewNodeServiceHandler(c))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	rt := &invRuntime{artRuntime: artRuntime{netRuntime: netRuntime{events: make(chan Event)}},
		templates: []*nodev1.TemplateInfo{{TemplateId: "default", Version: "v1-x"}}}
	a := New(Config{NodeID: "n", Endpoint: srv.URL, HTTP: srv.Client(), Runtime: rt, Templates: rt.Templates,
		Features: []string{nodewire.FeatureArtifacts}, Log: slog.New(slog.DiscardHandler), Heartbeat: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = a.session(ctx) }()

	if h := <-c.hello; len(h.GetTemplates()) != 1 {
		t.Fatalf("hello templates %v", h.GetTemplates())
	}
	var inv *nodev1.Inventory
	select {
	case inv = <-c.inventory:
	case <-time.After(10 * time.Second):
		t.Fatal("no Inventory after the install")
	}
	tm := inv.GetTemplates()
	if len(tm) != 2 || tm[0].GetTemplateId() != "default" || tm[1].GetTemplateId() != "tiny" || tm[1].GetVersion() != "1" || tm[1].GetDigest() != digest {
		t.Errorf("inventory templates %v", tm)
	}
	if p := inv.GetPlatforms(); len(p) != 1 || p[0].GetTemplateId() != "sandbox" {
		t.Errorf("inventory platforms %v", p)
	}
	select {
	case again := <-c.inventory:
		t.Errorf("a second Inventory for one burst: %v", again)
	case <-time.After(3 * inventoryDelay):
	}
}
