package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// netRuntime is a runtime whose network applies what it is given, unless
// failApply says otherwise.
type netRuntime struct {
	mu        sync.Mutex
	running   bool
	applied   *nodev1.NetworkStatus // nil: none applied yet (re-adopted)
	failApply error
	// adopt makes Start find the execution running, with no network
	// applied (re-adopted by the runtime meanwhile).
	adopt   bool
	starts  []Spec
	applies []*nodev1.NetworkConfig
	closed  []string
	events  chan Event
}

func (r *netRuntime) Start(_ context.Context, s Spec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, s)
	r.running = true
	if r.adopt {
		r.applied = nil
		return nil
	}
	r.applied = &nodev1.NetworkStatus{AppliedRevision: s.Network.GetPolicy().GetRevision(), DnsConfigVersion: nodewire.DNSConfigVersion}
	return nil
}
func (r *netRuntime) Stop(context.Context, string, bool) error { return nil }
func (r *netRuntime) Delete(context.Context, string) error     { return nil }
func (r *netRuntime) Status(id string) Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{WorkspaceID: id, Running: r.running, Guest: ctrlv1.GuestCondition_GUEST_CONDITION_READY}
	if r.running {
		st.Network = &nodev1.NetworkStatus{DnsConfigVersion: nodewire.DNSConfigVersion}
		if r.applied != nil {
			st.Network = r.applied
		}
	}
	return st
}
func (r *netRuntime) Executions() []Status                         { return nil }
func (r *netRuntime) Resize(context.Context, string, uint64) error { return nil }
func (r *netRuntime) Events() <-chan Event                         { return r.events }
func (r *netRuntime) ApplyNetwork(_ context.Context, _ string, nc *nodev1.NetworkConfig) (*nodev1.NetworkStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applies = append(r.applies, nc)
	if r.failApply != nil {
		return r.applied, r.failApply
	}
	r.applied = &nodev1.NetworkStatus{AppliedRevision: nc.GetPolicy().GetRevision(), DnsConfigVersion: nodewire.DNSConfigVersion}
	for _, e := range nc.GetEgresses() {
		r.applied.Egresses = append(r.applied.Egresses, &ctrlv1.EgressStatus{EgressId: e.GetEgressId(), AppliedRevision: e.GetRevision()})
	}
	return r.applied, nil
}
func (r *netRuntime) CloseEgress(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = append(r.closed, id)
}

func desiredNet(gen, rev uint64, egressRev uint64) *nodev1.DesiredWorkspace {
	return &nodev1.DesiredWorkspace{WorkspaceId: "w", Generation: gen, Power: nodev1.Power_POWER_RUNNING, TemplateId: "default",
		Network: &nodev1.NetworkConfig{
			Policy:   &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET, Revision: rev},
			Egresses: []*nodev1.NetworkEgress{{EgressId: "eg-1", Revision: egressRev}},
		}}
}

// last returns the last report queued for w.
func last(t *testing.T, a *Agent) *nodev1.ExecutionReport {
	t.Helper()
	reps := drain(a.reports)
	if len(reps) == 0 {
		t.Fatal("no report")
	}
	return reps[len(reps)-1]
}

// TestNetworkApplied: a start carries the desired network; a running
// execution gets every new desired network applied before the report that
// carries its status (policy and Egress revisions, DNS configuration
// version); a failed apply is reported failed with the status still in
// effect; an execution found running by Start (re-adopted) without the
// desired network gets it applied.
func TestNetworkApplied(t *testing.T) {
	rt := &netRuntime{events: make(chan Event)}
	a := New(Config{NodeID: "n", Runtime: rt, Log: slog.New(slog.DiscardHandler)})
	ctx := t.Context()

	a.act(ctx, desiredNet(1, 3, 1))
	if len(rt.starts) != 1 || rt.starts[0].Network.GetPolicy().GetRevision() != 3 {
		t.Fatalf("starts: %+v", rt.starts)
	}
	rep := last(t, a)
	if rep.GetState() != nodev1.ExecState_EXEC_STATE_RUNNING || rep.GetNetwork().GetAppliedRevision() != 3 ||
		rep.GetNetwork().GetDnsConfigVersion() != nodewire.DNSConfigVersion || rep.GetNetwork().GetFailed() {
		t.Fatalf("report after start: %v", rep)
	}

	a.act(ctx, desiredNet(2, 3, 2)) // UpdateEgress
	rep = last(t, a)
	if len(rt.applies) != 1 || rep.GetNetwork().GetEgresses()[0].GetAppliedRevision() != 2 || rep.GetGeneration() != 2 {
		t.Fatalf("report after an Egress update: %v (applies %d)", rep, len(rt.applies))
	}

	rt.failApply = errors.New("egress eg-1: tls: bad ca_cert")
	a.act(ctx, desiredNet(3, 4, 2))
	rep = last(t, a)
	if n := rep.GetNetwork(); !n.GetFailed() || n.GetMessage() != "egress eg-1: tls: bad ca_cert" || n.GetAppliedRevision() != 3 ||
		rep.GetState() != nodev1.ExecState_EXEC_STATE_RUNNING {
		t.Fatalf("report after a failed apply: %v", rep)
	}

	// Re-adopted: running, nothing applied; a start finds it running.
	rt.failApply, rt.running, rt.applied, rt.adopt = nil, false, nil, true
	applies := len(rt.applies)
	a.act(ctx, desiredNet(4, 5, 2))
	rep = last(t, a)
	if len(rt.applies) != applies+1 || rep.GetNetwork().GetAppliedRevision() != 5 {
		t.Fatalf("report after the start of a re-adopted execution: %v", rep)
	}
}

// TestDeletedEgressesClosed: deleted_egress_ids of a desired state reach
// the runtime's CloseEgress.
func TestDeletedEgressesClosed(t *testing.T) {
	rt := &netRuntime{events: make(chan Event)}
	a := New(Config{NodeID: "n", Runtime: rt, Log: slog.New(slog.DiscardHandler)})
	a.apply(t.Context(), &nodev1.DesiredState{DeletedEgressIds: []string{"eg-1", "eg-2"}})
	if !slices.Equal(rt.closed, []string{"eg-1", "eg-2"}) {
		t.Fatalf("closed: %v", rt.closed)
	}
}

// helloCtrl records the Hello it receives.
type helloCtrl struct {
	nodev1connect.UnimplementedNodeServiceHandler
	hello chan *nodev1.Hello
}

func (c helloCtrl) Connect(ctx context.Context, s *connect.BidiStream[nodev1.ConnectRequest, nodev1.ConnectResponse]) error {
	m, err := s.Receive()
	if err != nil {
		return err
	}
	c.hello <- m.GetHello()
	return nil
}

// TestHelloFeatures: the Hello lists Config.Features.
func TestHelloFeatures(t *testing.T) {
	c := helloCtrl{hello: make(chan *nodev1.Hello, 1)}
	mux := http.NewServeMux()
	mux.Handle(nodev1connect.NewNodeServiceHandler(c))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	a := New(Config{NodeID: "n", Endpoint: srv.URL, HTTP: srv.Client(), Runtime: &netRuntime{events: make(chan Event)},
		Features: []string{nodewire.FeatureNetwork}, Log: slog.New(slog.DiscardHandler)})
	_ = a.session(t.Context())
	if h := <-c.hello; !slices.Equal(h.GetFeatures(), []string{nodewire.FeatureNetwork}) {
		t.Fatalf("features: %v", h.GetFeatures())
	}
}
