// Package sandbox is the default execution runtime of a Kibotos node: every
// workspace execution is a set of Linux namespaces and a cgroup around
// kibotos-guest, no virtual machine (no KVM needed, root needed).
//
// # Per execution
//
//   - Writable layer: an ext4 image of exactly CapacityBytes at
//     Root/layers/<ws>.img, made (sparse, mkfs.ext4) at the first start and
//     kept across stops; attached to a loop device with LO_FLAGS_AUTOCLEAR
//     (see loop.go) and mounted, with its upper/ and work/ directories, as
//     the upper layer of an overlayfs whose lower layer is the read-only
//     template rootfs.
//   - Cgroup (v1 or v2, one interface): memory limit (and no swap), CPU
//     quota of whole vCPUs (ceil(cpu_millis/1000) × period), pids limit. Path
//     <CgroupParent>/<root tag>/<ws>, the tag being a hash of Root, so that
//     two runtimes on one host never touch each other's cgroups.
//   - Namespaces: mount, PID, UTS (hostname = workspace id), IPC, network
//     (lo only, up) and cgroup. An init shim (package initshim; by default
//     kibotos-guest itself, see Config.InitBinary) does all mounts inside the
//     new mount namespace, pivots into the overlay root and execs
//     kibotos-guest as PID 1, which tells the node through an inherited
//     pipe once it listens. No mount of an execution is ever visible on the host: when its last
//     process ends the kernel unmounts everything and the loop device
//     detaches itself, so a crashed node leaks no mount.
//   - Guest socket: Root/run/<ws>/sock on the host is bind-mounted at
//     /run/kibotos/sock; the guest agent listens there (package
//     internal/guest/protocol) and the node dials it.
//   - State: Root/exec/<ws>.json (atomic writes) records PID 1's pid and
//     start time, the loop device, the cgroup and the generation. The
//     processes do not depend on the node (own session, no parent-death
//     signal), so a restarted node re-adopts them with Adopt.
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
package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/mountinfo"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// GuestCondition is what the guest reports (READY, BOOTING, UNRESPONSIVE,
// DISK_PRESSURE, MEMORY_PRESSURE).
type GuestCondition = protocol.Condition

// The guest conditions.
const (
	GuestUnspecified    = protocol.ConditionUnspecified
	GuestReady          = protocol.ConditionReady
	GuestBooting        = protocol.ConditionBooting
	GuestUnresponsive   = protocol.ConditionUnresponsive
	GuestDiskPressure   = protocol.ConditionDiskPressure
	GuestMemoryPressure = protocol.ConditionMemoryPressure
)

// Spec is what one execution is started with.
type Spec struct {
	// WorkspaceID names the workspace ("ws-..."): [A-Za-z0-9][A-Za-z0-9._-],
	// at most 63 characters. One execution per workspace at a time.
	WorkspaceID string
	// Generation is the desired generation this execution was started
	// for; recorded and reported back in Status and Events.
	Generation uint64
	// TemplateDir is the read-only rootfs directory (the lower layer).
	TemplateDir string
	// CapacityBytes is the writable layer's size when it is created, a
	// whole number of MiB, at least MinCapacityBytes. An existing layer
	// keeps its size (Resize grows it).
	CapacityBytes uint64
	// MemoryMiB is the memory limit.
	MemoryMiB uint32
	// CPUMillis: the quota is ceil(CPUMillis/1000) whole vCPUs.
	CPUMillis uint32
	// PidsMax limits the number of tasks; 0 selects Config.DefaultPidsMax.
	PidsMax int
}

// VCPUs is the number of whole vCPUs cpuMillis rounds up to.
func VCPUs(cpuMillis uint32) uint32 { return (cpuMillis + 999) / 1000 }

// Config configures a Runtime.
type Config struct {
	// Root is the state directory (for example /var/lib/kibotos/node). It
	// holds layers/, exec/, run/ and logs/.
	Root string
	// GuestBinary is the static kibotos-guest on the host; every execution
	// runs it (bind-mounted read-only) as PID 1.
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
}

// EventKind classifies an Event.
type EventKind string

// The events.
const (
	// EventExited: the execution ended without being stopped (crash, PID 1
	// killed, OOM of PID 1). What it held has been released unless
	// Event.Err says otherwise.
	EventExited EventKind = "exited"
	// EventGuestExited: the guest powered itself off (poweroff inside, or
	// SIGTERM to PID 1) after writing back; ctrl records a guest-shutdown
	// command. Released like EventExited.
	EventGuestExited EventKind = "guest_exited"
	// EventCondition: the guest's condition changed (including
	// UNRESPONSIVE from missed health pings). A changed message alone is
	// not an event; Status has the latest.
	EventCondition EventKind = "condition"
)

// Event is something that happened to an execution without being asked.
type Event struct {
	Kind        EventKind
	WorkspaceID string
	Generation  uint64
	Condition   GuestCondition
	Message     string
	// Err is set when an exited execution could not be released; it is
	// still held (Status.Running false) and a forced Stop retries.
	Err  error
	Time time.Time
}

// Status describes one execution.
type Status struct {
	WorkspaceID string
	Generation  uint64
	// Running is false for an execution that ended but is still held
	// (release failed); a forced Stop releases it.
	Running      bool
	PID          int
	LayerExists  bool
	Guest        GuestCondition
	GuestMessage string
	StartedAt    time.Time
	// LayerBytes is the writable layer's size.
	LayerBytes uint64
}

// Runtime runs sandbox executions on this host.
type Runtime struct {
	cfg    Config
	root   string
	log    *slog.Logger
	cg     cgroups
	cgBase string // CgroupParent/tag

	// cgMu orders the creation of execution cgroups (which creates cgBase
	// when missing) against the removal of cgBase once it is empty, so
	// that a start never loses its parent between mkdir and mkdir.
	cgMu sync.Mutex

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
}

var workspaceIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

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
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runtime{
		cfg:    cfg,
		root:   root,
		log:    cfg.Log.With("runtime", "sandbox"),
		cg:     cg,
		cgBase: path.Join(cfg.CgroupParent, rootTag(root)),
		execs:  map[string]*execution{},
		locks:  map[string]chan struct{}{},
		events: newEventQueue(),
		ctx:    ctx,
		cancel: cancel,
	}
	_ = writeFileAtomic(filepath.Join(root, "runtime.json"), map[string]string{"cgroup_parent": cfg.CgroupParent, "cgroup": r.cgBase})
	return r, nil
}

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
	for _, d := range []string{"layers", "exec", "run", "logs"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o700); err != nil {
			return "", err
		}
	}
	return abs, nil
}

// rootTag names a Root in cgroup paths.
func rootTag(root string) string {
	h := sha256.Sum256([]byte(filepath.Clean(root)))
	return hex.EncodeToString(h[:6])
}

// CgroupVersion reports the cgroup version in use (1 or 2).
func (r *Runtime) CgroupVersion() int { return r.cg.version() }

func (r *Runtime) cgroupRel(ws string) string { return path.Join(r.cgBase, ws) }
func (r *Runtime) runDir(ws string) string    { return filepath.Join(r.root, "run", ws) }
func (r *Runtime) sockPath(ws string) string {
	return filepath.Join(r.runDir(ws), "sock", protocol.SocketName)
}
func (r *Runtime) logPath(ws string) string { return filepath.Join(r.root, "logs", ws+".log") }

// LogPath is the guest's log (its stdout and stderr) on the host.
func (r *Runtime) LogPath(workspaceID string) string { return r.logPath(workspaceID) }

// LayerPath is the writable layer image of a workspace.
func (r *Runtime) LayerPath(workspaceID string) string { return r.layerPath(workspaceID) }

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

func (r *Runtime) get(ws string) *execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.execs[ws]
}

func (r *Runtime) closed() bool { return r.ctx.Err() != nil }

func (e *execution) alive() bool {
	select {
	case <-e.done:
		return false
	default:
		return true
	}
}

func (e *execution) isStopping() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stopping
}

func (e *execution) signal(sig unix.Signal) {
	if e.pidf == nil {
		return
	}
	if rc, err := e.pidf.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.PidfdSendSignal(int(fd), sig, nil, 0) })
	}
}

func (r *Runtime) validate(s *Spec) error {
	if !workspaceIDRe.MatchString(s.WorkspaceID) {
		return fmt.Errorf("%w: workspace id %q", ErrInvalidSpec, s.WorkspaceID)
	}
	if err := CheckTemplateDir(s.TemplateDir); err != nil {
		return err
	}
	if err := checkCapacity(s.CapacityBytes); err != nil {
		return err
	}
	if s.MemoryMiB < 16 {
		return fmt.Errorf("%w: memory %d MiB is below 16 MiB", ErrInvalidSpec, s.MemoryMiB)
	}
	if s.CPUMillis == 0 {
		return fmt.Errorf("%w: cpu_millis must be greater than zero", ErrInvalidSpec)
	}
	if s.PidsMax < 0 {
		return fmt.Errorf("%w: pids max %d", ErrInvalidSpec, s.PidsMax)
	}
	if s.PidsMax == 0 {
		s.PidsMax = r.cfg.DefaultPidsMax
	}
	return nil
}

// Start starts an execution for s and returns once its guest agent answers.
// It is idempotent: a workspace that already runs an execution is left
// alone (nil). A failed start is rolled back completely (the layer stays).
func (r *Runtime) Start(ctx context.Context, s Spec) error {
	if r.closed() {
		return ErrClosed
	}
	if err := r.validate(&s); err != nil {
		return err
	}
	ws := s.WorkspaceID
	unlock, err := r.lockWS(ctx, ws)
	if err != nil {
		return err
	}
	defer unlock()
	if e := r.get(ws); e != nil {
		if e.alive() {
			return nil
		}
		if err := r.killAndRelease(e); err != nil {
			return err
		}
	} else if st, err := r.readState(ws); err == nil {
		if e := r.adoptLocked(st); e != nil {
			return nil
		}
	}
	if err := r.releaseLeftovers(ws); err != nil {
		return err
	}
	return r.start(ctx, s)
}

func (r *Runtime) start(ctx context.Context, s Spec) (err error) {
	ws := s.WorkspaceID
	t0 := time.Now()
	// A first start makes the writable layer while the record, the cgroup
	// and the run directory are set up: both end in fsyncs, which the
	// filesystem may then commit together. Every return waits for it, so
	// that no layer appears after Start returned (a Delete may follow).
	type layerResult struct {
		created bool
		err     error
	}
	layerc := make(chan layerResult, 1)
	go func() {
		created, err := r.ensureLayer(ctx, ws, s.CapacityBytes)
		layerc <- layerResult{created, err}
	}()
	var layer *layerResult
	waitLayer := func() layerResult {
		if layer == nil {
			l := <-layerc
			layer = &l
		}
		return *layer
	}
	defer waitLayer()
	st := &execState{
		WorkspaceID:   ws,
		Generation:    s.Generation,
		Phase:         phaseStarting,
		Cgroup:        r.cgroupRel(ws),
		Layer:         r.layerPath(ws),
		TemplateDir:   s.TemplateDir,
		CapacityBytes: s.CapacityBytes,
		MemoryMiB:     s.MemoryMiB,
		CPUMillis:     s.CPUMillis,
		PidsMax:       s.PidsMax,
		StartedAt:     time.Now().UTC(),
		BootID:        bootID,
	}
	if err := r.writeState(st); err != nil {
		return fmt.Errorf("%w: state: %v", ErrStart, err)
	}
	var e *execution
	defer func() {
		if err == nil {
			return
		}
		var rerr error
		if e != nil {
			rerr = r.killAndRelease(e)
		} else {
			rerr = r.releaseResources(st)
		}
		if rerr != nil {
			r.log.Error("rollback of a failed start", "workspace_id", ws, "err", rerr)
		}
	}()

	r.cgMu.Lock()
	err = r.cg.create(st.Cgroup, limits{
		MemoryBytes: uint64(s.MemoryMiB) * mib,
		VCPUs:       VCPUs(s.CPUMillis),
		PidsMax:     s.PidsMax,
	})
	r.cgMu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: cgroup: %v", ErrStart, err)
	}
	run := r.runDir(ws)
	if err := r.removeRunDir(ws); err != nil {
		return fmt.Errorf("%w: %v", ErrStart, err)
	}
	for _, d := range []string{"sock", "layer", "root"} {
		if err := os.MkdirAll(filepath.Join(run, d), 0o700); err != nil {
			return fmt.Errorf("%w: %v", ErrStart, err)
		}
	}
	logf, err := openLog(r.logPath(ws))
	if err != nil {
		return fmt.Errorf("%w: log: %v", ErrStart, err)
	}
	defer logf.Close()
	lr := waitLayer()
	if lr.err != nil {
		return fmt.Errorf("%w: writable layer: %v", ErrStart, lr.err)
	}
	created := lr.created
	loopf, dev, err := attachLoop(st.Layer)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrStart, err)
	}
	defer loopf.Close()
	st.Loop = dev
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrStart, err)
	}
	defer cfgW.Close()
	statR, statW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		return fmt.Errorf("%w: %v", ErrStart, err)
	}
	defer statR.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		statW.Close()
		return fmt.Errorf("%w: %v", ErrStart, err)
	}
	defer readyR.Close()
	mkCmd := func() *exec.Cmd {
		return &exec.Cmd{
			Path:       r.cfg.InitBinary,
			Args:       []string{initArg0},
			Env:        []string{},
			Dir:        "/",
			Stdout:     logf,
			Stderr:     logf,
			ExtraFiles: []*os.File{cfgR, statW, loopf, readyW}, // fds 3, 4, 5, 6
			SysProcAttr: &syscall.SysProcAttr{
				// Own session and no parent-death signal: the execution
				// outlives the node agent.
				Setsid: true,
				Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS |
					unix.CLONE_NEWIPC | unix.CLONE_NEWNET,
			},
		}
	}
	// The shim is born in the execution's cgroup when the host allows it
	// (see cgroups.startIn); otherwise it is migrated below, before it
	// gets its configuration.
	cmd, why := r.cg.startIn(st.Cgroup, mkCmd)
	joined := cmd != nil
	switch {
	case why != nil && joined:
		r.log.Warn("init shim started inside its cgroup, but", "workspace_id", ws, "err", why)
	case why != nil:
		r.log.Debug("init shim not started inside its cgroup; migrating it", "workspace_id", ws, "why", why)
	}
	var startErr error
	if !joined {
		cmd = mkCmd()
		startErr = cmd.Start()
	}
	cfgR.Close()
	statW.Close()
	readyW.Close()
	loopf.Close() // the shim holds the device until its mount does
	if startErr != nil {
		return fmt.Errorf("%w: init shim: %v", ErrStart, startErr)
	}
	pid := cmd.Process.Pid
	e = &execution{ws: ws, child: cmd, done: make(chan struct{}), cond: GuestBooting}
	st.PID = pid
	if fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK); err == nil {
		e.pidf = os.NewFile(uintptr(fd), "pidfd")
	}
	st.PIDStart, _ = procStartTime(pid)
	e.st = *st
	r.mu.Lock()
	r.execs[ws] = e
	r.mu.Unlock()
	go r.watch(e)
	// No state file write here: until the guest answers, the record
	// written before the cgroup (phase starting) is all a restarted node
	// needs. It releases such a start through the cgroup, and the shim is
	// in the cgroup from before it is configured (born there, or migrated
	// just below); a shim the node never configured exits by itself when
	// the configuration pipe ends. The pid is recorded with the running
	// phase.
	if !joined {
		if err := r.cg.addProc(st.Cgroup, pid); err != nil {
			return fmt.Errorf("%w: cgroup: %v", ErrStart, err)
		}
	}
	cfg := initConfig{
		WorkspaceID:   ws,
		Loop:          dev,
		LayerMount:    filepath.Join(run, "layer"),
		RootMount:     filepath.Join(run, "root"),
		TemplateDir:   s.TemplateDir,
		SockDir:       filepath.Join(run, "sock"),
		GuestBinary:   r.cfg.GuestBinary,
		CgroupVersion: r.cg.version(),
		TmpfsBytes:    uint64(s.MemoryMiB) * mib / 2,
	}
	if err := json.NewEncoder(cfgW).Encode(cfg); err != nil {
		return fmt.Errorf("%w: configure init shim: %v", ErrStart, err)
	}
	cfgW.Close()
	// The shim reports a setup error on the status pipe; a successful exec
	// of the guest closes it empty.
	msgc := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(statR, 64<<10))
		msgc <- b
	}()
	var msg []byte
	select {
	case msg = <-msgc:
	case <-ctx.Done():
		return ctx.Err()
	}
	if len(msg) > 0 {
		return fmt.Errorf("%w: %s", ErrStart, msg)
	}
	tExec := time.Now()
	if err := r.waitGuest(ctx, e, readyR); err != nil {
		return err
	}
	st.Phase = phaseRunning
	e.mu.Lock()
	e.st.Phase = phaseRunning
	e.mu.Unlock()
	if err := r.writeState(st); err != nil {
		return fmt.Errorf("%w: state: %v", ErrStart, err)
	}
	r.startHealth(e)
	r.log.Info("execution started", "workspace_id", ws, "generation", s.Generation, "pid", pid,
		"loop", dev, "layer_created", created, "setup", tExec.Sub(t0), "total", time.Since(t0))
	return nil
}

func openLog(p string) (*os.File, error) {
	if fi, err := os.Stat(p); err == nil && fi.Size() > 4<<20 {
		_ = os.Truncate(p, 0)
	}
	return os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
}

// logTail returns the end of a guest log for error messages.
func logTail(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := fi.Size() - 2048
	if off < 0 {
		off = 0
	}
	b := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(b, off)
	return strings.TrimSpace(string(b[:n]))
}

// waitGuest waits for the guest's first answer. The guest signals on ready
// (the read end of its readiness pipe) once it listens; the ping that
// follows confirms it and reads its condition. Should the pipe end without
// the signal while the execution lives on, the runtime falls back to
// retrying the ping (1 ms, then doubling up to 20 ms).
func (r *Runtime) waitGuest(ctx context.Context, e *execution, ready *os.File) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.StartTimeout)
	defer cancel()
	if ready != nil {
		readyc := make(chan struct{})
		go func() {
			var b [1]byte
			_, _ = ready.Read(b[:]) // protocol.ReadyByte, or EOF
			close(readyc)
		}()
		select {
		case <-readyc:
			// Signalled or not, the ping below decides (an EOF without the
			// signal usually means the guest died: the loop sees e.done).
		case <-e.done:
			return fmt.Errorf("%w: the execution exited before its guest answered: %s", ErrStart, logTail(r.logPath(e.ws)))
		case <-ctx.Done():
			return fmt.Errorf("%w: %v (no readiness signal)", ErrGuestNotReady, ctx.Err())
		}
	}
	delay := time.Millisecond
	var last error
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		resp, err := protocol.Do(pctx, r.sockPath(e.ws), protocol.Request{Op: protocol.OpPing})
		pcancel()
		if err == nil {
			e.mu.Lock()
			e.cond, e.msg = resp.Condition, resp.Message
			e.mu.Unlock()
			return nil
		}
		last = err
		select {
		case <-e.done:
			return fmt.Errorf("%w: the execution exited before its guest answered: %s", ErrStart, logTail(r.logPath(e.ws)))
		case <-ctx.Done():
			return fmt.Errorf("%w: %v (last: %v)", ErrGuestNotReady, ctx.Err(), last)
		case <-time.After(delay):
		}
		if delay *= 2; delay > 20*time.Millisecond {
			delay = 20 * time.Millisecond
		}
	}
}

// watch waits for PID 1 to end.
func (r *Runtime) watch(e *execution) {
	if e.child != nil {
		_ = e.child.Wait()
	} else if e.pidf != nil {
		if rc, err := e.pidf.SyscallConn(); err == nil {
			_ = rc.Read(func(fd uintptr) bool {
				n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
				return n > 0
			})
		}
	}
	close(e.done)
	r.onExit(e)
}

// onExit releases an execution that ended on its own and reports it.
func (r *Runtime) onExit(e *execution) {
	if r.closed() || e.isStopping() {
		return
	}
	unlock, err := r.lockWS(r.ctx, e.ws)
	if err != nil {
		return
	}
	defer unlock()
	if r.get(e.ws) != e || e.isStopping() {
		return
	}
	kind, msg := EventExited, "the execution exited"
	if e.child != nil && e.child.ProcessState != nil {
		msg = "the execution exited: " + e.child.ProcessState.String()
	}
	if b, err := os.ReadFile(filepath.Join(r.runDir(e.ws), "sock", protocol.PoweroffMarker)); err == nil {
		kind, msg = EventGuestExited, "the guest powered off: "+strings.TrimSpace(string(b))
	}
	e.mu.Lock()
	e.stopping = true // nothing else acts on it now
	e.mu.Unlock()
	r.stopHealth(e)
	r.cg.kill(e.st.Cgroup) // stragglers (cannot exist outside its PID namespace, but cheap)
	rerr := r.releaseLocked(e)
	r.log.Info("execution ended on its own", "workspace_id", e.ws, "kind", kind, "msg", msg, "release_err", rerr)
	r.emit(Event{Kind: kind, WorkspaceID: e.ws, Generation: e.st.Generation, Message: msg, Err: rerr})
}

func (r *Runtime) emit(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	r.events.push(ev)
}

// Events delivers exits and guest condition changes. It is closed by Close.
// Events queue without bound until read.
func (r *Runtime) Events() <-chan Event { return r.events.out }

// Stop stops the workspace's execution. Normal (force=false): the guest must
// confirm writeback first, otherwise ErrWritebackFailed and the execution
// keeps running. Forced: a best-effort writeback of at most
// ForceWritebackTimeout, then the execution is killed; a forced stop
// supersedes a normal stop in flight (which returns ErrStopSuperseded) and
// releases what an execution that already ended still holds (so does a
// normal stop: nothing is left to write back). Without any execution a
// normal stop returns ErrNotRunning, a forced one nil. The writable layer is
// always kept.
func (r *Runtime) Stop(ctx context.Context, workspaceID string, force bool) error {
	if r.closed() {
		return ErrClosed
	}
	if !workspaceIDRe.MatchString(workspaceID) {
		return fmt.Errorf("%w: workspace id %q", ErrInvalidSpec, workspaceID)
	}
	if force {
		r.supersede(workspaceID)
	}
	unlock, err := r.lockWS(ctx, workspaceID)
	if err != nil {
		return err
	}
	defer unlock()
	return r.stopLocked(ctx, workspaceID, force)
}

// supersede cancels a normal stop that waits for the guest.
func (r *Runtime) supersede(ws string) {
	if e := r.get(ws); e != nil {
		e.mu.Lock()
		e.forcePending = true
		if e.stopCancel != nil {
			e.stopCancel()
		}
		e.mu.Unlock()
	}
}

func (r *Runtime) stopLocked(ctx context.Context, ws string, force bool) error {
	e := r.get(ws)
	if e == nil {
		if st, err := r.readState(ws); err == nil {
			e = r.adoptLocked(st)
		}
	}
	if e == nil {
		if !force {
			return ErrNotRunning
		}
		return r.releaseLeftovers(ws)
	}
	if !e.alive() {
		// It ended but is still held (its release failed or is pending):
		// nothing can be written back any more, so either mode releases.
		return r.killAndRelease(e)
	}
	t0 := time.Now()
	if !force {
		wctx, cancel := context.WithTimeout(ctx, r.cfg.WritebackTimeout)
		defer cancel()
		e.mu.Lock()
		if e.forcePending {
			e.mu.Unlock()
			return ErrStopSuperseded
		}
		e.stopCancel = cancel
		e.mu.Unlock()
		_, err := protocol.Do(wctx, r.sockPath(ws), protocol.Request{
			Op: protocol.OpWriteback, TimeoutMillis: r.cfg.WritebackTimeout.Milliseconds(),
		})
		e.mu.Lock()
		e.stopCancel = nil
		superseded := e.forcePending
		e.mu.Unlock()
		if superseded {
			return ErrStopSuperseded
		}
		if err != nil {
			r.log.Warn("normal stop: no writeback confirmation; execution kept", "workspace_id", ws, "err", err)
			return &WritebackError{WorkspaceID: ws, Err: err}
		}
	} else {
		wctx, cancel := context.WithTimeout(ctx, r.cfg.ForceWritebackTimeout)
		_, err := protocol.Do(wctx, r.sockPath(ws), protocol.Request{
			Op: protocol.OpWriteback, TimeoutMillis: r.cfg.ForceWritebackTimeout.Milliseconds(),
		})
		cancel()
		if err != nil {
			r.log.Info("forced stop: best-effort writeback failed", "workspace_id", ws, "err", err)
		}
	}
	tKill := time.Now()
	err := r.killAndRelease(e)
	r.log.Info("execution stopped", "workspace_id", ws, "force", force, "writeback", tKill.Sub(t0), "kill_release", time.Since(tKill), "err", err)
	return err
}

// killAndRelease ends every process of e and releases what it holds.
func (r *Runtime) killAndRelease(e *execution) error {
	e.mu.Lock()
	e.stopping = true
	e.mu.Unlock()
	r.stopHealth(e)
	deadline := time.Now().Add(15 * time.Second)
	for {
		e.signal(unix.SIGKILL)
		_ = r.cg.kill(e.st.Cgroup)
		select {
		case <-e.done:
		case <-time.After(100 * time.Millisecond):
			if time.Now().Before(deadline) {
				continue
			}
			return fmt.Errorf("%w: PID 1 of %s (%d) does not exit", ErrRelease, e.ws, e.st.PID)
		}
		break
	}
	if err := r.waitCgroupEmpty(e.st.Cgroup, 5*time.Second); err != nil {
		return err
	}
	return r.releaseLocked(e)
}

func (r *Runtime) waitCgroupEmpty(rel string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := r.cg.procs(rel)
		if err == nil && len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: processes %v remain in cgroup %s", ErrRelease, pids, rel)
		}
		_ = r.cg.kill(rel)
		time.Sleep(10 * time.Millisecond)
	}
}

// releaseLocked releases an ended execution and forgets it.
func (r *Runtime) releaseLocked(e *execution) error {
	if err := r.releaseResources(&e.st); err != nil {
		return err
	}
	r.mu.Lock()
	if r.execs[e.ws] == e {
		delete(r.execs, e.ws)
	}
	r.mu.Unlock()
	if e.pidf != nil {
		e.pidf.Close()
	}
	return nil
}

// releaseResources releases what a recorded execution holds once its
// processes are gone: its loop device (which detaches itself when the
// execution's mount namespace goes), its cgroup, its run directory and its
// state file. The layer stays.
func (r *Runtime) releaseResources(st *execState) error {
	var errs []error
	t0 := time.Now()
	if err := waitLoopsDetached(st.Layer, 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	t1 := time.Now()
	if err := r.removeCgroup(st.Cgroup); err != nil {
		errs = append(errs, err)
	}
	r.log.Debug("release", "loop", t1.Sub(t0), "cgroup", time.Since(t1))
	if err := r.removeRunDir(st.WorkspaceID); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %v", ErrRelease, errors.Join(errs...))
	}
	return r.removeState(st.WorkspaceID)
}

func (r *Runtime) removeCgroup(rel string) error {
	if !r.cg.exists(rel) {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := r.cg.remove(rel)
		if err == nil {
			r.pruneCgroupBase()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		_ = r.cg.kill(rel)
		time.Sleep(20 * time.Millisecond)
	}
}

// pruneCgroupBase removes this runtime's cgroup (CgroupParent/<root tag>)
// once the last execution cgroup under it is gone, so that a runtime that
// runs nothing leaves nothing in the cgroup tree. The tag is this Root's
// alone; CgroupParent itself may be shared with other runtimes (or made by
// the operator) and is left alone. cgMu keeps a concurrent start from
// creating an execution cgroup in between.
func (r *Runtime) pruneCgroupBase() {
	r.cgMu.Lock()
	defer r.cgMu.Unlock()
	if names, err := r.cg.children(r.cgBase); err != nil || len(names) > 0 {
		return
	}
	if err := r.cg.remove(r.cgBase); err != nil {
		r.log.Debug("remove the runtime's empty cgroup", "cgroup", r.cgBase, "err", err)
	}
}

// removeRunDir removes Root/run/<ws>. Nothing is mounted there on the host
// by design; should something be, it is detached first so that RemoveAll
// never walks into a mount.
func (r *Runtime) removeRunDir(ws string) error {
	dir := r.runDir(ws)
	if mounts, err := mountinfo.ReadSelf(); err == nil {
		for i := len(mounts) - 1; i >= 0; i-- {
			if under(mounts[i].MountPoint, dir) {
				if err := unix.Unmount(mounts[i].MountPoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("unmount %s: %w", mounts[i].MountPoint, err)
				}
			}
		}
	}
	return os.RemoveAll(dir)
}

// releaseLeftovers releases what a workspace may still hold without a
// known execution (a crashed start, a lost state file).
func (r *Runtime) releaseLeftovers(ws string) error {
	rel := r.cgroupRel(ws)
	st := &execState{WorkspaceID: ws, Cgroup: rel, Layer: r.layerPath(ws)}
	if old, err := r.readState(ws); err == nil {
		signalRecorded(old, unix.SIGKILL)
	}
	if r.cg.exists(rel) {
		_ = r.cg.kill(rel)
		if err := r.waitCgroupEmpty(rel, 5*time.Second); err != nil {
			return err
		}
	}
	return r.releaseResources(st)
}

// Delete ends the workspace's execution (forced), then removes its writable
// layer, log and everything else it holds. Deleting what does not exist is
// not an error.
func (r *Runtime) Delete(ctx context.Context, workspaceID string) error {
	if r.closed() {
		return ErrClosed
	}
	if !workspaceIDRe.MatchString(workspaceID) {
		return fmt.Errorf("%w: workspace id %q", ErrInvalidSpec, workspaceID)
	}
	r.supersede(workspaceID)
	unlock, err := r.lockWS(ctx, workspaceID)
	if err != nil {
		return err
	}
	defer unlock()
	if err := r.stopLocked(ctx, workspaceID, true); err != nil {
		return err
	}
	var errs []error
	for _, p := range []string{r.layerPath(workspaceID), r.layerPath(workspaceID) + ".new", r.logPath(workspaceID)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	_ = syncDir(filepath.Join(r.root, "layers"))
	r.log.Info("workspace deleted", "workspace_id", workspaceID)
	return errors.Join(errs...)
}

// Resize grows the writable layer to capacityBytes (absolute, whole MiB) and
// its filesystem with it, keeping every byte. Only without execution
// (ErrRunning). Equal capacity is a no-op; smaller is ErrCapacity; no layer
// yet is ErrNoLayer (the caller records the capacity for the first start).
func (r *Runtime) Resize(ctx context.Context, workspaceID string, capacityBytes uint64) error {
	if r.closed() {
		return ErrClosed
	}
	if !workspaceIDRe.MatchString(workspaceID) {
		return fmt.Errorf("%w: workspace id %q", ErrInvalidSpec, workspaceID)
	}
	if err := checkCapacity(capacityBytes); err != nil {
		return err
	}
	unlock, err := r.lockWS(ctx, workspaceID)
	if err != nil {
		return err
	}
	defer unlock()
	if r.get(workspaceID) != nil {
		return ErrRunning
	}
	if _, err := os.Stat(r.statePath(workspaceID)); err == nil {
		return ErrRunning
	}
	img := r.layerPath(workspaceID)
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		return ErrNoLayer
	}
	if loops, err := attachedLoops(img, false); err != nil || len(loops) > 0 {
		return fmt.Errorf("%w: the layer is still attached (%v)", ErrRunning, loops)
	}
	if err := growLayer(ctx, img, capacityBytes); err != nil {
		return err
	}
	r.log.Info("writable layer resized", "workspace_id", workspaceID, "capacity_bytes", capacityBytes)
	return nil
}

// Executions lists the executions this runtime holds (after Adopt, also the
// re-adopted ones), sorted by workspace.
func (r *Runtime) Executions() []Status {
	r.mu.Lock()
	list := make([]*execution, 0, len(r.execs))
	for _, e := range r.execs {
		list = append(list, e)
	}
	r.mu.Unlock()
	out := make([]Status, 0, len(list))
	for _, e := range list {
		out = append(out, r.status(e))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].WorkspaceID < out[j].WorkspaceID })
	return out
}

// Status returns the status of one workspace's execution.
func (r *Runtime) Status(workspaceID string) (Status, bool) {
	e := r.get(workspaceID)
	if e == nil {
		st := Status{WorkspaceID: workspaceID}
		if fi, err := os.Stat(r.layerPath(workspaceID)); err == nil {
			st.LayerExists, st.LayerBytes = true, uint64(fi.Size())
		}
		return st, false
	}
	return r.status(e), true
}

func (r *Runtime) status(e *execution) Status {
	e.mu.Lock()
	s := Status{
		WorkspaceID:  e.ws,
		Generation:   e.st.Generation,
		Running:      e.alive(),
		PID:          e.st.PID,
		Guest:        e.cond,
		GuestMessage: e.msg,
		StartedAt:    e.st.StartedAt,
	}
	e.mu.Unlock()
	if fi, err := os.Stat(r.layerPath(e.ws)); err == nil {
		s.LayerExists, s.LayerBytes = true, uint64(fi.Size())
	}
	return s
}

// Stats reads the execution's cgroup.
func (r *Runtime) Stats(workspaceID string) (CgroupStats, error) {
	if r.get(workspaceID) == nil {
		return CgroupStats{}, ErrNotRunning
	}
	return r.cg.stats(r.cgroupRel(workspaceID))
}

// Exec runs argv in the workspace through the guest and returns its output
// and exit code (128+signal when a signal ended it). FOR TESTS ONLY for now:
// it is the seed of the data plane, which will replace it. The command runs
// as root in its own session with the workspace PATH, in /root; ctx's
// deadline becomes its timeout (then it is killed).
func (r *Runtime) Exec(ctx context.Context, workspaceID string, argv []string) (stdout, stderr []byte, exit int, err error) {
	res, err := r.ExecRequest(ctx, workspaceID, protocol.ExecRequest{Argv: argv})
	if err != nil {
		return nil, nil, -1, err
	}
	return res.Stdout, res.Stderr, res.ExitCode, nil
}

// ExecRequest is Exec with stdin, environment and working directory.
func (r *Runtime) ExecRequest(ctx context.Context, workspaceID string, req protocol.ExecRequest) (*protocol.ExecResult, error) {
	e := r.get(workspaceID)
	if e == nil || !e.alive() {
		return nil, ErrNotRunning
	}
	if len(req.Argv) == 0 {
		return nil, errors.New("sandbox: exec: empty argv")
	}
	var timeout int64
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl).Milliseconds()
		if timeout <= 0 {
			return nil, context.DeadlineExceeded
		}
	}
	resp, err := protocol.Do(ctx, r.sockPath(workspaceID), protocol.Request{Op: protocol.OpExec, TimeoutMillis: timeout, Exec: &req})
	if err != nil {
		return nil, err
	}
	if resp.Exec == nil {
		return nil, errors.New("sandbox: exec: guest sent no result")
	}
	return resp.Exec, nil
}

// Poweroff asks the guest to power itself off (as `poweroff` inside would);
// the exit is reported as EventGuestExited.
func (r *Runtime) Poweroff(ctx context.Context, workspaceID string) error {
	e := r.get(workspaceID)
	if e == nil || !e.alive() {
		return ErrNotRunning
	}
	_, err := protocol.Do(ctx, r.sockPath(workspaceID), protocol.Request{Op: protocol.OpShutdown})
	return err
}

// Close detaches the runtime from its executions, which keep running (an
// agent shutdown or restart): health checks stop, events end, and a new
// Runtime on the same Root re-adopts them with Adopt.
func (r *Runtime) Close() error {
	r.cancel()
	r.mu.Lock()
	for _, e := range r.execs {
		if e.pidf != nil {
			e.pidf.Close() // also wakes the watcher of an adopted execution
		}
	}
	r.mu.Unlock()
	r.events.close()
	return nil
}

// ---- health ----

func (r *Runtime) startHealth(e *execution) {
	ctx, cancel := context.WithCancel(r.ctx)
	e.mu.Lock()
	e.healthCancel = cancel
	e.mu.Unlock()
	go r.health(ctx, e)
}

func (r *Runtime) stopHealth(e *execution) {
	e.mu.Lock()
	if e.healthCancel != nil {
		e.healthCancel()
	}
	e.mu.Unlock()
}

func (r *Runtime) health(ctx context.Context, e *execution) {
	t := time.NewTicker(r.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.done:
			return
		case <-t.C:
		}
		if e.isStopping() {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, r.cfg.HealthTimeout)
		resp, err := protocol.Do(pctx, r.sockPath(e.ws), protocol.Request{Op: protocol.OpPing})
		cancel()
		if ctx.Err() != nil {
			return
		}
		e.mu.Lock()
		prev := e.cond
		if err == nil {
			e.misses = 0
			e.cond, e.msg = resp.Condition, resp.Message
		} else {
			e.misses++
			if e.misses >= r.cfg.UnresponsiveAfter {
				e.cond, e.msg = GuestUnresponsive, fmt.Sprintf("%d health pings failed: %v", e.misses, err)
			}
		}
		cond, msg, gen := e.cond, e.msg, e.st.Generation
		stopping := e.stopping
		e.mu.Unlock()
		if !stopping && cond != prev {
			r.emit(Event{Kind: EventCondition, WorkspaceID: e.ws, Generation: gen, Condition: cond, Message: msg})
		}
	}
}

// ---- events ----

type eventQueue struct {
	mu     sync.Mutex
	q      []Event
	wake   chan struct{}
	out    chan Event
	done   chan struct{}
	closed bool
}

func newEventQueue() *eventQueue {
	q := &eventQueue{wake: make(chan struct{}, 1), out: make(chan Event), done: make(chan struct{})}
	go q.run()
	return q
}

func (q *eventQueue) push(ev Event) {
	q.mu.Lock()
	if !q.closed {
		q.q = append(q.q, ev)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *eventQueue) close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.done)
	}
	q.mu.Unlock()
}

func (q *eventQueue) run() {
	defer close(q.out)
	for {
		q.mu.Lock()
		if len(q.q) == 0 {
			q.mu.Unlock()
			select {
			case <-q.wake:
				continue
			case <-q.done:
				return
			}
		}
		ev := q.q[0]
		q.mu.Unlock()
		select {
		case q.out <- ev:
			q.mu.Lock()
			q.q = q.q[1:]
			q.mu.Unlock()
		case <-q.done:
			return
		}
	}
}
