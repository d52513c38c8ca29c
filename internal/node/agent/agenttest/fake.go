// Package agenttest provides a test double of agent.Runtime for fast tests
// of ctrl's lifecycle logic without root. It runs nothing; the real runtime
// is internal/node/sandbox, which the end-to-end tests use.
package agenttest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// Runtime records executions, writable layers and Volume images in
// memory (an agent.VolumeRuntime too).
type Runtime struct {
	mu     sync.Mutex
	execs  map[string]*agent.Status
	events chan agent.Event

	// FailStart makes Start fail for these workspaces.
	FailStart map[string]bool
	// StartError, when it has an entry for a workspace, is the error its
	// Start fails with (a runtime quoting its guest at length, say).
	StartError map[string]error
	// FailWriteback makes a normal Stop fail with ErrWritebackFailed.
	FailWriteback map[string]bool
	// Gate, when set, blocks Start until it is closed.
	Gate chan struct{}
	// Starts counts Start calls per workspace.
	Starts map[string]int
	// Guest, when set, is the ProcessService every running workspace's
	// guest serves (Processes); set it before the agent starts.
	Guest guestv1connect.ProcessServiceHandler
	// GuestServices, when set, are further services of every running
	// workspace's guest (connect handlers by path prefix, as
	// guestv1connect.NewFileServiceHandler returns them).
	GuestServices map[string]http.Handler
	// LogDir, when set, holds the workspaces' logs as <ws>.log and
	// <ws>.log.1 (OpenLog), whether they run or not.
	LogDir string
	// FailNetwork, when it has an entry for a workspace, is the error its
	// ApplyNetwork fails with (the network in effect stays).
	FailNetwork map[string]error
	// NetworkGate, when set, blocks ApplyNetwork until it is closed (a node
	// that does not confirm a policy change).
	NetworkGate chan struct{}
	// ClosedEgresses lists the Egresses CloseEgress was called for, in order.
	ClosedEgresses []string
	// FailResize, when it has an entry for a workspace, is the error its
	// Resize fails with (the layer keeps its size).
	FailResize map[string]error
	// Resizes counts Resize calls that grew a layer, per workspace.
	Resizes map[string]int
	// FailVolume, when it has an entry for a Volume, is the error its
	// EnsureVolume and DeleteVolume fail with.
	FailVolume map[string]error
	// VolumeGate, when set, blocks EnsureVolume and DeleteVolume until it
	// is closed.
	VolumeGate chan struct{}
	// VolumeOps counts EnsureVolume and DeleteVolume calls per Volume.
	VolumeOps map[string]int
	// StorageBytes, when set, is the pool: layers and Volumes together
	// may not exceed it (a permanent error, as the sandbox's).
	StorageBytes uint64

	// volumes holds the Volume images by id; mounts the Volume each
	// running execution mounts, by workspace.
	volumes map[string]uint64
	mounts  map[string]agent.VolumeMount

	// networks holds the network configuration each execution applies.
	networks map[string]*nodev1.NetworkConfig

	guestOnce sync.Once
	guestSrv  *httptest.Server
	guestHTTP *http.Client
}

// New returns an empty Runtime.
func New() *Runtime {
	return &Runtime{execs: map[string]*agent.Status{}, events: make(chan agent.Event, 64),
		FailStart: map[string]bool{}, StartError: map[string]error{}, FailWriteback: map[string]bool{}, Starts: map[string]int{},
		FailNetwork: map[string]error{}, networks: map[string]*nodev1.NetworkConfig{},
		FailResize: map[string]error{}, Resizes: map[string]int{}, FailVolume: map[string]error{}, VolumeOps: map[string]int{},
		volumes: map[string]uint64{}, mounts: map[string]agent.VolumeMount{}}
}

func (r *Runtime) get(id string) *agent.Status {
	s := r.execs[id]
	if s == nil {
		s = &agent.Status{WorkspaceID: id}
		r.execs[id] = s
	}
	return s
}

// Start marks the execution running with a ready guest.
func (r *Runtime) Start(ctx context.Context, s agent.Spec) error {
	r.mu.Lock()
	gate := r.Gate
	r.Starts[s.WorkspaceID]++
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.StartError[s.WorkspaceID]; err != nil {
		return err
	}
	if r.FailStart[s.WorkspaceID] {
		return errors.New("injected start failure")
	}
	if v := s.Volume; v != nil {
		if _, ok := r.volumes[v.VolumeID]; !ok {
			return fmt.Errorf("agenttest: volume %s is not on the node", v.VolumeID)
		}
		if ws := r.mountedBy(v.VolumeID); ws != "" && ws != s.WorkspaceID {
			return fmt.Errorf("agenttest: volume %s is mounted by %s", v.VolumeID, ws)
		}
	}
	st := r.get(s.WorkspaceID)
	if !st.LayerExists {
		if err := r.fits(s.CapacityBytes); err != nil {
			return err
		}
		st.LayerCapacityBytes = s.CapacityBytes
	}
	if v := s.Volume; v != nil {
		r.mounts[s.WorkspaceID] = *v
	}
	st.Running, st.LayerExists, st.Generation = true, true, s.Generation
	st.Guest = ctrlv1.GuestCondition_GUEST_CONDITION_READY
	r.networks[s.WorkspaceID] = s.Network
	return nil
}

// Stop ends the execution (normal stops can be made to fail).
func (r *Runtime) Stop(_ context.Context, id string, force bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.get(id)
	if st.Running && !force && r.FailWriteback[id] {
		return agent.ErrWritebackFailed
	}
	st.Running, st.Guest = false, 0
	delete(r.networks, id)
	delete(r.mounts, id)
	return nil
}

// Delete releases everything.
func (r *Runtime) Delete(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.execs, id)
	delete(r.networks, id)
	delete(r.mounts, id)
	return nil
}

// Resize grows a stopped workspace's layer (FailResize can make it fail;
// smaller than the layer, or beyond StorageBytes, is permanent).
func (r *Runtime) Resize(_ context.Context, id string, capacity uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.FailResize[id]; err != nil {
		return err
	}
	st := r.execs[id]
	switch {
	case st == nil || !st.LayerExists:
		return fmt.Errorf("agenttest: %s has no writable layer", id)
	case st.Running:
		return fmt.Errorf("agenttest: %s holds an execution", id)
	case capacity < st.LayerCapacityBytes:
		return agent.Permanent(fmt.Errorf("agenttest: %d bytes is smaller than the layer's %d", capacity, st.LayerCapacityBytes))
	case capacity == st.LayerCapacityBytes:
		return nil
	}
	if err := r.fits(capacity - st.LayerCapacityBytes); err != nil {
		return err
	}
	st.LayerCapacityBytes = capacity
	r.Resizes[id]++
	return nil
}

// LayerCapacity returns the size of the workspace's layer (0: none).
func (r *Runtime) LayerCapacity(id string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.execs[id]; st != nil && st.LayerExists {
		return st.LayerCapacityBytes
	}
	return 0
}

// fits reports, with r.mu held, whether more bytes fit in StorageBytes.
func (r *Runtime) fits(more uint64) error {
	if r.StorageBytes == 0 {
		return nil
	}
	used := uint64(0)
	for _, st := range r.execs {
		if st.LayerExists {
			used += st.LayerCapacityBytes
		}
	}
	for _, c := range r.volumes {
		used += c
	}
	if used+more > r.StorageBytes {
		return agent.Permanent(fmt.Errorf("agenttest: the storage pool cannot hold %d more bytes (%d of %d in use)", more, used, r.StorageBytes))
	}
	return nil
}

// mountedBy returns the workspace whose execution mounts the Volume; r.mu
// held.
func (r *Runtime) mountedBy(vol string) string {
	for ws, m := range r.mounts {
		if m.VolumeID == vol {
			return ws
		}
	}
	return ""
}

// volumeGate waits for VolumeGate.
func (r *Runtime) volumeGate(ctx context.Context, id string) error {
	r.mu.Lock()
	gate := r.VolumeGate
	r.VolumeOps[id]++
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// EnsureVolume creates the image or grows it (never shrinks: permanent;
// not while mounted).
func (r *Runtime) EnsureVolume(ctx context.Context, id string, capacity uint64) error {
	if err := r.volumeGate(ctx, id); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.FailVolume[id]; err != nil {
		return err
	}
	cur, ok := r.volumes[id]
	switch {
	case ok && capacity < cur:
		return agent.Permanent(fmt.Errorf("agenttest: %d bytes is smaller than the Volume's %d", capacity, cur))
	case ok && capacity == cur:
		return nil
	case ok && r.mountedBy(id) != "":
		return fmt.Errorf("agenttest: volume %s is mounted by %s", id, r.mountedBy(id))
	}
	if err := r.fits(capacity - cur); err != nil {
		return err
	}
	r.volumes[id] = capacity
	return nil
}

// DeleteVolume removes the image (not while mounted).
func (r *Runtime) DeleteVolume(ctx context.Context, id string) error {
	if err := r.volumeGate(ctx, id); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.FailVolume[id]; err != nil {
		return err
	}
	if ws := r.mountedBy(id); ws != "" {
		return fmt.Errorf("agenttest: volume %s is mounted by %s", id, ws)
	}
	delete(r.volumes, id)
	return nil
}

// VolumeStatus describes one image.
func (r *Runtime) VolumeStatus(id string) agent.VolumeStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.volumes[id]
	return agent.VolumeStatus{VolumeID: id, Exists: ok, CapacityBytes: c, Mounted: r.mountedBy(id) != ""}
}

// Volumes lists the images, sorted by id.
func (r *Runtime) Volumes() []agent.VolumeStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]agent.VolumeStatus, 0, len(r.volumes))
	for id, c := range r.volumes {
		out = append(out, agent.VolumeStatus{VolumeID: id, Exists: true, CapacityBytes: c, Mounted: r.mountedBy(id) != ""})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VolumeID < out[j].VolumeID })
	return out
}

// PutVolume makes an image exist (a node restarted with it on disk).
func (r *Runtime) PutVolume(id string, capacity uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.volumes[id] = capacity
}

// Mount returns the Volume the workspace's running execution mounts.
func (r *Runtime) Mount(id string) (agent.VolumeMount, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.mounts[id]
	return m, ok
}

// Status reports one workspace.
func (r *Runtime) Status(id string) agent.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.execs[id]; s != nil {
		return r.withNetwork(*s)
	}
	return agent.Status{WorkspaceID: id}
}

// withNetwork adds the network status of a running execution; r.mu held.
func (r *Runtime) withNetwork(st agent.Status) agent.Status {
	if !st.Running {
		return st
	}
	nc := r.networks[st.WorkspaceID]
	ns := &nodev1.NetworkStatus{AppliedRevision: nc.GetPolicy().GetRevision(), DnsConfigVersion: nodewire.DNSConfigVersion}
	for _, e := range nc.GetEgresses() {
		ns.Egresses = append(ns.Egresses, &ctrlv1.EgressStatus{EgressId: e.GetEgressId(), AppliedRevision: e.GetRevision()})
	}
	st.Network = ns
	return st
}

// ApplyNetwork makes nc the network of a running execution, unless
// FailNetwork says otherwise; NetworkGate holds it.
func (r *Runtime) ApplyNetwork(ctx context.Context, id string, nc *nodev1.NetworkConfig) (*nodev1.NetworkStatus, error) {
	r.mu.Lock()
	gate := r.NetworkGate
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.execs[id]
	if s == nil || !s.Running {
		return nil, agent.ErrNotRunning
	}
	if err := r.FailNetwork[id]; err != nil {
		return r.withNetwork(*s).Network, err
	}
	r.networks[id] = nc
	return r.withNetwork(*s).Network, nil
}

// Network returns the network configuration the workspace's execution
// applies (nil: none, or mode NONE from the start).
func (r *Runtime) Network(id string) *nodev1.NetworkConfig {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.networks[id]
}

// CloseEgress records the call.
func (r *Runtime) CloseEgress(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ClosedEgresses = append(r.ClosedEgresses, id)
}

// Executions lists running executions.
func (r *Runtime) Executions() []agent.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []agent.Status
	for _, s := range r.execs {
		if s.Running {
			out = append(out, r.withNetwork(*s))
		}
	}
	return out
}

// Events delivers injected events.
func (r *Runtime) Events() <-chan agent.Event { return r.events }

// GuestExits simulates a guest powering itself off.
func (r *Runtime) GuestExits(id string) {
	r.mu.Lock()
	st := r.get(id)
	st.Running, st.Guest = false, 0
	delete(r.mounts, id)
	r.mu.Unlock()
	r.events <- agent.Event{WorkspaceID: id, Exited: true}
}

// GuestSays simulates the guest of a running execution reporting a
// condition with a message of its choosing (of any length: the runtime
// hands the agent what the guest said).
func (r *Runtime) GuestSays(id string, cond ctrlv1.GuestCondition, msg string) {
	r.mu.Lock()
	st := r.get(id)
	st.Guest, st.GuestMessage = cond, msg
	r.mu.Unlock()
	r.events <- agent.Event{WorkspaceID: id, Guest: cond, GuestMessage: msg}
}

// Running reports whether the workspace's execution runs.
func (r *Runtime) Running(id string) bool { return r.Status(id).Running }

// GuestTransport returns a transport to r.Guest and r.GuestServices,
// served over h2c on a loopback listener (closed by Close), for a running
// workspace: what agent.NewDataHandler forwards to.
func (r *Runtime) GuestTransport(id string) (http.RoundTripper, error) {
	if !r.Running(id) {
		return nil, agent.ErrNotRunning
	}
	if r.Guest == nil && r.GuestServices == nil {
		return nil, errors.New("agenttest: no Guest")
	}
	r.guestOnce.Do(func() {
		mux := http.NewServeMux()
		if r.Guest != nil {
			mux.Handle(guestv1connect.NewProcessServiceHandler(r.Guest))
		}
		for prefix, h := range r.GuestServices {
			mux.Handle(prefix, h)
		}
		r.guestSrv = httptest.NewServer(h2c.NewHandler(mux, &http2.Server{}))
		r.guestHTTP = &http.Client{Transport: &http2.Transport{AllowHTTP: true,
			DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, r.guestSrv.Listener.Addr().String())
			}}}
	})
	return r.guestHTTP.Transport, nil
}

// Close stops the Guest's server.
func (r *Runtime) Close() {
	if r.guestSrv != nil {
		r.guestSrv.Close()
	}
}

// OpenLog opens a workspace's log in LogDir: agent.ErrNoLog without one.
func (r *Runtime) OpenLog(id string) (rotated, current *os.File, err error) {
	if r.LogDir == "" || strings.ContainsAny(id, "/\x00") || id == "" || id == "." || id == ".." {
		return nil, nil, agent.ErrNoLog
	}
	p := filepath.Join(r.LogDir, id+".log")
	if f, err := os.Open(p + ".1"); err == nil {
		rotated = f
	}
	if f, err := os.Open(p); err == nil {
		current = f
	}
	if rotated == nil && current == nil {
		return nil, nil, agent.ErrNoLog
	}
	return rotated, current, nil
}

var _ agent.VolumeRuntime = (*Runtime)(nil)
