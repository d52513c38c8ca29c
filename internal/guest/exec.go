package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// trampolineArg makes kibotos-guest a trampoline: it raises its OOM score
// back to 0 (PID 1 runs with a low one that children would inherit), then
// execs its arguments, looked up in its PATH.
const trampolineArg = "__exec"

// DefaultPath is the PATH of commands run in the workspace.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// trampolineAsArg is trampolineArg that also takes on a user and group:
//
//	kibotos-guest __exec-as UID GID argv...
//
// It drops to them itself (no supplementary groups) after the OOM score
// reset, since the unprivileged user may not execute the guest binary.
const trampolineAsArg = "__exec-as"

func runTrampolineAs(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "kibotos-guest: __exec-as: usage: UID GID argv...")
		return 127
	}
	uid, err1 := strconv.ParseUint(args[0], 10, 32)
	gid, err2 := strconv.ParseUint(args[1], 10, 32)
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "kibotos-guest: __exec-as: bad uid or gid")
		return 127
	}
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("0"), 0)
	// syscall's, not unix's: they change every thread of the process.
	if err := syscall.Setgroups(nil); err != nil {
		fmt.Fprintf(os.Stderr, "kibotos-guest: setgroups: %v\n", err)
		return 126
	}
	if err := syscall.Setgid(int(gid)); err != nil {
		fmt.Fprintf(os.Stderr, "kibotos-guest: setgid %d: %v\n", gid, err)
		return 126
	}
	if err := syscall.Setuid(int(uid)); err != nil {
		fmt.Fprintf(os.Stderr, "kibotos-guest: setuid %d: %v\n", uid, err)
		return 126
	}
	return runTrampoline(args[2:])
}

func runTrampoline(argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "kibotos-guest: __exec: no command")
		return 127
	}
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("0"), 0)
	path, err := exec.LookPath(argv[0])
	if err != nil {
		// As a shell says it: a path that exists but cannot be executed
		// is 126, anything else not found.
		if strings.Contains(argv[0], "/") {
			if _, serr := os.Stat(argv[0]); serr == nil {
				fmt.Fprintf(os.Stderr, "%s: Permission denied\n", argv[0])
				return 126
			}
		}
		fmt.Fprintf(os.Stderr, "%s: command not found\n", argv[0])
		return 127
	}
	err = unix.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "%s: %v\n", argv[0], err)
	return 126
}

// reaper owns wait4(-1): it reaps every child (and, as PID 1, every orphan
// of the workspace) and hands exit statuses to the commands waiting for them.
//
// It waits for exits only: no WUNTRACED, so a stopped child is no event.
// A ptrace stop is the exception — the kernel reports the stops of a
// tracee to its tracer whatever the flags — and PID 1 becomes a tracer
// without asking when a child or an orphan calls PTRACE_TRACEME. Such a
// stop is not an exit: the reaper detaches the tracee (passing on the
// signal that stopped it, except the SIGTRAP of an exec), and the command
// runs on. ptrace(2) answers only the tracer thread, the thread that forked
// the child or, for an orphan, the main thread; so every fork and every
// wait happens on Run's goroutine, locked to the main thread of PID 1
// (Agent.onLoop; cmd/kibotos-guest locks main to it).
//
// Outside PID 1 (the agent's own tests) it only waits for the pids it
// started, so that it never steals another child's status.
type reaper struct {
	mu      sync.Mutex
	all     bool
	waiters map[int]chan unix.WaitStatus
}

func newReaper(all bool) *reaper {
	return &reaper{all: all, waiters: map[int]chan unix.WaitStatus{}}
}

// start runs fn (which starts a process and returns its pid) so that the
// process cannot be reaped before its waiter is registered.
func (r *reaper) start(fn func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fn()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

// reap collects every exited child; it reports whether children remain.
func (r *reaper) reap() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.all {
		for pid, ch := range r.waiters {
			for {
				var ws unix.WaitStatus
				got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
				if got != pid || err != nil {
					break
				}
				if exited(pid, ws) {
					ch <- ws
					delete(r.waiters, pid)
					break
				}
			}
		}
		return len(r.waiters) > 0
	}
	for {
		var ws unix.WaitStatus
		// __WALL: also the children that report their end with another
		// signal than SIGCHLD (clone(2) with exit_signal 0), which would
		// otherwise stay zombies forever.
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil { // ECHILD: none left
			return false
		}
		if pid <= 0 {
			return true
		}
		if !exited(pid, ws) {
			continue
		}
		if ch, ok := r.waiters[pid]; ok {
			ch <- ws
			delete(r.waiters, pid)
		}
	}
}

// exited reports whether ws is the end of pid. Anything else is a ptrace
// stop of a tracee of this process (see reaper), which it detaches, or a
// continue.
func exited(pid int, ws unix.WaitStatus) bool {
	if ws.Exited() || ws.Signaled() {
		return true
	}
	if ws.Stopped() {
		sig := ws.StopSignal()
		if sig == unix.SIGTRAP {
			sig = 0
		}
		_ = ptraceDetach(pid, sig)
	}
	return false
}

// ptraceDetach is PTRACE_DETACH, restarting the tracee with sig.
func ptraceDetach(pid int, sig unix.Signal) error {
	_, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, uintptr(pid), 0, uintptr(sig), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// signalAll signals the process groups of the commands being waited for.
func (r *reaper) signalAll(sig unix.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for pid := range r.waiters {
		_ = unix.Kill(-pid, sig)
	}
}

// limitedBuffer keeps at most max bytes and remembers whether it dropped any.
type limitedBuffer struct {
	buf       bytes.Buffer
	max       int
	truncated bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room < len(p) {
		b.truncated = true
		if room > 0 {
			b.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}

// Exec runs a command in its own session and waits for it (bounded by ctx,
// after which its process group is killed).
func (a *Agent) Exec(ctx context.Context, req *protocol.ExecRequest) (*protocol.ExecResult, error) {
	env := req.Env
	if len(env) == 0 {
		env = []string{"PATH=" + DefaultPath, "HOME=/root", "TERM=dumb", "LANG=C.UTF-8"}
	}
	dir := req.Dir
	if dir == "" {
		dir = a.defaultDir()
	}
	path, argv := a.cfg.Trampoline, append([]string{"kibotos-guest", trampolineArg}, req.Argv...)
	if path == "" {
		p, err := lookPathIn(req.Argv[0], envValue(env, "PATH"))
		if err != nil {
			return &protocol.ExecResult{ExitCode: 127, Stderr: []byte(req.Argv[0] + ": command not found\n")}, nil
		}
		path, argv = p, req.Argv
	}

	var stdin *os.File
	var stdinW *os.File
	if len(req.Stdin) > 0 {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		stdin, stdinW = r, w
	} else {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		stdin = f
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		stdin.Close()
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		stdin.Close()
		outR.Close()
		outW.Close()
		return nil, err
	}
	attr := &os.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []*os.File{stdin, outW, errW},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	var pid int
	var wait <-chan unix.WaitStatus
	a.onLoop(func() {
		pid, wait, err = a.reaper.start(func() (int, error) {
			p, err := os.StartProcess(path, argv, attr)
			if err != nil {
				return 0, err
			}
			pid := p.Pid
			_ = p.Release()
			return pid, nil
		})
	})
	stdin.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		return &protocol.ExecResult{ExitCode: 127, Stderr: []byte(fmt.Sprintf("%s: %v\n", req.Argv[0], err))}, nil
	}
	if stdinW != nil {
		go func() {
			_, _ = stdinW.Write(req.Stdin)
			stdinW.Close()
		}()
	}
	stdout := &limitedBuffer{max: protocol.MaxExecOutput}
	stderr := &limitedBuffer{max: protocol.MaxExecOutput}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() { defer readers.Done(); _, _ = io.Copy(stdout, outR) }()
	go func() { defer readers.Done(); _, _ = io.Copy(stderr, errR) }()

	res := &protocol.ExecResult{}
	var ws unix.WaitStatus
	select {
	case ws = <-wait:
	case <-ctx.Done():
		res.TimedOut = true
		_ = unix.Kill(-pid, unix.SIGKILL)
		_ = unix.Kill(pid, unix.SIGKILL)
		ws = <-wait
	}
	// A background process may keep the pipes open: wait briefly for the
	// output to end, then stop reading.
	readDone := make(chan struct{})
	go func() { readers.Wait(); close(readDone) }()
	select {
	case <-readDone:
	case <-time.After(250 * time.Millisecond):
		outR.Close()
		errR.Close()
		<-readDone
	}
	outR.Close()
	errR.Close()
	res.Stdout, res.Stderr = stdout.buf.Bytes(), stderr.buf.Bytes()
	res.Truncated = stdout.truncated || stderr.truncated
	switch {
	case ws.Exited():
		res.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		res.ExitCode = 128 + int(ws.Signal())
		res.Signal = unix.SignalName(ws.Signal())
	default:
		res.ExitCode = -1
	}
	return res, nil
}

// defaultDir is the working directory of a command that names none: /root
// in a workspace that has it, / otherwise.
func (a *Agent) defaultDir() string {
	if a.pid1 {
		if fi, err := os.Stat("/root"); err == nil && fi.IsDir() {
			return "/root"
		}
	}
	return "/"
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

func lookPathIn(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}
