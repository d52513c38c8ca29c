package agent

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// artRuntime records what the agent hands an Artifacts runtime.
type artRuntime struct {
	netRuntime
	amu       sync.Mutex
	platforms []*nodev1.DesiredPlatform
	setCalls  int
	reclaimed []string
}

func (r *artRuntime) SetPlatform(p *nodev1.DesiredPlatform) {
	r.amu.Lock()
	defer r.amu.Unlock()
	r.setCalls++
	r.platforms = append(r.platforms, p)
}

func (r *artRuntime) Reclaim(d []string) {
	r.amu.Lock()
	defer r.amu.Unlock()
	r.reclaimed = append(r.reclaimed, d...)
}

func (r *artRuntime) Platforms() []*nodev1.TemplateInfo {
	return []*nodev1.TemplateInfo{{TemplateId: "sandbox", Version: "3", Digest: "sha256:cc"}}
}

// The desired platform and reclaimed digests go to the runtime: a full
// state without a platform means the node's own guest, a partial one
// without it changes nothing. A start carries the template version and
// its source.
func TestArtifactsReachTheRuntime(t *testing.T) {
	rt := &artRuntime{netRuntime: netRuntime{events: make(chan Event)}}
	a := New(Config{NodeID: "n", Runtime: rt, Log: slog.New(slog.DiscardHandler)})
	p := &nodev1.DesiredPlatform{PlatformId: "sandbox", Version: "3", ProtocolVersion: 1}
	a.apply(t.Context(), &nodev1.DesiredState{Full: true, Platform: p})
	a.apply(t.Context(), &nodev1.DesiredState{ReclaimedDigests: []string{"sha256:aa"}})
	a.apply(t.Context(), &nodev1.DesiredState{Full: true})
	src := &nodev1.ArtifactSource{Digest: "sha256:bb", SizeBytes: 10}
	a.apply(t.Context(), &nodev1.DesiredState{Workspaces: []*nodev1.DesiredWorkspace{{WorkspaceId: "ws-1", Generation: 1,
		Power: nodev1.Power_POWER_RUNNING, TemplateId: "debian", TemplateVersion: "2", TemplateSource: src}}})
	deadline := time.Now().Add(5 * time.Second)
	for {
		rt.mu.Lock()
		n := len(rt.starts)
		rt.mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	rt.amu.Lock()
	defer rt.amu.Unlock()
	if rt.setCalls != 2 || rt.platforms[0] != p || rt.platforms[1] != nil {
		t.Errorf("SetPlatform calls: %v", rt.platforms)
	}
	if !slices.Equal(rt.reclaimed, []string{"sha256:aa"}) {
		t.Errorf("reclaimed %v", rt.reclaimed)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.starts) != 1 || rt.starts[0].TemplateVersion != "2" || rt.starts[0].TemplateSource != src {
		t.Errorf("starts %+v", rt.starts)
	}
}

// The Hello says which guest protocol the node speaks and which platforms
// it holds.
func TestHelloArtifacts(t *testing.T) {
	c := helloCtrl{hello: make(chan *nodev1.Hello, 1)}
	mux := http.NewServeMux()
	mux.Handle(nodev1connect.NewNodeServiceHandler(c))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	a := New(Config{NodeID: "n", Endpoint: srv.URL, HTTP: srv.Client(), Runtime: &artRuntime{netRuntime: netRuntime{events: make(chan Event)}},
		Features: []string{nodewire.FeatureArtifacts}, Log: slog.New(slog.DiscardHandler)})
	_ = a.session(t.Context())
	h := <-c.hello
	if h.GetGuestProtocolVersion() != nodewire.GuestProtocolVersion || len(h.GetPlatforms()) != 1 || h.GetPlatforms()[0].GetVersion() != "3" {
		t.Fatalf("hello: protocol %d, platforms %v", h.GetGuestProtocolVersion(), h.GetPlatforms())
	}
}
