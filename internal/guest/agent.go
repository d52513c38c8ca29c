// Package guest is kibotos-guest, the agent that runs as PID 1 inside every
// workspace.
//
// As PID 1 it reaps every process that ends in the workspace (a SIGCHLD loop
// around wait4(-1)), serves the node on the unix socket of package
// protocol, reports the guest's condition (READY, DISK_PRESSURE when the
// writable layer has less than 5% free, MEMORY_PRESSURE when the working set
// of the workspace's cgroup is above 90% of its limit), flushes the writable
// layer when the node asks for writeback, runs commands for the node (OpExec)
// and powers the workspace off on request.
//
// Powering off: SIGTERM, SIGINT, SIGHUP, SIGPWR, SIGUSR1 and SIGUSR2 sent to
// PID 1 (busybox halt/poweroff/reboot send SIGUSR1/SIGUSR2/SIGTERM to PID 1),
// `kibotos-guest poweroff`, or OpShutdown. The agent then asks every process
// to end (SIGTERM, ShutdownGrace, SIGKILL), writes back, leaves
// protocol.PoweroffMarker in the socket directory so that the node can tell a
// guest-initiated power-off from a crash, and exits 0.
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
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/mountinfo"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// Config configures an Agent. Zero fields take the defaults of a workspace.
type Config struct {
	// SocketPath is where the agent listens (protocol.SocketPath).
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
	// Ready, when set, receives protocol.ReadyByte and is closed once the
	// agent listens (the runtime's readiness pipe, see ReadyFromEnv).
	Ready *os.File
}

// Agent is the guest agent.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	pid1   bool
	reaper *reaper

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
	return &Agent{cfg: cfg, log: cfg.Log, pid1: pid1, reaper: newReaper(pid1), done: make(chan struct{})}
}

// Main is kibotos-guest's main: it returns the process exit code.
//
//	kibotos-guest             run the agent (PID 1 of a workspace)
//	kibotos-guest poweroff    ask the running agent to power the workspace off
//	kibotos-guest __exec ...  internal: the OpExec trampoline
func Main(args []string) int {
	if len(args) > 1 {
		switch args[1] {
		case trampolineArg:
			return runTrampoline(args[2:])
		case "poweroff", "shutdown", "halt":
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := protocol.Do(ctx, socketFromEnv(), protocol.Request{Op: protocol.OpShutdown}); err != nil {
				fmt.Fprintln(os.Stderr, "kibotos-guest:", err)
				return 1
			}
			return 0
		default:
			fmt.Fprintf(os.Stderr, "usage: kibotos-guest [poweroff]\n")
			return 2
		}
	}
	a := New(Config{SocketPath: socketFromEnv(), Ready: ReadyFromEnv()})
	if err := a.Run(context.Background()); err != nil {
		a.log.Error("guest agent failed", "err", err)
		return 1
	}
	return 0
}

// ReadyFromEnv returns the readiness descriptor the runtime handed down
// (protocol.ReadyFDEnv), or nil. It removes the variable and marks the
// descriptor close-on-exec, so that no command of the workspace inherits
// either.
func ReadyFromEnv() *os.File {
	v, ok := os.LookupEnv(protocol.ReadyFDEnv)
	if !ok {
		return nil
	}
	_ = os.Unsetenv(protocol.ReadyFDEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return nil
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "ready")
}

func socketFromEnv() string {
	if p := os.Getenv("KIBOTOS_GUEST_SOCKET"); p != "" {
		return p
	}
	return protocol.SocketPath
}

// Run serves until the guest powers off (nil) or ctx ends (ctx.Err()).
func (a *Agent) Run(ctx context.Context) error {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGPWR, unix.SIGUSR1, unix.SIGUSR2)
	defer signal.Stop(sigs)
	if a.pid1 {
		unix.Umask(0o022)
		_ = os.Chdir("/")
	}
	_ = os.Remove(a.cfg.SocketPath)
	ln, err := net.Listen("unix", a.cfg.SocketPath)
	if err != nil {
		return err
	}
	_ = os.Chmod(a.cfg.SocketPath, 0o600)
	a.mu.Lock()
	a.ln = ln
	a.mu.Unlock()
	go a.accept(ln)
	// Signal first, log after: the node waits for the signal (its start
	// is on a user's critical path), nobody waits for the log line.
	if a.cfg.Ready != nil {
		_, _ = a.cfg.Ready.Write([]byte{protocol.ReadyByte})
		_ = a.cfg.Ready.Close()
		a.cfg.Ready = nil
	}
	a.log.Info("guest agent ready", "socket", a.cfg.SocketPath, "pid1", a.pid1)

	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case sig := <-sigs:
			if sig == unix.SIGCHLD {
				a.reaper.reap()
				continue
			}
			go a.poweroff("signal " + unix.SignalName(sig.(syscall.Signal)))
		case <-tick.C:
			a.reaper.reap() // a safety net for coalesced SIGCHLDs
		case <-a.done:
			return nil
		case <-ctx.Done():
			a.closeListener()
			return ctx.Err()
		}
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

func (a *Agent) serveConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		var req protocol.Request
		if err := protocol.ReadMessage(br, &req); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				_ = protocol.WriteMessage(c, protocol.Response{Error: err.Error()})
			}
			return
		}
		resp := a.handle(req)
		if err := protocol.WriteMessage(c, resp); err != nil {
			return
		}
		if req.Op == protocol.OpShutdown && resp.OK {
			go a.poweroff("requested by " + string(protocol.OpShutdown))
			return
		}
	}
}

func (a *Agent) handle(req protocol.Request) protocol.Response {
	a.mu.Lock()
	stopping := a.stopping
	a.mu.Unlock()
	switch req.Op {
	case protocol.OpPing:
		cond, msg := a.Condition()
		return protocol.Response{OK: true, Condition: cond, Message: msg}
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
		return protocol.Response{Error: fmt.Sprintf("unknown op %q", req.Op)}
	}
}

// poweroff ends every process, writes back, leaves the marker and ends Run.
func (a *Agent) poweroff(reason string) {
	a.once.Do(func() {
		a.mu.Lock()
		a.stopping = true
		a.mu.Unlock()
		a.log.Info("powering off", "reason", reason)
		a.closeListener()
		a.endProcesses()
		synced, err := a.Writeback()
		if err != nil {
			a.log.Error("writeback at power-off", "err", err, "synced", synced)
		}
		marker := filepath.Join(filepath.Dir(a.cfg.SocketPath), protocol.PoweroffMarker)
		if err := writeFileSync(marker, []byte(reason+"\n")); err != nil {
			a.log.Error("power-off marker", "err", err)
		}
		close(a.done)
	})
}

// endProcesses sends SIGTERM to every other process of the workspace, waits
// up to ShutdownGrace for them to end, then SIGKILLs the rest. Outside PID 1
// (tests) it only ends the agent's own children.
func (a *Agent) endProcesses() {
	if !a.pid1 {
		a.reaper.signalAll(unix.SIGKILL)
		return
	}
	_ = unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(a.cfg.ShutdownGrace)
	for time.Now().Before(deadline) {
		if !a.reaper.reap() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = unix.Kill(-1, unix.SIGKILL)
	deadline = time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && a.reaper.reap() {
		time.Sleep(10 * time.Millisecond)
	}
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// storageFS are the filesystem types whose data a writeback must flush.
var storageFS = map[string]bool{
	"overlay": true, "ext4": true, "ext3": true, "ext2": true, "xfs": true,
	"btrfs": true, "f2fs": true, "vfat": true,
}

// Writeback flushes the writable layer ("/") and every other storage
// filesystem mounted whole in the workspace (future Volumes) with syncfs(2).
// The runtime's bind mounts under protocol.GuestDir (host directories) are
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
