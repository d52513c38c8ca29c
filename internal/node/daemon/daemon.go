// Package daemon wires a node: the sandbox runtime (re-adopting what a
// previous agent left running), the templates, and the agent that talks to
// ctrl. kibotos-node runs it as its own process; kibotos-ctrl --dev runs the
// same code in-process, talking to itself over loopback mTLS.
package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/artifact"
	"github.com/kibotos/kibotos/internal/node/ctrlset"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/node/template"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// Config configures a node.
type Config struct {
	NodeID   string
	Endpoint string       // ctrl's URL, when Ctrl is nil
	HTTP     *http.Client // presents the node certificate; no overall timeout; when Ctrl is nil
	// Ctrl is the ctrl endpoints (kibotos-node --ctrl): the stream,
	// renewals and artifact fetches go to the one in use, the data tunnels
	// to every one.
	// nil is Endpoint through HTTP (ctrl --dev's node).
	Ctrl *ctrlset.Set
	// StateDir holds layers, execution state and templates.
	StateDir string
	// GuestBinary is the static kibotos-guest.
	GuestBinary string
	// Busybox is the static busybox the default template is built from;
	// empty: where Debian's busybox-static installs it.
	Busybox string
	// Capacity offered to workspaces; zero values are measured: 80% of
	// MemTotal, every CPU, the free space of StateDir.
	MemoryMiB, CPUMillis, StorageBytes uint64
	// MemoryBudgetMiB is the host memory budget the node judges its
	// memory condition against (memwatch); zero is MemoryMiB as measured.
	// MemoryOvercommitRatio (1 to MaxOvercommitRatio, zero: not given)
	// is reported to ctrl (Capacity.memory_overcommit_ratio), which
	// applies it when the node has no ratio of its own set through the
	// Operator API; Capacity.memory_mib stays MemoryMiB.
	MemoryBudgetMiB       uint64
	MemoryOvercommitRatio float64
	// IO caps each workspace's IO on its writable layer; nil is
	// sandbox.DefaultIOLimits.
	IO  *sandbox.IOLimits
	Log *slog.Logger
	// AllowEndpointRanges is the operator allow-list of special-purpose
	// ranges workspaces may reach directly and Egress and Resolver
	// endpoints may be in (netguard.ParseAllowList); the kernel backstop
	// lets marked packets into them too.
	AllowEndpointRanges []netip.Prefix
	// Resolver is the DNS server the node resolves Egress and Resolver
	// host names with; invalid (zero) is the system's resolver.
	Resolver netip.AddrPort
}

// Run runs the node until ctx is done. Executions keep running when it
// returns; the next Run re-adopts them. It first runs Preflight and checks
// the templates, so that a node that could not run workspaces from them
// fails here instead of reporting ready, and installs the kernel backstop of
// workspace networks (network.go), the node's own table, which stays when
// the node ends.
func Run(ctx context.Context, cfg Config) error {
	cfg, err := Preflight(cfg)
	if err != nil {
		return err
	}
	tmplDir := filepath.Join(cfg.StateDir, "templates")
	rootfs, err := template.EnsureDefault(tmplDir, cfg.GuestBinary, cfg.Busybox)
	if err != nil {
		return err
	}
	if err := sandbox.CheckTemplateDir(rootfs); err != nil {
		return fmt.Errorf("default template: %w", err)
	}
	backstop, err := installBackstop(cfg)
	if err != nil {
		return err
	}
	capacity, err := measure(cfg)
	if err != nil {
		return err
	}
	// The storage pool bounds the layers and Volumes together (their
	// capacities); the sandbox refuses what it cannot hold.
	rt, err := sandbox.New(sandbox.Config{Root: cfg.StateDir, GuestBinary: cfg.GuestBinary, IO: cfg.IO, Log: cfg.Log,
		Network: networking(cfg, backstop.Mark), StorageBytes: capacity.GetStorageBytes()})
	if err != nil {
		return err
	}
	defer rt.Close()
	if err := rt.Adopt(ctx); err != nil {
		return fmt.Errorf("re-adopt executions: %w", err)
	}
	memory, budget, err := memoryWatch(cfg, rt, capacity.GetMemoryMib())
	if err != nil {
		return err
	}
	templates := func() []*nodev1.TemplateInfo { return heldTemplates(tmplDir, cfg.Log) }
	cfg.Log.Info("node ready", "node_id", cfg.NodeID, "memory_mib", capacity.GetMemoryMib(), "memory_budget_mib", budget, "cpu_millis", capacity.GetCpuMillis(),
		"executions", len(rt.Executions()), "cgroup_version", rt.CgroupVersion(), "templates", len(templates()))
	if cfg.Ctrl == nil {
		cfg.Ctrl = ctrlset.Static(cfg.Endpoint, cfg.HTTP)
	}
	// Published artifacts come from the ctrl the stream uses.
	store, err := artifact.New(artifact.Config{Dir: filepath.Join(cfg.StateDir, "artifacts"),
		Client: cfg.Ctrl.NodeService(func(hc connect.HTTPClient, url string) nodev1connect.NodeServiceClient {
			return artifact.NewClient(hc, url,
				connect.WithReadMaxBytes(nodewire.MaxMessageBytes), connect.WithSendMaxBytes(nodewire.MaxMessageBytes))
		})})
	if err != nil {
		return err
	}
	nodeRT := NewRuntime(rt, tmplDir)
	nodeRT.UseArtifacts(ctx, store, cfg.Log)
	a := agent.New(agent.Config{
		NodeID: cfg.NodeID, Ctrl: cfg.Ctrl, Log: cfg.Log, Capacity: capacity,
		Runtime: nodeRT, Templates: templates, Memory: memory,
		Features: []string{nodewire.FeatureNetwork, nodewire.FeatureVolumes, nodewire.FeatureArtifacts},
	})
	return a.Run(ctx)
}

// heldTemplates is Hello.templates: every published version the node holds
// (with its digest), and the version of each other template (the default
// one) it starts new executions from.
func heldTemplates(dir string, log *slog.Logger) []*nodev1.TemplateInfo {
	list, err := usableTemplates(dir)
	if err != nil {
		log.Warn("list templates", "error", err.Error())
	}
	var out []*nodev1.TemplateInfo
	for _, t := range list {
		if t.Digest == "" {
			out = append(out, &nodev1.TemplateInfo{TemplateId: t.Name, Version: t.Version})
		}
	}
	published, err := template.Published(dir)
	if err != nil {
		log.Warn("list published templates", "error", err.Error())
	}
	for _, t := range published {
		if sandbox.CheckTemplateDir(t.Rootfs) == nil {
			out = append(out, &nodev1.TemplateInfo{TemplateId: t.Name, Version: t.Version, Digest: t.Digest})
		}
	}
	return out
}

// usableTemplates lists the templates under dir that the runtime can start
// executions from; the others are left out (with an error naming them), so
// that ctrl never places a workspace on a template no start could use.
func usableTemplates(dir string) ([]template.Info, error) {
	list, err := template.List(dir)
	var out []template.Info
	var errs []error
	for _, t := range list {
		if cerr := sandbox.CheckTemplateDir(t.Rootfs); cerr != nil {
			errs = append(errs, fmt.Errorf("template %s/%s left out: %w", t.Name, t.Version, cerr))
			continue
		}
		out = append(out, t)
	}
	return out, errors.Join(append([]error{err}, errs...)...)
}

func measure(cfg Config) (*nodev1.Capacity, error) {
	// memory_mib is the memory offered, never multiplied by the ratio:
	// ctrl applies overcommit (the node's ratio is only reported).
	c := &nodev1.Capacity{MemoryMib: cfg.MemoryMiB, CpuMillis: cfg.CPUMillis, StorageBytes: cfg.StorageBytes, StoragePool: "default",
		MemoryOvercommitRatio: cfg.MemoryOvercommitRatio}
	if c.MemoryMib == 0 {
		total, err := memTotalMiB()
		if err != nil {
			return nil, err
		}
		c.MemoryMib = total * 8 / 10
	}
	if c.CpuMillis == 0 {
		c.CpuMillis = uint64(runtime.NumCPU()) * 1000
	}
	if c.StorageBytes == 0 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(cfg.StateDir, &st); err != nil {
			return nil, err
		}
		c.StorageBytes = st.Bavail * uint64(st.Bsize)
	}
	return c, nil
}

func memTotalMiB() (uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb / 1024, err
		}
	}
	return 0, errors.New("MemTotal missing from /proc/meminfo")
}

// Runtime adapts the sandbox runtime to the agent.
type Runtime struct {
	rt        *sandbox.Runtime
	templates string
	events    chan agent.Event
	art       *artifacts
	// notify is what OnInventoryChange set.
	notify atomic.Pointer[func()]
}

// NewRuntime returns the adapter; templates is the directory of templates
// (see internal/node/template), read at every start so that a template
// installed while the node runs is usable at once. Without UseArtifacts
// it starts only the templates the node has, with its own guest.
func NewRuntime(rt *sandbox.Runtime, templates string) *Runtime {
	r := &Runtime{rt: rt, templates: templates, events: make(chan agent.Event, 256)}
	r.art = newArtifacts(nil, templates, slog.New(slog.DiscardHandler), r.executionRootfs)
	r.art.changed = r.inventoryChanged
	go r.forward()
	return r
}

// UseArtifacts makes r fetch the published Templates and Platforms it
// needs through store (agent.Artifacts), and retry pending reclamations
// until ctx is done.
func (r *Runtime) UseArtifacts(ctx context.Context, store *artifact.Store, log *slog.Logger) {
	r.art = newArtifacts(store, r.templates, log, r.executionRootfs)
	r.art.changed = r.inventoryChanged
	go r.art.runReclaimer(ctx)
}

// OnInventoryChange makes r call f after a published template version
// was installed or reclaimed, or a platform verified or reclaimed
// (agent.InventoryNotifier).
func (r *Runtime) OnInventoryChange(f func()) { r.notify.Store(&f) }

func (r *Runtime) inventoryChanged() {
	if f := r.notify.Load(); f != nil {
		(*f)()
	}
}

// executionRootfs lists the rootfs directories the executions run from.
func (r *Runtime) executionRootfs() []string {
	var out []string
	for _, st := range r.rt.Executions() {
		out = append(out, st.TemplateDir)
	}
	return out
}

// SetPlatform makes p the Platform new executions boot with (nil: the
// node's own guest).
func (r *Runtime) SetPlatform(p *nodev1.DesiredPlatform) { r.art.SetPlatform(p) }

// Reclaim deletes the artifact versions of these digests once no
// execution uses them.
func (r *Runtime) Reclaim(digests []string) { r.art.Reclaim(digests) }

// Platforms lists the Platform versions the node holds.
func (r *Runtime) Platforms() []*nodev1.TemplateInfo { return r.art.Platforms() }

var (
	_ agent.Artifacts         = (*Runtime)(nil)
	_ agent.InventoryNotifier = (*Runtime)(nil)
)

func (r *Runtime) forward() {
	defer close(r.events)
	for ev := range r.rt.Events() {
		out := agent.Event{WorkspaceID: ev.WorkspaceID}
		switch ev.Kind {
		case sandbox.EventExited, sandbox.EventGuestExited:
			out.Exited = true
		case sandbox.EventCondition:
			out.Guest, out.GuestMessage = condition(ev.Condition), ev.Message
		}
		r.events <- out
	}
}

func condition(c protocol.Condition) ctrlv1.GuestCondition {
	if c == protocol.ConditionUnspecified {
		return ctrlv1.GuestCondition_GUEST_CONDITION_UNSPECIFIED
	}
	return ctrlv1.GuestCondition(ctrlv1.GuestCondition_value["GUEST_CONDITION_"+string(c)])
}

// Start starts an execution from the template. Errors no retry can fix are
// marked agent.Permanent.
//
// A published template version (s.TemplateVersion) the node lacks is
// fetched from s.TemplateSource and extracted first; new executions boot
// with the desired Platform's guest when the node holds it (SetPlatform),
// and with the node's own when that guest fails the protocol handshake
// (the Platform is refused then: artifacts.boot).
func (r *Runtime) Start(ctx context.Context, s agent.Spec) error {
	dir, err := r.templateDir(ctx, s)
	if err != nil {
		return err
	}
	spec := sandbox.Spec{WorkspaceID: s.WorkspaceID, Generation: s.Generation, TemplateDir: dir,
		CapacityBytes: s.CapacityBytes, MemoryMiB: s.MemoryMiB, CPUMillis: s.CPUMillis, Network: s.Network}
	if v := s.Volume; v != nil {
		spec.Volume = &sandbox.VolumeMount{VolumeID: v.VolumeID, MountPath: v.MountPath}
	}
	if _, running := r.rt.Status(s.WorkspaceID); running {
		err = r.rt.Start(ctx, spec)
	} else {
		err = r.art.boot(ctx, func(guest *os.File) error {
			spec.Guest = guest
			return r.rt.Start(ctx, spec)
		})
	}
	if sandbox.Permanent(err) {
		return agent.Permanent(err)
	}
	return err
}

// templateDir returns the rootfs a start of s runs from: its published
// version (fetched and extracted when missing), or the version of
// s.TemplateID the node holds.
func (r *Runtime) templateDir(ctx context.Context, s agent.Spec) (string, error) {
	if s.TemplateVersion != "" && s.TemplateID != template.DefaultName {
		return r.art.templateDir(ctx, s.TemplateID, s.TemplateVersion, s.TemplateSource)
	}
	list, err := template.List(r.templates)
	if err != nil {
		return "", err
	}
	for _, t := range list {
		if t.Name == s.TemplateID {
			return t.Rootfs, nil
		}
	}
	return "", agent.Permanent(fmt.Errorf("template %q is not on this node", s.TemplateID))
}

// Stop stops an execution; ErrWritebackFailed maps to the agent's.
func (r *Runtime) Stop(ctx context.Context, id string, force bool) error {
	err := r.rt.Stop(ctx, id, force)
	switch {
	case errors.Is(err, sandbox.ErrNotRunning):
		return nil
	case errors.Is(err, sandbox.ErrWritebackFailed):
		return fmt.Errorf("%w: %v", agent.ErrWritebackFailed, err)
	}
	return err
}

// Delete releases everything of a workspace.
func (r *Runtime) Delete(ctx context.Context, id string) error { return r.rt.Delete(ctx, id) }

// Status reports a workspace.
func (r *Runtime) Status(id string) agent.Status {
	st, ok := r.rt.Status(id)
	if !ok {
		return agent.Status{WorkspaceID: id, LayerExists: st.LayerExists, LayerCapacityBytes: st.LayerBytes}
	}
	return convert(st)
}

func convert(st sandbox.Status) agent.Status {
	return agent.Status{WorkspaceID: st.WorkspaceID, Generation: st.Generation, Running: st.Running,
		LayerExists: st.LayerExists, LayerCapacityBytes: st.LayerBytes, Guest: condition(st.Guest), GuestMessage: st.GuestMessage,
		Network: st.Network}
}

// ApplyNetwork applies a network configuration to a running execution.
func (r *Runtime) ApplyNetwork(ctx context.Context, id string, nc *nodev1.NetworkConfig) (*nodev1.NetworkStatus, error) {
	st, err := r.rt.ApplyNetwork(ctx, id, nc)
	if errors.Is(err, sandbox.ErrNotRunning) {
		return nil, fmt.Errorf("%w: %s", agent.ErrNotRunning, id)
	}
	return st, err
}

// CloseEgress ends every connection through a deleted Egress.
func (r *Runtime) CloseEgress(id string) { r.rt.CloseEgress(id) }

// Executions lists the executions.
func (r *Runtime) Executions() []agent.Status {
	var out []agent.Status
	for _, st := range r.rt.Executions() {
		out = append(out, convert(st))
	}
	return out
}

// Events forwards the runtime's events.
func (r *Runtime) Events() <-chan agent.Event { return r.events }

// GuestTransport returns the transport of a workspace's guest data
// service, for the agent's data service; agent.ErrNotRunning when it does
// not run here.
func (r *Runtime) GuestTransport(id string) (http.RoundTripper, error) {
	tr, err := r.rt.GuestTransport(id)
	if errors.Is(err, sandbox.ErrNotRunning) {
		return nil, fmt.Errorf("%w: %s", agent.ErrNotRunning, id)
	}
	return tr, err
}

// OpenLog opens a workspace's guest log, the rotated file and the current
// one, for the agent's log service; agent.ErrNoLog when the node keeps
// none.
func (r *Runtime) OpenLog(id string) (rotated, current *os.File, err error) {
	rotated, current, err = r.rt.OpenLog(id)
	if errors.Is(err, sandbox.ErrNoLog) {
		return nil, nil, fmt.Errorf("%w: %s", agent.ErrNoLog, id)
	}
	return rotated, current, err
}

var _ agent.Logs = (*Runtime)(nil)
