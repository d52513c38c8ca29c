// Package agent is the node agent: it holds one stream to ctrl
// (NodeService/Connect), receives the desired state of the node's
// Workspaces, drives the runtime towards it and reports what it observes.
//
// Every action is idempotent (start what should run and does not, stop what
// should not run, delete what should be gone), so the agent keeps no state
// of its own: after a restart it re-adopts the executions the runtime left
// running, receives the full desired state again and converges.
//
// What the runtime reports about a guest is the guest's to choose: every
// text of a report is cut to its bound (bounds.go) before it goes on the
// wire, and every stream message is bounded both ways.
package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/node/ctrlset"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// Spec is what the runtime needs to start an execution.
type Spec struct {
	WorkspaceID   string
	Generation    uint64
	TemplateID    string
	CapacityBytes uint64
	MemoryMiB     uint32
	CPUMillis     uint32
	// Network is the network the execution has from its start (nil: mode
	// NONE, loopback only).
	Network *nodev1.NetworkConfig
	// Volume is the Volume the execution mounts from its start (nil:
	// none); its image is on this node (VolumeRuntime).
	Volume *VolumeMount
	// TemplateVersion is the published Template version the workspace
	// runs from ("": the node's own version of TemplateID), and
	// TemplateSource where to fetch it when the node lacks it.
	TemplateVersion string
	TemplateSource  *nodev1.ArtifactSource
}

// VolumeMount is a Volume an execution mounts, and where (an absolute,
// clean path inside the workspace, resolved inside its root only).
type VolumeMount struct {
	VolumeID  string
	MountPath string
}

// Status is one execution or writable layer the runtime holds.
type Status struct {
	WorkspaceID string
	Generation  uint64
	Running     bool
	LayerExists bool
	// LayerCapacityBytes is the writable layer's size when it exists.
	LayerCapacityBytes uint64
	Guest              ctrlv1.GuestCondition
	GuestMessage       string
	// Network is what the execution's network applies (with the DNS
	// configuration version it started with); nil without execution or
	// when the runtime serves no networks.
	Network *nodev1.NetworkStatus
}

// Event is something the runtime observed on its own.
type Event struct {
	WorkspaceID string
	// Exited is set when the execution ended without being asked (the guest
	// powered itself off).
	Exited       bool
	Guest        ctrlv1.GuestCondition
	GuestMessage string
}

// ErrWritebackFailed is returned by Runtime.Stop when the guest could not
// confirm writeback: the execution is still running and held.
var ErrWritebackFailed = errors.New("guest could not confirm writeback")

// ErrPermanent marks a Runtime.Start error that no retry of the same desired
// state can fix (a malformed spec, a template the node cannot use). Test
// with errors.Is; Runtime implementations mark such errors with Permanent.
var ErrPermanent = errors.New("retrying the same start cannot succeed")

// Permanent marks err as permanent (errors.Is(err, ErrPermanent)) without
// changing its message. It returns nil for nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

type permanentError struct{ err error }

func (e permanentError) Error() string        { return e.err.Error() }
func (e permanentError) Unwrap() error        { return e.err }
func (e permanentError) Is(target error) bool { return target == ErrPermanent }

// Runtime runs executions. internal/node/sandbox implements it.
type Runtime interface {
	Start(ctx context.Context, s Spec) error
	Stop(ctx context.Context, workspaceID string, force bool) error
	Delete(ctx context.Context, workspaceID string) error
	Status(workspaceID string) Status
	Executions() []Status
	Events() <-chan Event
	// ApplyNetwork makes nc the network of the workspace's running
	// execution (nil: mode NONE) and returns what it then applies; on
	// error the previous configuration stays, and the status says which
	// (nil when unknown).
	ApplyNetwork(ctx context.Context, workspaceID string, nc *nodev1.NetworkConfig) (*nodev1.NetworkStatus, error)
	// CloseEgress ends at once every connection through the Egress, in
	// every execution (it was deleted).
	CloseEgress(egressID string)
	// Resize grows the workspace's writable layer, which exists, to
	// capacityBytes in place, keeping every byte; only without execution.
	// Errors no retry can fix (a pool that cannot hold it) are Permanent.
	Resize(ctx context.Context, workspaceID string, capacityBytes uint64) error
}

// Artifacts is implemented by a Runtime that holds published artifacts
// (nodewire.FeatureArtifacts): the agent hands it what DesiredState says
// of them, without waiting (a fetch takes its time).
type Artifacts interface {
	// Reclaim deletes the artifact versions of these digests that the
	// node holds, once no execution uses them.
	Reclaim(digests []string)
	// SetPlatform makes p the Platform new executions boot with; nil is
	// the node's own guest.
	SetPlatform(p *nodev1.DesiredPlatform)
	// Platforms lists the Platform versions the node holds (Hello).
	Platforms() []*nodev1.TemplateInfo
}

// InventoryNotifier is implemented by a Runtime that tells when the
// templates or platforms it holds change while the node runs (a version
// installed or reclaimed, a platform verified or dropped): the agent then
// sends ctrl an Inventory with the complete lists, as Hello has them.
type InventoryNotifier interface {
	// OnInventoryChange makes the runtime call f after each such change;
	// f does not block.
	OnInventoryChange(f func())
}

// inventoryDelay is how long the agent waits after a change of what the
// node holds before it sends the Inventory: the changes of a burst (a
// reclamation of many versions) go in one.
const inventoryDelay = 200 * time.Millisecond

// Config configures an Agent.
type Config struct {
	NodeID   string
	Endpoint string       // ctrl's URL, when Ctrl is nil
	HTTP     *http.Client // presents the node certificate, when Ctrl is nil
	// Ctrl is the ctrl endpoints (several URLs, names resolving to
	// several addresses); nil is Endpoint reached through HTTP.
	Ctrl     *ctrlset.Set
	Runtime  Runtime
	Capacity *nodev1.Capacity
	// Templates lists the templates the node holds, read at every (re)connect.
	Templates func() []*nodev1.TemplateInfo
	Log       *slog.Logger
	// Heartbeat is the interval of heartbeats; zero is 5 seconds.
	Heartbeat time.Duration
	// DataTLS presents the node certificate on the data tunnels; nil takes
	// the TLS config of HTTP's transport (an *http2.Transport or
	// *http.Transport), and without one no tunnel is opened.
	DataTLS *tls.Config
	// DataTunnels is how many data tunnels the node keeps open to each
	// ctrl endpoint; zero is one, at most MaxDataTunnels.
	DataTunnels int
	// Features are the optional parts the node serves, advertised in
	// Hello.features (nodewire.FeatureNetwork when the runtime runs
	// networks).
	Features []string
	// Memory, when set, samples the node's memory condition into every
	// heartbeat (internal/node/memwatch); nil sends none.
	Memory func() *nodev1.MemoryCondition
}

// Agent is a running node agent.
type Agent struct {
	cfg  Config
	ctrl *ctrlset.Set

	reports *outbox

	mu      sync.Mutex
	desired map[string]*nodev1.DesiredWorkspace
	busy    map[string]bool // a worker runs for the workspace
	dirty   map[string]bool // desired changed while the worker ran

	// The Volumes (volumes.go), under mu like the workspaces.
	vols volumeWork

	// inventory holds a signal when what the node holds changed since
	// the last Hello or Inventory.
	inventory chan struct{}

	// accepted is when ctrl last accepted a Hello (its full desired state
	// arrived), in Unix nanoseconds: Run's back-off starts again from its
	// minimum after a stream that was accepted and lasted acceptedReset.
	accepted atomic.Int64
}

// New returns an Agent.
func New(cfg Config) *Agent {
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 5 * time.Second
	}
	ctrl := cfg.Ctrl
	if ctrl == nil {
		ctrl = ctrlset.Static(cfg.Endpoint, cfg.HTTP)
	}
	a := &Agent{
		cfg:       cfg,
		ctrl:      ctrl,
		reports:   newOutbox(),
		desired:   map[string]*nodev1.DesiredWorkspace{},
		busy:      map[string]bool{},
		dirty:     map[string]bool{},
		vols:      newVolumeWork(),
		inventory: make(chan struct{}, 1),
	}
	if n, ok := cfg.Runtime.(InventoryNotifier); ok {
		n.OnInventoryChange(a.InventoryChanged)
	}
	return a
}

// InventoryChanged tells the agent that the templates or platforms the
// node holds changed: while a stream is up it sends ctrl an Inventory
// (after inventoryDelay, one for a burst); without one the next Hello
// lists them. It never blocks.
func (a *Agent) InventoryChanged() {
	select {
	case a.inventory <- struct{}{}:
	default:
	}
}

// holdings lists the templates and platforms the node holds, for Hello
// and Inventory alike.
func (a *Agent) holdings() (templates, platforms []*nodev1.TemplateInfo) {
	if a.cfg.Templates != nil {
		templates = a.cfg.Templates()
	}
	if art, ok := a.cfg.Runtime.(Artifacts); ok {
		platforms = art.Platforms()
	}
	return templates, platforms
}

// Reconnect bounds the wait before the next connect after a stream ended:
// drawn in [d/2, d] (ctrlset.Backoff), d from ReconnectMin doubling with
// each failure in a row up to ReconnectMax. A stream ctrl accepted and
// that stayed open acceptedReset or more is not a failure: the wait after
// it starts again from ReconnectMin, so that a node whose replicas die a
// few seconds apart reconnects as fast after each death as after the
// first, while a replica that accepts and drops streams at once still
// meets a doubling wait.
const (
	ReconnectMin  = 100 * time.Millisecond
	ReconnectMax  = 3 * time.Second
	acceptedReset = time.Second
)

// Run keeps a stream to ctrl open until ctx is done. When it ends (ctrl
// died, or refused it), the agent connects to the next endpoint of Ctrl
// after a back-off with jitter and sends Hello with its full state, as at
// every connect; the executions keep running meanwhile.
//
// Beside the stream it keeps DataTunnels data tunnels (internal/tunnel)
// open to every endpoint of Ctrl (keepTunnels), on which ctrl reaches the
// node's data service (NewDataHandler, when the Runtime implements
// Guests): bytes of the data plane never travel on the control stream,
// and every ctrl replica reaches the node, whichever holds its stream.
func (a *Agent) Run(ctx context.Context) error {
	go a.watchEvents(ctx)
	if tlsc := a.dataTLS(); tlsc != nil {
		var h http.Handler = http.NotFoundHandler()
		if p, ok := a.cfg.Runtime.(Guests); ok {
			h = NewDataHandler(p)
		}
		go a.keepTunnels(ctx, tlsc, h)
	}
	backoff := ctrlset.Backoff{Min: ReconnectMin, Max: ReconnectMax}
	// The first connect goes to the endpoint chosen first (the tunnels
	// may have chosen it already), every other to the next one.
	pick := a.ctrl.Current
	for ctx.Err() == nil {
		start := time.Now()
		ep, err := pick(ctx)
		if err == nil {
			pick = a.ctrl.Next
			err = a.sessionTo(ctx, ep)
		}
		if ctx.Err() != nil {
			return nil
		}
		a.cfg.Log.Warn("ctrl stream ended", "error", errString(err))
		if at := a.accepted.Load(); at >= start.UnixNano() && time.Since(time.Unix(0, at)) >= acceptedReset {
			backoff.Reset()
		}
		backoff.Wait(ctx)
	}
	return nil
}

// dataTLS returns the TLS config of the data tunnels, or nil.
func (a *Agent) dataTLS() *tls.Config {
	if a.cfg.DataTLS != nil {
		return a.cfg.DataTLS
	}
	return a.ctrl.TLS()
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// session runs one stream to the endpoint in use.
func (a *Agent) session(ctx context.Context) error {
	ep, err := a.ctrl.Current(ctx)
	if err != nil {
		return err
	}
	return a.sessionTo(ctx, ep)
}

// sessionTo runs one stream to ep: Hello with the node's full state, then
// reports and heartbeats, until it fails or ctx is done.
func (a *Agent) sessionTo(parent context.Context, ep ctrlset.Endpoint) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	a.cfg.Log.Info("connecting to ctrl", "url", ep.URL, "addr", ep.Addr)
	stream := nodev1connect.NewNodeServiceClient(a.ctrl.Client(ep), ep.URL,
		connect.WithReadMaxBytes(nodewire.MaxMessageBytes), connect.WithSendMaxBytes(nodewire.MaxMessageBytes)).Connect(ctx)
	hello := &nodev1.Hello{NodeId: a.cfg.NodeID, Capacity: a.cfg.Capacity, Features: a.cfg.Features,
		GuestProtocolVersion: nodewire.GuestProtocolVersion}
	// The Hello lists what the node holds now: a change signalled before
	// is in it.
	select {
	case <-a.inventory:
	default:
	}
	hello.Templates, hello.Platforms = a.holdings()
	for _, st := range a.cfg.Runtime.Executions() {
		hello.Executions = append(hello.Executions, a.statusReport(st, st.Generation))
	}
	hello.Volumes = a.heldVolumes()
	if err := stream.Send(&nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Hello{Hello: hello}}); err != nil {
		return err
	}
	errc := make(chan error, 2)
	go func() {
		for first := true; ; first = false {
			msg, err := stream.Receive()
			if err != nil {
				errc <- err
				return
			}
			if first {
				// ctrl accepted the Hello: its full desired state is here.
				a.accepted.Store(time.Now().UnixNano())
				a.cfg.Log.Info("ctrl stream open", "url", ep.URL, "addr", ep.Addr)
			}
			a.apply(parent, msg.GetDesired())
		}
	}()
	hb := time.NewTicker(a.cfg.Heartbeat)
	defer hb.Stop()
	var invDue <-chan time.Time // an Inventory is to be sent then
	for {
		var msg *nodev1.ConnectRequest
		select {
		case <-a.inventory:
			if invDue == nil {
				invDue = time.After(inventoryDelay)
			}
			continue
		case <-invDue:
			invDue = nil
			inv := &nodev1.Inventory{}
			inv.Templates, inv.Platforms = a.holdings()
			msg = &nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Inventory{Inventory: inv}}
		case <-ctx.Done():
			_ = stream.CloseRequest()
			return ctx.Err()
		case err := <-errc:
			return err
		case <-a.reports.ready:
			rep, ok := a.reports.take()
			if !ok {
				continue
			}
			msg = rep
		case <-hb.C:
			beat := &nodev1.Heartbeat{SentAt: timestamppb.Now()}
			if a.cfg.Memory != nil {
				beat.Memory = a.cfg.Memory()
			}
			msg = &nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Heartbeat{Heartbeat: beat}}
		}
		if err := stream.Send(msg); err != nil {
			if msg.GetReport() != nil || msg.GetVolumeReport() != nil {
				a.reports.putBack(msg)
			}
			return err
		}
	}
}

// apply records desired state and wakes the workers.
func (a *Agent) apply(ctx context.Context, d *nodev1.DesiredState) {
	if d == nil {
		return
	}
	// Deleted Egresses: their draining connections end now, everywhere.
	for _, id := range d.GetDeletedEgressIds() {
		a.cfg.Runtime.CloseEgress(id)
	}
	if art, ok := a.cfg.Runtime.(Artifacts); ok {
		// The platform is sent with the full state and when it changes:
		// a full state without one means the node's own guest.
		if d.GetPlatform() != nil || d.GetFull() {
			art.SetPlatform(d.GetPlatform())
		}
		if len(d.GetReclaimedDigests()) > 0 {
			art.Reclaim(d.GetReclaimedDigests())
		}
	}
	a.mu.Lock()
	listed := map[string]bool{}
	for _, w := range d.GetWorkspaces() {
		listed[w.GetWorkspaceId()] = true
		if cur := a.desired[w.GetWorkspaceId()]; cur == nil || w.GetGeneration() >= cur.GetGeneration() {
			a.desired[w.GetWorkspaceId()] = w
		}
	}
	var orphans []string
	if d.GetFull() {
		for _, st := range a.cfg.Runtime.Executions() {
			if st.Running && !listed[st.WorkspaceID] {
				orphans = append(orphans, st.WorkspaceID)
			}
		}
	}
	a.mu.Unlock()
	// Volumes first: a workspace worker that starts with a Volume waits
	// for that Volume's worker (awaitVolume), which must be known as busy
	// by then.
	a.applyVolumes(ctx, d)
	for id := range listed {
		a.wake(ctx, id)
	}
	for _, id := range orphans {
		// ctrl does not know this execution: release it, keep its layer.
		a.cfg.Log.Warn("stopping an execution ctrl does not know", "workspace_id", id)
		go func() { _ = a.cfg.Runtime.Stop(ctx, id, true) }()
	}
}

// wake runs the workspace's worker, or marks it dirty if it runs.
func (a *Agent) wake(ctx context.Context, id string) {
	a.mu.Lock()
	if a.busy[id] {
		a.dirty[id] = true
		a.mu.Unlock()
		return
	}
	a.busy[id] = true
	a.mu.Unlock()
	go func() {
		for {
			a.mu.Lock()
			d := a.desired[id]
			a.dirty[id] = false
			a.mu.Unlock()
			a.act(ctx, d)
			a.mu.Lock()
			if !a.dirty[id] || ctx.Err() != nil {
				a.busy[id] = false
				if d.GetPower() == nodev1.Power_POWER_DELETED && a.desired[id] == d {
					delete(a.desired, id)
				}
				a.mu.Unlock()
				return
			}
			a.mu.Unlock()
		}
	}()
}

// act drives one workspace to its desired state and reports the result.
func (a *Agent) act(ctx context.Context, d *nodev1.DesiredWorkspace) {
	id, gen := d.GetWorkspaceId(), d.GetGeneration()
	rt := a.cfg.Runtime
	log := a.cfg.Log.With("workspace_id", id, "generation", gen)
	switch d.GetPower() {
	case nodev1.Power_POWER_RUNNING:
		if st := rt.Status(id); st.Running {
			// The desired network (a new policy or Egress revision) is
			// applied before the report that carries its status.
			a.report(a.runningReport(ctx, d))
			return
		}
		a.report(&nodev1.ExecutionReport{WorkspaceId: id, Generation: gen, State: nodev1.ExecState_EXEC_STATE_STARTING, ObservedAt: timestamppb.Now()})
		if v := d.GetVolume(); v != nil {
			a.awaitVolume(ctx, v.GetVolumeId())
		}
		spec := Spec{WorkspaceID: id, Generation: gen, TemplateID: d.GetTemplateId(),
			CapacityBytes: d.GetCapacityBytes(), MemoryMiB: d.GetMemoryMib(), CPUMillis: d.GetCpuMillis(),
			Network: d.GetNetwork(), TemplateVersion: d.GetTemplateVersion(), TemplateSource: d.GetTemplateSource()}
		if v := d.GetVolume(); v != nil {
			spec.Volume = &VolumeMount{VolumeID: v.GetVolumeId(), MountPath: v.GetMountPath()}
		}
		// A layer resized while the node was not told (a start follows
		// the resize at once) grows before the start.
		err := a.growLayer(ctx, d)
		if err == nil {
			err = rt.Start(ctx, spec)
		}
		if err != nil {
			// A permanent failure (errors.Is ErrPermanent) is reported as
			// such: ctrl then calls it not retryable.
			log.Warn("start failed", "error", failureMessage(err), "permanent", errors.Is(err, ErrPermanent))
			a.report(failedReport(rt.Status(id), gen, "EXECUTION_FAILED", err))
			return
		}
		st := rt.Status(id)
		if st.Running && st.Network != nil && st.Network.GetAppliedRevision() != d.GetNetwork().GetPolicy().GetRevision() {
			// Start found the execution running already (re-adopted
			// meanwhile): it holds another network, or none yet.
			a.report(a.runningReport(ctx, d))
			return
		}
		a.report(a.statusReport(st, gen))
	case nodev1.Power_POWER_STOPPED:
		err := rt.Stop(ctx, id, d.GetForce())
		st := rt.Status(id)
		switch {
		case err == nil && !st.Running:
			// Stopped: a layer smaller than desired grows now
			// (ResizeWorkspaceWritableLayer), before the report.
			if err := a.growLayer(ctx, d); err != nil {
				log.Warn("writable layer resize failed", "capacity_bytes", d.GetCapacityBytes(), "error", failureMessage(err),
					"permanent", errors.Is(err, ErrPermanent))
				a.report(failedReport(rt.Status(id), gen, "EXECUTION_FAILED", err))
				return
			}
			a.report(a.statusReport(rt.Status(id), gen))
		case errors.Is(err, ErrWritebackFailed):
			rep := failedReport(st, gen, "GUEST_WRITEBACK_FAILED", err)
			rep.HoldsExecution, rep.Permanent = true, false
			a.report(rep)
		default:
			log.Warn("stop failed", "error", failureMessage(err))
			rep := failedReport(st, gen, "EXECUTION_FAILED", err)
			rep.Permanent = false
			a.report(rep)
		}
	case nodev1.Power_POWER_DELETED:
		if err := rt.Delete(ctx, id); err != nil {
			log.Warn("delete failed", "error", failureMessage(err))
			rep := failedReport(rt.Status(id), gen, "EXECUTION_FAILED", err)
			rep.Permanent = false
			a.report(rep)
			return
		}
		a.report(&nodev1.ExecutionReport{WorkspaceId: id, Generation: gen, State: nodev1.ExecState_EXEC_STATE_DELETED, ObservedAt: timestamppb.Now()})
	}
}

// growLayer grows the workspace's writable layer to d's capacity when it
// exists, holds no execution and is smaller (the layer's resize happens on
// the node while the workspace is stopped); nil when there is nothing to
// grow.
func (a *Agent) growLayer(ctx context.Context, d *nodev1.DesiredWorkspace) error {
	st := a.cfg.Runtime.Status(d.GetWorkspaceId())
	if !st.LayerExists || st.Running || d.GetCapacityBytes() <= st.LayerCapacityBytes {
		return nil
	}
	err := a.cfg.Runtime.Resize(ctx, d.GetWorkspaceId(), d.GetCapacityBytes())
	if err == nil {
		a.cfg.Log.Info("writable layer grown", "workspace_id", d.GetWorkspaceId(), "from_bytes", st.LayerCapacityBytes,
			"capacity_bytes", d.GetCapacityBytes())
	}
	return err
}

// failedReport is a FAILED report of generation gen about st, with its
// reason and the cut message of err; permanent when err is.
func failedReport(st Status, gen uint64, reason string, err error) *nodev1.ExecutionReport {
	rep := &nodev1.ExecutionReport{WorkspaceId: st.WorkspaceID, Generation: gen, State: nodev1.ExecState_EXEC_STATE_FAILED,
		HoldsExecution: st.Running, LayerExists: st.LayerExists, FailureReason: reason,
		FailureMessage: failureMessage(err), Permanent: errors.Is(err, ErrPermanent), ObservedAt: timestamppb.Now()}
	if st.LayerExists {
		rep.LayerCapacityBytes = st.LayerCapacityBytes
	}
	return rep
}

// runningReport applies d's network to the workspace's running execution
// and reports it: the status the network then applies, or, when applying
// failed, the one still in effect marked failed with why.
func (a *Agent) runningReport(ctx context.Context, d *nodev1.DesiredWorkspace) *nodev1.ExecutionReport {
	id, gen := d.GetWorkspaceId(), d.GetGeneration()
	nst, err := a.cfg.Runtime.ApplyNetwork(ctx, id, d.GetNetwork())
	st := a.cfg.Runtime.Status(id)
	rep := a.statusReport(st, gen)
	if err != nil && st.Running {
		a.cfg.Log.Warn("network configuration not applied", "workspace_id", id, "generation", gen,
			"revision", d.GetNetwork().GetPolicy().GetRevision(), "error", failureMessage(err))
		failed := &nodev1.NetworkStatus{}
		if nst != nil {
			failed = proto.Clone(nst).(*nodev1.NetworkStatus)
		}
		failed.Failed = true
		failed.Message = nodewire.Cut(errString(err), nodewire.MaxNetworkMessageBytes)
		rep.Network = failed
	}
	return rep
}

func (a *Agent) statusReport(st Status, gen uint64) *nodev1.ExecutionReport {
	rep := &nodev1.ExecutionReport{WorkspaceId: st.WorkspaceID, Generation: gen, LayerExists: st.LayerExists,
		HoldsExecution: st.Running, GuestCondition: int32(st.Guest), GuestMessage: nodewire.Cut(st.GuestMessage, nodewire.MaxGuestMessageBytes),
		ObservedAt: timestamppb.Now()}
	if st.LayerExists {
		rep.LayerCapacityBytes = st.LayerCapacityBytes
	}
	if st.Running && st.Network != nil {
		rep.Network = proto.Clone(st.Network).(*nodev1.NetworkStatus)
		rep.Network.Message = nodewire.Cut(rep.Network.GetMessage(), nodewire.MaxNetworkMessageBytes)
	}
	switch {
	case st.Running && st.Guest == ctrlv1.GuestCondition_GUEST_CONDITION_BOOTING:
		rep.State = nodev1.ExecState_EXEC_STATE_STARTING
	case st.Running:
		rep.State = nodev1.ExecState_EXEC_STATE_RUNNING
	default:
		rep.State = nodev1.ExecState_EXEC_STATE_STOPPED
	}
	return rep
}

func (a *Agent) report(rep *nodev1.ExecutionReport) { a.reports.put(rep) }

// watchEvents turns runtime events into reports for the current desired
// generation.
func (a *Agent) watchEvents(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-a.cfg.Runtime.Events():
			if !ok {
				return
			}
			a.mu.Lock()
			d := a.desired[ev.WorkspaceID]
			a.mu.Unlock()
			if d == nil {
				continue
			}
			st := a.cfg.Runtime.Status(ev.WorkspaceID)
			rep := a.statusReport(st, d.GetGeneration())
			if ev.Exited {
				rep.GuestExited = true
				rep.State = nodev1.ExecState_EXEC_STATE_STOPPED
			} else if ev.Guest != 0 {
				rep.GuestCondition, rep.GuestMessage = int32(ev.Guest), nodewire.Cut(ev.GuestMessage, nodewire.MaxGuestMessageBytes)
			}
			a.report(rep)
		}
	}
}
