// Package sandbox is the default execution runtime of a Kibotos node: every
// workspace execution is a set of Linux namespaces and a cgroup around
// kibotos-guest, no virtual machine (no KVM needed, root needed).
//
// # Per execution
//
//   - Writable layer: an ext4 image of exactly CapacityBytes at
//     Root/layers/<ws>.img, made (sparse: cloned from the formatted seed of
//     its capacity, or mkfs.ext4) at the first start and kept across stops; attached to a loop device with LO_FLAGS_AUTOCLEAR
//     (see loop.go) and mounted by the node as a detached mount (fsmount),
//     with its upper/ and work/ directories, as the upper layer of an
//     overlayfs whose lower layer is the read-only template rootfs; both
//     layers idmapped to the execution's ID range, the overlay handed to the
//     init shim as a descriptor (userns.go).
//   - Volume (volume.go; optional, Spec.Volume): an ext4 image of its own
//     at Root/volumes/<id>.img, made, grown and deleted on the node's word
//     (EnsureVolume, DeleteVolume) and mounted by one execution at a time:
//     attached to a loop device like the layer, mounted detached and
//     idmapped like it, and moved by the init shim onto its mount path,
//     resolved inside the new root only without following any symbolic
//     link. With Config.StorageBytes, layers and Volumes together never
//     exceed the node's storage pool.
//   - Cgroup (v1 or v2, one interface): memory limit (and no swap), CPU
//     quota of whole vCPUs (ceil(cpu_millis/1000) × period), pids limit,
//     a device allow-list (devices.go) and IO limits on the writable
//     layer's loop device and the Volume's (io.go, Config.IO). Path
//     <CgroupParent>/<root tag>/<ws>, the tag being a hash of Root, so that
//     two runtimes on one host never touch each other's cgroups.
//   - Namespaces: user (IDs 0–65535 are a range of host IDs of the
//     execution's own, from Config.IDBase, recorded with the execution;
//     userns.go), and owned by it mount, PID, UTS (hostname = workspace
//     id), IPC, network (lo only, up; in mode PUBLIC_INTERNET also a TAP
//     eth0 attached before the guest starts, see network.go) and cgroup.
//     An init shim (package
//     initshim; by default kibotos-guest itself, see Config.InitBinary)
//     moves the overlay root into its new mount namespace, does the other
//     mounts there, pivots into the overlay root and execs
//     kibotos-guest as PID 1 from the runtime's sealed in-memory copy of it
//     (a memfd made once in New: nothing of the host's filesystem is
//     mounted into the workspace for it). No mount of an execution is ever
//     visible on the host: when its last process ends the kernel unmounts
//     everything and the loop device detaches itself, so a crashed node
//     leaks no mount.
//   - Guest channel (channel.go, package internal/guest/protocol): a pair
//     of unix sockets the node makes before PID 1 starts; the guest inherits
//     its end, the node sends it a fresh connection per request. PID 1's
//     stdout and stderr are a pipe the node copies into Root/logs/<ws>.log
//     (rotated at 1 MiB, at most 256 KiB/s). PID 1 keeps a copy of the
//     node's ends so that a restarted node takes them back (pidfd_getfd).
//     No host directory is mounted writable into the workspace, and the node
//     reads no path the guest can write.
//   - State: Root/exec/<ws>.json (atomic writes) records PID 1's pid and
//     start time, the loop device, the cgroup, the generation and the
//     inodes of the channel and the log pipe, the ID range, the DNS
//     configuration version the execution started with and its Volume. The processes do not depend
//     on the node (own session, no parent-death signal), so a restarted node
//     re-adopts them with Adopt.
//
// # Stopping
//
// A normal Stop asks the guest to write back (syncfs of the writable layer
// and Volumes) and only after its confirmation kills the execution; without
// confirmation it returns ErrWritebackFailed and leaves the execution running
// and held. A forced Stop gives the guest one short best-effort writeback and
// kills it; it also releases whatever an execution that already ended still
// holds. Either way the writable layer is kept; Delete removes it.
//
// Killing: SIGKILL to PID 1 through its pidfd (the kernel then kills the
// whole PID namespace) and to whatever the cgroup still lists; the runtime
// then waits for the loop device to detach and removes the cgroup.
//
// # Files
//
// One concern per file:
//
//   - sandbox.go: Config, the Runtime (New, Close), the per-workspace lock
//   - spec.go: Spec and its validation
//   - start.go: Start, in named steps (the start path is tuned: keep the
//     order of its system calls)
//   - stop.go: Stop, killing, the end of an execution on its own (watch)
//     and the release of what an execution held
//   - delete.go: Delete and Resize
//   - exec.go: Exec, ExecRequest and Poweroff (requests to the guest)
//   - process.go: ProcessClient, the node's client of the guest's
//     ProcessService (connect-go over HTTP/2 on channel connections)
//   - channel.go: the guest channel and log on the node's side, their
//     bounds, and taking them back after a restart
//   - health.go: guest conditions and the health pings
//   - events.go: Event and the event queue behind Events
//   - status.go: Status, Executions and Stats
//   - network.go: the executions' networks (TAP and Network), ApplyNetwork
//     and CloseEgress
//   - adopt.go: Adopt (re-adoption after a node restart)
//   - state.go: the execution record (Root/exec/<ws>.json)
//   - paths.go: every path under Root, and the cgroup path
//   - cgroup.go: the cgroups interface and what both versions share;
//     cgroup_v1.go and cgroup_v2.go implement it
//   - devices.go: the device list of an execution's cgroup (and its BPF
//     program for cgroup v2); io.go: IOLimits
//   - layer.go, layerseed.go: the writable layer image and its seeds
//   - volume.go: Volume images, their mounts and the storage pool
//   - loop.go: loop devices
//   - userns.go: the ID ranges, the idmapped layers and the overlay root
//   - idclaim.go: the host-wide claims of ID ranges (two nodes, one host)
//   - init.go: the init shim (package initshim)
//   - check.go: the start-up checks
//   - leaks.go: Leaks and Cleanup
//   - errors.go: the errors callers test with errors.Is
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// Config configures a Runtime.
type Config struct {
	// Root is the state directory (for example /var/lib/kibotos/node). It
	// holds layers/, volumes/, exec/, run/ and logs/.
	Root string
	// GuestBinary is the static kibotos-guest on the host; every execution
	// runs it as PID 1, from a sealed copy in memory made when the Runtime
	// is created (a later change of the file takes a new Runtime).
	GuestBinary string
	Log         *slog.Logger
	// CgroupParent is the cgroup under which executions live ("kibotos").
	CgroupParent string
	// InitBinary is executed as the init shim (package initshim). It
	// defaults to GuestBinary, a small static binary that is its own shim;
	// a binary that embeds the runtime ("/proc/self/exe") works too when
	// its main calls MaybeRunInit first, at the cost of starting the whole
	// binary for every execution.
	InitBinary string
	// StartTimeout bounds the wait for the guest's first answer (30s).
	StartTimeout time.Duration
	// WritebackTimeout bounds a normal stop's wait for the guest (10s).
	WritebackTimeout time.Duration
	// ForceWritebackTimeout bounds a forced stop's best-effort writeback (1s).
	ForceWritebackTimeout time.Duration
	// HealthInterval is the period of the health ping (2s); HealthTimeout
	// bounds one ping (2s); after UnresponsiveAfter missed pings in a row
	// (3) the guest is UNRESPONSIVE.
	HealthInterval    time.Duration
	HealthTimeout     time.Duration
	UnresponsiveAfter int
	// DefaultPidsMax applies when a Spec has no PidsMax (1024).
	DefaultPidsMax int
	// IO caps each execution's IO on its writable layer (io.go); nil is
	// DefaultIOLimits, a zero field no cap.
	IO *IOLimits
	// IDBase is the first host uid and gid of the executions' ID ranges
	// (DefaultIDBase, 1,000,000,000): each execution runs in a user
	// namespace of its own, its IDs 0 to 65535 being a range of
	// IDsPerExecution host IDs from IDBase (userns.go). IDRanges is how
	// many ranges there are (4096), the most executions at once.
	IDBase   uint32
	IDRanges int
	// IDClaimDir is where the ranges are claimed host-wide, so that two
	// Runtimes (two nodes) on one host never give two executions the same
	// range (idclaim.go); DefaultIDClaimDir when empty. Every Runtime of a
	// host must use the same.
	IDClaimDir string
	// Network gives executions whose configuration is mode
	// PUBLIC_INTERNET a network (network.go); nil: lo only, and such a
	// configuration is an invalid spec.
	Network *Networking
	// StorageBytes is the storage pool: the sizes of the writable layers
	// and Volume images together (what each may grow to) never exceed it
	// (volume.go); 0 is no limit.
	StorageBytes uint64
}

// Runtime runs sandbox executions on this host.
type Runtime struct {
	cfg     Config
	root    string
	log     *slog.Logger
	oomWarn sync.Once // PID 1's OOM score could not be set (said once)
	cg      cgroups
	cgBase  string   // CgroupParent/tag
	guest   *os.File // the sealed memfd of GuestBinary (initshim.GuestFD)

	// cgMu orders the creation of execution cgroups (which creates cgBase
	// when missing) against the removal of cgBase once it is empty, so
	// that a start never loses its parent between mkdir and mkdir.
	cgMu sync.Mutex

	// idUsed holds the first host ID of every range in use, with its
	// workspace (userns.go).
	idMu   sync.Mutex
	idUsed map[uint32]string

	// storMu guards reserved: the capacities of the images being made or
	// grown, by path (volume.go, reserveStorage).
	storMu   sync.Mutex
	reserved map[string]uint64

	mu     sync.Mutex
	execs  map[string]*execution
	locks  map[string]chan struct{}
	events *eventQueue

	ctx    context.Context
	cancel context.CancelFunc
}

// execution is one running (or ended but held) execution.
type execution struct {
	ws    string
	st    execState // changed only under the workspace lock
	child *exec.Cmd // nil when adopted
	pidf  *os.File  // pidfd of PID 1, pollable
	done  chan struct{}

	mu           sync.Mutex
	cond         GuestCondition
	msg          string
	misses       int
	stopping     bool
	forcePending bool
	stopCancel   context.CancelFunc
	healthCancel context.CancelFunc
	// The guest (channel.go): the node's ends of the channel and of the
	// log pipe (nil when none), the end of the log's copying, and the
	// reason of a power-off notice.
	ch       *protocol.NodeChannel
	logR     *os.File
	logDone  chan struct{}
	poweroff string

	// The execution's network (network.go).
	netMu sync.Mutex
	net   execNet
}

// New prepares a Runtime. It does not touch running executions: call Adopt.
func New(cfg Config) (*Runtime, error) {
	if cfg.Root == "" {
		return nil, errors.New("sandbox: Config.Root is required")
	}
	if cfg.GuestBinary == "" {
		return nil, errors.New("sandbox: Config.GuestBinary is required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "kibotos"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.StartTimeout, 30*time.Second)
	def(&cfg.WritebackTimeout, 10*time.Second)
	def(&cfg.ForceWritebackTimeout, time.Second)
	def(&cfg.HealthInterval, 2*time.Second)
	def(&cfg.HealthTimeout, 2*time.Second)
	if cfg.UnresponsiveAfter <= 0 {
		cfg.UnresponsiveAfter = 3
	}
	if cfg.DefaultPidsMax <= 0 {
		cfg.DefaultPidsMax = 1024
	}
	if cfg.IDBase == 0 {
		cfg.IDBase = DefaultIDBase
	}
	if cfg.IDRanges <= 0 {
		cfg.IDRanges = 4096
	}
	if cfg.IDClaimDir == "" {
		cfg.IDClaimDir = DefaultIDClaimDir
	}
	if uint64(cfg.IDBase)+uint64(cfg.IDRanges)*IDsPerExecution > 1<<32-1 {
		return nil, errors.New("sandbox: Config.IDBase + IDRanges×65536 exceeds the 32-bit ID space")
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("sandbox: the sandbox runtime needs root")
	}
	root, err := prepareRoot(cfg.Root)
	if err != nil {
		return nil, err
	}
	guest, err := filepath.Abs(cfg.GuestBinary)
	if err != nil {
		return nil, err
	}
	if err := CheckGuestBinary(guest); err != nil {
		return nil, err
	}
	cfg.GuestBinary = guest
	if cfg.InitBinary == "" {
		cfg.InitBinary = guest
	}
	cg, err := detectCgroups()
	if err != nil {
		return nil, err
	}
	memfd, err := sealedCopy(guest)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runtime{
		cfg:    cfg,
		root:   root,
		log:    cfg.Log.With("runtime", "sandbox"),
		cg:     cg,
		cgBase: path.Join(cfg.CgroupParent, rootTag(root)),
		guest:  memfd,
		idUsed: map[uint32]string{},
		execs:  map[string]*execution{},
		locks:  map[string]chan struct{}{},
		events: newEventQueue(),
		ctx:    ctx,
		cancel: cancel,
	}
	r.loadIDs()
	r.reclaimRecorded()
	_ = writeFileAtomic(filepath.Join(root, "runtime.json"), map[string]string{"cgroup_parent": cfg.CgroupParent, "cgroup": r.cgBase})
	return r, nil
}

// prepareRoot makes root and its directories (layers, volumes, exec, run, logs) and
// returns its absolute path, symlinks resolved.
func prepareRoot(root string) (string, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", err
	}
	abs, err = filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	if err := CheckRoot(abs); err != nil {
		return "", err
	}
	for _, d := range []string{"layers", "volumes", "exec", "run", "logs"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o700); err != nil {
			return "", err
		}
	}
	return abs, nil
}

// CgroupVersion reports the cgroup version in use (1 or 2).
func (r *Runtime) CgroupVersion() int { return r.cg.version() }

// lockWS serializes the operations on one workspace.
func (r *Runtime) lockWS(ctx context.Context, ws string) (func(), error) {
	r.mu.Lock()
	ch := r.locks[ws]
	if ch == nil {
		ch = make(chan struct{}, 1)
		r.locks[ws] = ch
	}
	r.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// get returns the execution the runtime holds for ws, or nil.
func (r *Runtime) get(ws string) *execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.execs[ws]
}

// closed reports whether Close was called.
func (r *Runtime) closed() bool { return r.ctx.Err() != nil }

// alive reports whether PID 1 of e still runs (watch has not seen it end).
func (e *execution) alive() bool {
	select {
	case <-e.done:
		return false
	default:
		return true
	}
}

// isStopping reports whether e is being stopped or released, which the
// health pings and onExit then leave alone.
func (e *execution) isStopping() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stopping
}

// signal sends sig to PID 1 of e through its pidfd, so that a process that
// reused the pid is never hit.
func (e *execution) signal(sig unix.Signal) {
	if e.pidf == nil {
		return
	}
	if rc, err := e.pidf.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.PidfdSendSignal(int(fd), sig, nil, 0) })
	}
}

// Close detaches the runtime from its executions, which keep running (an
// agent shutdown or restart): health checks stop, events end, and a new
// Runtime on the same Root re-adopts them with Adopt.
func (r *Runtime) Close() error {
	r.cancel()
	r.mu.Lock()
	execs := make([]*execution, 0, len(r.execs))
	for _, e := range r.execs {
		execs = append(execs, e)
	}
	r.mu.Unlock()
	for _, e := range execs {
		e.closeNet() // its TAP goes; a new Runtime attaches again
		if e.pidf != nil {
			e.pidf.Close() // also wakes the watcher of an adopted execution
		}
		e.detachGuest()
	}
	r.events.close()
	r.guest.Close()
	return nil
}

// SealGuest makes the sealed in-memory copy of a guest binary at path
// that Spec.Guest takes (check it with CheckGuestBinary first). The caller
// closes it once no start uses it any more.
func SealGuest(path string) (*os.File, error) { return sealedCopy(path) }

// sealedCopy copies the guest binary into a memfd sealed against every
// change: the executions run it from there (initshim.GuestFD), so nothing
// in a workspace refers to a host path of it, and nothing can write it.
func sealedCopy(path string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sandbox: guest binary: %w", err)
	}
	defer src.Close()
	const flags = unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	fd, err := unix.MemfdCreate("kibotos-guest", flags|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) { // before Linux 6.3, every memfd is executable
		fd, err = unix.MemfdCreate("kibotos-guest", flags)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: an executable memfd for the guest (vm.memfd_noexec must be below 2): %w", err)
	}
	f := os.NewFile(uintptr(fd), "kibotos-guest")
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: copy the guest binary: %w", err)
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: seal the guest binary's copy: %w", err)
	}
	return f, nil
}
