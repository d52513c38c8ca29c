// Package guest is kibotos-guest, the agent that runs as PID 1 inside every
// workspace.
//
// As PID 1 it reaps every process that ends in the workspace (a SIGCHLD loop
// around wait4(-1), see reaper), serves the node on the connections the node
// sends over its channel (package protocol), reports the guest's condition
// (READY, DISK_PRESSURE when the writable layer has less than 5% free,
// MEMORY_PRESSURE when the working set of the workspace's cgroup is above 90%
// of its limit) and the protocol version it speaks (the node's handshake),
// flushes the writable layer when the node asks for writeback,
// serves the data plane's ProcessService (process.go, ring.go, serve.go:
// connect-go over HTTP/2 on the node's connections) and powers the
// workspace off on request. At boot it writes /etc/resolv.conf
// (resolvconf.go), naming the node's DNS server.
//
// PID 1 is not dumpable (Main sets it before anything else): the
// workspace's root, which has no CAP_SYS_PTRACE, can neither ptrace it nor
// reach its descriptors through /proc/1/fd — among them the node's end of
// the channel and the read end of its log pipe, which it keeps for a node
// that restarts (protocol.NodeChannelFD, protocol.LogReadFD). Its log goes
// to stderr, a pipe the node drains; a full pipe drops lines rather than
// block the agent.
//
// Powering off: SIGTERM, SIGINT, SIGHUP, SIGPWR, SIGUSR1 and SIGUSR2 sent to
// PID 1 (busybox halt/poweroff/reboot send SIGUSR1/SIGUSR2/SIGTERM to PID 1),
// `kibotos-guest poweroff` (SIGTERM to PID 1), or OpShutdown. The agent then
// asks every process to end (SIGTERM, ShutdownGrace, SIGKILL), writes back,
// sends the node a power-off notice on the channel so that the node can
// tell a guest-initiated power-off from a crash, and waits for the node to
// end the execution: the notice waits in the channel for a node that is
// restarting, since PID 1 keeps the node's end open.
//
// Without a channel (the agent's tests, the crun reference of
// bench/workspacebench) the agent listens on a unix socket instead and
// exits after powering off.
//
// The binary is static (CGO_ENABLED=0): it runs on any template.
package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/kibotos/kibotos/internal/mountinfo"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// Config configures an Agent. Zero fields take the defaults of a workspace.
type Config struct {
	// Channel, when set, is the node's channel: the agent serves the
	// connections it brings and sends its power-off notice on it.
	Channel *protocol.ChannelListener
	// SocketPath is where the agent listens without a Channel
	// (protocol.SocketPath).
	SocketPath string
	// CgroupRoot is where the workspace's own cgroup is visible
	// ("/sys/fs/cgroup"; the runtime mounts it read-only inside a cgroup
	// namespace).
	CgroupRoot string
	// DiskPath is the filesystem watched for DISK_PRESSURE ("/").
	DiskPath string
	// Trampoline is the binary that starts commands for OpExec: it resets
	// the command's OOM score (PID 1 protects itself with a low one) and
	// execs it ("/proc/self/exe" when PID 1; empty starts commands
	// directly).
	Trampoline string
	// ShutdownGrace is how long processes get between SIGTERM and SIGKILL
	// when the guest powers off (2s).
	ShutdownGrace time.Duration
	// Log receives the agent's log (stderr, text).
	Log *slog.Logger
}

// Agent is the guest agent.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	pid1   bool
	reaper *reaper
	oom    oomHandoff // the OOM score of directly started processes

	// loop runs functions on Run's goroutine, the one thread that forks
	// and waits (see reaper); loopDone is closed when Run returns.
	loop     chan func()
	loopDone chan struct{}
	looping  atomic.Bool

	// The data plane (serve.go): the HTTP/2 server, its handler, the
	// processes it started, and the context its connections are served
	// with (ended when Run returns).
	h2        *http2.Server
	h2Handler http.Handler
	procs     *processTable
	ctx       context.Context
	cancel    context.CancelFunc

	mu       sync.Mutex
	ln       net.Listener
	stopping bool
	done     chan struct{}
	once     sync.Once
}

// New returns an agent.
func New(cfg Config) *Agent {
	pid1 := os.Getpid() == 1
	if cfg.SocketPath == "" {
		cfg.SocketPath = protocol.SocketPath
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/sys/fs/cgroup"
	}
	if cfg.DiskPath == "" {
		cfg.DiskPath = "/"
	}
	if cfg.Trampoline == "" && pid1 {
		cfg.Trampoline = "/proc/self/exe"
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	a := &Agent{cfg: cfg, log: cfg.Log, pid1: pid1, reaper: newReaper(pid1),
		loop: make(chan func()), loopDone: make(chan struct{}), done: make(chan struct{}),
		procs: newProcessTable()}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.h2, a.h2Handler = a.newDataPlane()
	return a
}

// isStopping reports whether the guest is powering off.
func (a *Agent) isStopping() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stopping
}

// Main is kibotos-guest's main: it returns the process exit code. Its
// caller must run it on the main goroutine locked to the main thread
// (cmd/kibotos-guest does, see reaper).
//
//	kibotos-guest             run the agent (PID 1 of a workspace)
//	kibotos-guest poweroff    ask the running agent to power the workspace off
//	kibotos-guest --protocol-version  print the node-guest protocol version it
//	                          speaks (nodewire.GuestProtocolDeclaration, which
//	                          the node and ctrl read from the binary's bytes)
//	kibotos-guest __exec ...  internal: the trampoline of commands
//	kibotos-guest __exec-as UID GID ...  internal: the same, as UID:GID
func Main(args []string) int {
	if len(args) > 1 {
		switch args[1] {
		case trampolineArg:
			return runTrampoline(args[2:])
		case trampolineAsArg:
			return runTrampolineAs(args[2:])
		case "--protocol-version":
			fmt.Println(nodewire.GuestProtocolDeclaration)
			return 0
		case "poweroff", "shutdown", "halt":
			if err := requestPoweroff(); err != nil {
				fmt.Fprintln(os.Stderr, "kibotos-guest:", err)
				return 1
			}
			return 0
		default:
			fmt.Fprintf(os.Stderr, "usage: kibotos-guest [poweroff]\n")
			return 2
		}
	}
	// Before anything else, and before any process of the workspace
	// exists: no ptrace of PID 1, no /proc/1/fd, no core dump.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "kibotos-guest: PR_SET_DUMPABLE:", err)
		return 1
	}
	// Executed from a descriptor, PID 1 is named after its number: name it
	// (the main thread's name is the process's).
	if name, err := unix.BytePtrFromString("kibotos-guest"); err == nil {
		_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0)
	}
	ch, err := ChannelFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kibotos-guest:", err)
		return 1
	}
	cfg := Config{SocketPath: socketFromEnv()}
	if ch != nil {
		// Stdout and stderr are the node's log pipe: never block on it.
		_ = unix.SetNonblock(1, true)
		_ = unix.SetNonblock(2, true)
		cfg.Channel = ch
		cfg.Log = slog.New(slog.NewTextHandler(dropWriter{fd: 2}, nil))
	}
	a := New(cfg)
	if ch != nil && a.pid1 {
		// PID 1 of a workspace: its DNS goes to the node.
		if err := writeResolvConf("/"); err != nil {
			a.log.Warn("/etc/resolv.conf not written", "err", err)
		}
	}
	if err := a.Run(context.Background()); err != nil {
		a.log.Error("guest agent failed", "err", err)
		return 1
	}
	return 0
}

// requestPoweroff asks the agent to power off: over its socket in listening
// mode (KIBOTOS_GUEST_SOCKET set), with SIGTERM to PID 1 otherwise.
func requestPoweroff() error {
	if p := os.Getenv("KIBOTOS_GUEST_SOCKET"); p != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := protocol.Do(ctx, p, protocol.Request{Op: protocol.OpShutdown})
		return err
	}
	return unix.Kill(1, unix.SIGTERM)
}

// ChannelFromEnv returns the channel the runtime handed down
// (protocol.ChannelFDEnv), or nil without one. It removes the variable and
// marks the channel and the descriptors PID 1 keeps for the node
// close-on-exec, so that no command of the workspace inherits any of them.
func ChannelFromEnv() (*protocol.ChannelListener, error) {
	v, ok := os.LookupEnv(protocol.ChannelFDEnv)
	if !ok {
		return nil, nil
	}
	_ = os.Unsetenv(protocol.ChannelFDEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q is no descriptor", protocol.ChannelFDEnv, v)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return nil, fmt.Errorf("channel descriptor %d: %w", fd, err)
	}
	for _, kept := range []int{protocol.NodeChannelFD, protocol.LogReadFD} {
		if kept != fd {
			unix.CloseOnExec(kept)
		}
	}
	return protocol.NewChannelListener(fd)
}

func socketFromEnv() string {
	if p := os.Getenv("KIBOTOS_GUEST_SOCKET"); p != "" {
		return p
	}
	return protocol.SocketPath
}

// dropWriter writes to a non-blocking descriptor and drops what does not
// fit at once: the agent never waits for its log.
type dropWriter struct{ fd int }

func (w dropWriter) Write(p []byte) (int, error) {
	_, _ = unix.Write(w.fd, p)
	return len(p), nil
}

// Run serves until the guest powers off (nil; with a channel it then waits
// for the node to end it) or ctx ends (ctx.Err()). It forks and reaps on its
// own goroutine, locked to its thread (see reaper).
func (a *Agent) Run(ctx context.Context) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	a.looping.Store(true)
	defer close(a.loopDone)
	defer a.cancel()
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGPWR, unix.SIGUSR1, unix.SIGUSR2)
	defer signal.Stop(sigs)
	// A write to a closed pipe is an error, not the end of PID 1 (Notify,
	// unlike Ignore, leaves the default to the commands it starts).
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, unix.SIGPIPE)
	defer signal.Stop(pipes)
	if a.pid1 {
		unix.Umask(0o022)
		_ = os.Chdir("/")
	}
	var ln net.Listener
	if a.cfg.Channel != nil {
		ln = a.cfg.Channel
	} else {
		_ = os.Remove(a.cfg.SocketPath)
		l, err := net.Listen("unix", a.cfg.SocketPath)
		if err != nil {
			return err
		}
		_ = os.Chmod(a.cfg.SocketPath, 0o600)
		ln = l
	}
	a.mu.Lock()
	a.ln = ln
	a.mu.Unlock()
	go a.accept(ln)
	a.log.Info("guest agent ready", "channel", a.cfg.Channel != nil, "pid1", a.pid1)

	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	done := a.done
	for {
		select {
		case sig := <-sigs:
			if sig == unix.SIGCHLD {
				a.reaper.reap()
				continue
			}
			go a.poweroff("signal " + unix.SignalName(sig.(syscall.Signal)))
		case fn := <-a.loop:
			fn()
		case <-tick.C:
			a.reaper.reap() // a safety net for coalesced SIGCHLDs
		case <-done:
			if a.cfg.Channel == nil {
				return nil
			}
			// Powered off: the node ends the execution once it has read
			// the notice; meanwhile keep reaping.
			done = nil
		case <-ctx.Done():
			a.closeListener()
			return ctx.Err()
		}
	}
}

// onLoop runs fn on Run's goroutine (directly when Run does not run).
func (a *Agent) onLoop(fn func()) {
	if !a.looping.Load() {
		fn()
		return
	}
	ran := make(chan struct{})
	select {
	case a.loop <- func() { fn(); close(ran) }:
		<-ran
	case <-a.loopDone:
		fn()
	}
}

func (a *Agent) closeListener() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ln != nil {
		_ = a.ln.Close()
		a.ln = nil
	}
}

func (a *Agent) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			a.log.Warn("accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go a.serveConn(c)
	}
}

// serveLines serves the line protocol of package protocol on c.
func (a *Agent) serveLines(c net.Conn, br *bufio.Reader) {
	defer c.Close()
	for {
		var req protocol.Request
		if err := protocol.ReadMessage(br, &req, protocol.MaxRequest); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				a.reply(c, protocol.Response{Error: err.Error()})
			}
			return
		}
		resp := a.handle(req)
		if err := a.reply(c, resp); err != nil {
			return
		}
		if req.Op == protocol.OpShutdown && resp.OK {
			go a.poweroff("requested by " + string(protocol.OpShutdown))
			return
		}
	}
}

// reply sends resp, its free text clipped so that it fits
// protocol.MaxResponse (an answer that still does not is replaced by an
// error).
func (a *Agent) reply(c net.Conn, resp protocol.Response) error {
	resp.Error = protocol.Clip(resp.Error, protocol.MaxText)
	resp.Message = protocol.Clip(resp.Message, protocol.MaxText)
	if len(resp.Synced) > 64 {
		resp.Synced = resp.Synced[:64]
	}
	for i, s := range resp.Synced {
		resp.Synced[i] = protocol.Clip(s, 256)
	}
	err := protocol.WriteMessage(c, resp, protocol.MaxResponse)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		a.log.Warn("reply", "err", err)
		return protocol.WriteMessage(c, protocol.Response{Error: protocol.Clip(err.Error(), protocol.MaxText)}, protocol.MaxResponse)
	}
	return err
}

func (a *Agent) handle(req protocol.Request) protocol.Response {
	a.mu.Lock()
	stopping := a.stopping
	a.mu.Unlock()
	switch req.Op {
	case protocol.OpPing:
		// The version handshake: the same constant the binary's
		// declaration states (nodewire.GuestProtocolDeclaration).
		cond, msg := a.Condition()
		return protocol.Response{OK: true, Condition: cond, Message: msg, ProtocolVersion: nodewire.GuestProtocolVersion}
	case protocol.OpWriteback:
		synced, err := a.Writeback()
		if err != nil {
			return protocol.Response{Error: err.Error(), Synced: synced}
		}
		return protocol.Response{OK: true, Synced: synced}
	case protocol.OpShutdown:
		return protocol.Response{OK: true}
	case protocol.OpExec:
		if stopping {
			return protocol.Response{Error: "guest is powering off"}
		}
		if req.Exec == nil || len(req.Exec.Argv) == 0 {
			return protocol.Response{Error: "exec: empty argv"}
		}
		timeout := 10 * time.Minute
		if req.TimeoutMillis > 0 {
			timeout = time.Duration(req.TimeoutMillis) * time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		res, err := a.Exec(ctx, req.Exec)
		if err != nil {
			return protocol.Response{Error: err.Error()}
		}
		return protocol.Response{OK: true, Exec: res}
	default:
		return protocol.Response{Error: fmt.Sprintf("unknown op %q", protocol.Clip(string(req.Op), 64))}
	}
}

// poweroff ends every process, writes back and tells the node (with a
// channel) or ends Run (without).
func (a *Agent) poweroff(reason string) {
	a.once.Do(func() {
		a.mu.Lock()
		a.stopping = true
		a.mu.Unlock()
		a.log.Info("powering off", "reason", reason)
		if a.cfg.Channel == nil {
			a.closeListener()
		}
		a.endProcesses()
		synced, err := a.Writeback()
		if err != nil {
			a.log.Error("writeback at power-off", "err", err, "synced", synced)
		}
		if a.cfg.Channel != nil {
			if err := a.cfg.Channel.Notify(protocol.NoticePoweroff, reason, 10*time.Second); err != nil {
				a.log.Error("power-off notice", "err", err)
			}
		}
		close(a.done)
	})
}

// endProcesses sends SIGTERM to every other process of the workspace, waits
// up to ShutdownGrace for them to end, then SIGKILLs the rest. Outside PID 1
// (tests) it only ends the agent's own children.
func (a *Agent) endProcesses() {
	remain := func() bool {
		var left bool
		a.onLoop(func() { left = a.reaper.reap() })
		return left
	}
	if !a.pid1 {
		a.reaper.signalAll(unix.SIGKILL)
		return
	}
	_ = unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(a.cfg.ShutdownGrace)
	for time.Now().Before(deadline) {
		if !remain() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = unix.Kill(-1, unix.SIGKILL)
	deadline = time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && remain() {
		time.Sleep(10 * time.Millisecond)
	}
}

// storageFS are the filesystem types whose data a writeback must flush.
var storageFS = map[string]bool{
	"overlay": true, "ext4": true, "ext3": true, "ext2": true, "xfs": true,
	"btrfs": true, "f2fs": true, "vfat": true,
}

// Writeback flushes the writable layer ("/") and every other storage
// filesystem mounted whole in the workspace with syncfs(2): the Volume, an
// ext4 the init shim mounts at its mount path, among them (the sandbox's
// TestVolumeMountedWrittenBackGrownDeleted checks that it is synced).
// Mounts under protocol.GuestDir (host directories in listening mode) are
// skipped: flushing them would flush the host's filesystem.
func (a *Agent) Writeback() ([]string, error) {
	targets := []string{a.cfg.DiskPath}
	if mounts, err := mountinfo.ReadSelf(); err == nil {
		for _, m := range mounts {
			if m.MountPoint == a.cfg.DiskPath || m.Root != "/" || !storageFS[m.FSType] {
				continue
			}
			if m.MountPoint == protocol.GuestDir || strings.HasPrefix(m.MountPoint, protocol.GuestDir+"/") {
				continue
			}
			targets = append(targets, m.MountPoint)
		}
	}
	var synced []string
	var errs []error
	for _, t := range targets {
		if err := syncfs(t); err != nil {
			errs = append(errs, fmt.Errorf("syncfs %s: %w", t, err))
			continue
		}
		synced = append(synced, t)
	}
	return synced, errors.Join(errs...)
}

func syncfs(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}
