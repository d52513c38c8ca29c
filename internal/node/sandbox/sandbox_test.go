package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

func requireSandbox(tb testing.TB) {
	tb.Helper()
	if skipReason != "" {
		tb.Skip(skipReason)
	}
}

type testLogWriter struct{ tb testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newRuntime makes a Runtime on a fresh Root for the test, with short
// timeouts, and checks at the end that nothing leaked.
func newRuntime(tb testing.TB, mod ...func(*Config)) (*Runtime, string) {
	tb.Helper()
	requireSandbox(tb)
	name := strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name())
	root := filepath.Join(testBase, name)
	if err := Cleanup(root); err != nil {
		tb.Logf("cleanup: %v", err)
	}
	_ = os.RemoveAll(root)
	cfg := Config{
		Root:              root,
		GuestBinary:       testGuest,
		Log:               slog.New(slog.NewTextHandler(testLogWriter{tb}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		WritebackTimeout:  2 * time.Second,
		HealthInterval:    200 * time.Millisecond,
		HealthTimeout:     300 * time.Millisecond,
		UnresponsiveAfter: 3,
	}
	for _, m := range mod {
		m(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		r.Close()
		leaks, err := Leaks(root)
		if err != nil {
			tb.Errorf("Leaks: %v", err)
		}
		if len(leaks) > 0 {
			tb.Errorf("leftovers at the end of the test:\n%s", strings.Join(leaks, "\n"))
		}
		_ = Cleanup(root)
		_ = os.RemoveAll(root)
	})
	return r, root
}

func testSpec(ws string) Spec {
	return Spec{
		WorkspaceID:   ws,
		Generation:    1,
		TemplateDir:   testTemplate,
		CapacityBytes: 64 << 20,
		MemoryMiB:     128,
		CPUMillis:     1000,
	}
}

func start(tb testing.TB, r *Runtime, s Spec) {
	tb.Helper()
	if err := r.Start(context.Background(), s); err != nil {
		b, _ := os.ReadFile(r.LogPath(s.WorkspaceID))
		tb.Fatalf("Start %s: %v\nguest log:\n%s", s.WorkspaceID, err, b)
	}
}

// sh runs a shell command in the workspace and fails the test unless it
// exits 0.
func sh(tb testing.TB, r *Runtime, ws, script string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, serr, code, err := r.Exec(ctx, ws, []string{"sh", "-c", script})
	if err != nil {
		tb.Fatalf("exec %q: %v", script, err)
	}
	if code != 0 {
		tb.Fatalf("exec %q: exit %d\nstdout: %s\nstderr: %s", script, code, out, serr)
	}
	return string(out)
}

func assertNoLeaks(tb testing.TB, root string) {
	tb.Helper()
	leaks, err := Leaks(root)
	if err != nil {
		tb.Fatal(err)
	}
	if len(leaks) > 0 {
		tb.Fatalf("leaks:\n%s", strings.Join(leaks, "\n"))
	}
}

func processAlive(pid int) bool {
	return unix.Kill(pid, 0) == nil
}

// freeze stops every thread of pid with SIGSTOP and waits until each one
// is stopped. kill(2) only queues the signal: until the thread chosen to
// take it runs, the process's other threads (a guest agent answering the
// node) keep going, so a test that wants an unresponsive guest must wait.
func freeze(tb testing.TB, pid int) {
	tb.Helper()
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		tb.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !allThreadsStopped(pid) {
		if time.Now().After(deadline) {
			tb.Fatalf("pid %d: threads still running 10 s after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// allThreadsStopped reports whether every thread of pid is in state T
// (stopped) according to /proc.
func allThreadsStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command, which is in parentheses and may
		// hold any byte: read after the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

func waitEvent(tb testing.TB, r *Runtime, timeout time.Duration, match func(Event) bool) Event {
	tb.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-r.Events():
			if !ok {
				tb.Fatal("events closed")
			}
			tb.Logf("event: %+v", ev)
			if match(ev) {
				return ev
			}
		case <-deadline:
			tb.Fatalf("no matching event within %v", timeout)
		}
	}
}

func TestStartExecStopStartDelete(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	const ws = "ws-basic"
	t0 := time.Now()
	start(t, r, testSpec(ws))
	t.Logf("start → guest answered: %v", time.Since(t0))

	st, ok := r.Status(ws)
	if !ok || !st.Running || st.Guest != GuestReady || st.Generation != 1 || !st.LayerExists {
		t.Fatalf("status after start: %+v", st)
	}
	out, serr, code, err := r.Exec(ctx, ws, []string{"echo", "hi"})
	if err != nil || code != 0 || string(out) != "hi\n" || len(serr) != 0 {
		t.Fatalf("echo hi: %q %q %d %v", out, serr, code, err)
	}
	if got := strings.TrimSpace(sh(t, r, ws, "hostname")); got != ws {
		t.Errorf("hostname = %q, want %q", got, ws)
	}
	if got := strings.Fields(sh(t, r, ws, "ls /sys/class/net")); len(got) != 1 || got[0] != "lo" {
		t.Errorf("/sys/class/net = %v, want [lo]", got)
	}
	links := sh(t, r, ws, "ip -o link")
	if n := strings.Count(strings.TrimSpace(links), "\n") + 1; n != 1 || !strings.Contains(links, "lo:") || !strings.Contains(links, "UP") {
		t.Errorf("ip link shows more than an up lo:\n%s", links)
	}
	if got := strings.TrimSpace(sh(t, r, ws, "cat /proc/1/comm")); got != "kibotos-guest" {
		t.Errorf("PID 1 is %q", got)
	}
	// The writable layer is exactly the requested size.
	fi, err := os.Stat(r.LayerPath(ws))
	if err != nil || fi.Size() != 64<<20 {
		t.Fatalf("layer: %v size %d", err, fi.Size())
	}

	sh(t, r, ws, "mkdir -p /data && echo persisted > /data/file && echo tmp > /tmp/gone")
	t0 = time.Now()
	if err := r.Stop(ctx, ws, false); err != nil {
		t.Fatalf("normal stop: %v", err)
	}
	t.Logf("normal stop: %v", time.Since(t0))
	if processAlive(st.PID) {
		t.Errorf("PID 1 (%d) still alive after stop", st.PID)
	}
	assertNoLeaks(t, root)
	if _, ok := r.Status(ws); ok {
		t.Error("execution still listed after stop")
	}
	if err := r.Stop(ctx, ws, false); !errors.Is(err, ErrNotRunning) {
		t.Errorf("second normal stop = %v, want ErrNotRunning", err)
	}

	s2 := testSpec(ws)
	s2.Generation = 2
	start(t, r, s2)
	if got := sh(t, r, ws, "cat /data/file"); got != "persisted\n" {
		t.Errorf("after restart /data/file = %q", got)
	}
	if got := sh(t, r, ws, "ls /tmp"); strings.TrimSpace(got) != "" {
		t.Errorf("/tmp survived a restart: %q", got)
	}
	if st, _ := r.Status(ws); st.Generation != 2 {
		t.Errorf("generation = %d, want 2", st.Generation)
	}
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatalf("delete: %v", err)
	}
	assertNoLeaks(t, root)
	if _, err := os.Stat(r.LayerPath(ws)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("layer after delete: %v", err)
	}
	if err := r.Delete(ctx, ws); err != nil {
		t.Errorf("second delete: %v", err)
	}
}

func TestStartIsIdempotent(t *testing.T) {
	r, _ := newRuntime(t)
	const ws = "ws-idem"
	start(t, r, testSpec(ws))
	st1, _ := r.Status(ws)
	start(t, r, testSpec(ws))
	st2, _ := r.Status(ws)
	if st1.PID != st2.PID || !st2.Running {
		t.Fatalf("second start changed the execution: %+v → %+v", st1, st2)
	}
	if n := len(r.Executions()); n != 1 {
		t.Fatalf("%d executions", n)
	}
	if err := r.Delete(context.Background(), ws); err != nil {
		t.Fatal(err)
	}
}

// TestInitBinaryEmbeddingTheRuntime starts an execution with a binary that
// embeds the runtime as its init shim (the test binary, whose TestMain
// calls MaybeRunInit), as kibotos-node may be configured to, instead of the
// default kibotos-guest.
func TestInitBinaryEmbeddingTheRuntime(t *testing.T) {
	r, _ := newRuntime(t, func(c *Config) { c.InitBinary = "/proc/self/exe" })
	const ws = "ws-selfinit"
	start(t, r, testSpec(ws))
	if got := strings.TrimSpace(sh(t, r, ws, "hostname; cat /proc/1/cmdline | tr '\\0' ' '")); got != ws+"\nkibotos-guest" {
		t.Fatalf("hostname and PID 1: %q", got)
	}
	if err := r.Stop(context.Background(), ws, false); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(context.Background(), ws); err != nil {
		t.Fatal(err)
	}
}

func TestIsolation(t *testing.T) {
	r, _ := newRuntime(t)
	const ws = "ws-iso"
	start(t, r, testSpec(ws))
	defer r.Delete(context.Background(), ws)
	// Own PID namespace: only PID 1 and the command's processes.
	ps := sh(t, r, ws, "ls /proc | grep -E '^[0-9]+$' | wc -l")
	if n := strings.TrimSpace(ps); n == "" || len(n) > 1 {
		t.Errorf("the workspace sees %s processes", n)
	}
	// The capabilities to mount and to make devices are gone.
	ctx := context.Background()
	if _, _, code, _ := r.Exec(ctx, ws, []string{"mount", "-t", "tmpfs", "x", "/mnt"}); code == 0 {
		t.Error("mount succeeded inside the workspace")
	}
	if _, _, code, _ := r.Exec(ctx, ws, []string{"mknod", "/tmp/sda", "b", "8", "0"}); code == 0 {
		t.Error("mknod succeeded inside the workspace")
	}
	if _, _, code, _ := r.Exec(ctx, ws, []string{"sh", "-c", "echo 1 > /proc/sys/vm/drop_caches"}); code == 0 {
		t.Error("host sysctl writable inside the workspace")
	}
	// Every process runs under the system call filter; new user namespaces
	// are refused (they would hand it capabilities of its own).
	if got := strings.TrimSpace(sh(t, r, ws, "grep '^Seccomp:' /proc/self/status")); !strings.HasSuffix(got, "2") {
		t.Errorf("/proc/self/status says %q, want filter mode 2", got)
	}
	if out, _, code, _ := r.Exec(ctx, ws, []string{"unshare", "-U", "true"}); code == 0 {
		t.Errorf("unshare -U succeeded inside the workspace: %s", out)
	}
	// /dev is minimal and works.
	sh(t, r, ws, "head -c 16 /dev/urandom | wc -c | grep -q 16 && echo x > /dev/null && test -c /dev/zero && test -d /dev/pts")
	// The root filesystem is the overlay; /sys is read-only.
	if _, _, code, _ := r.Exec(ctx, ws, []string{"sh", "-c", "echo > /sys/kernel/uevent_helper"}); code == 0 {
		t.Error("/sys is writable")
	}
	// The guest sees its own memory limit through the cgroup namespace.
	lim := strings.TrimSpace(sh(t, r, ws, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"))
	if lim != fmt.Sprint(128<<20) {
		t.Errorf("memory limit inside = %q", lim)
	}
	// Stdin, environment, working directory.
	res, err := r.ExecRequest(ctx, ws, execReq([]string{"sh", "-c", "cat; echo $FOO; pwd"}, []byte("in\n"), []string{"PATH=/bin:/usr/bin", "FOO=bar"}, "/tmp"))
	if err != nil || string(res.Stdout) != "in\nbar\n/tmp\n" {
		t.Errorf("exec with stdin/env/dir: %+v %v", res, err)
	}
	// A missing command.
	if _, _, code, err := r.Exec(ctx, ws, []string{"no-such-command"}); err != nil || code != 127 {
		t.Errorf("missing command: exit %d, %v", code, err)
	}
	// A timeout kills the command.
	tctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	res, err = r.ExecRequest(tctx, ws, execReq([]string{"sleep", "30"}, nil, nil, ""))
	if err == nil && !res.TimedOut {
		t.Errorf("sleep 30 with a 500ms deadline: %+v", res)
	}
	if time.Since(t0) > 5*time.Second {
		t.Errorf("timeout took %v", time.Since(t0))
	}
}

func TestForceStop(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	const ws = "ws-force"
	start(t, r, testSpec(ws))
	st, _ := r.Status(ws)
	sh(t, r, ws, "echo kept > /root/f && sync")
	sh(t, r, ws, "(sleep 1000 &) ; (sleep 1000 &)")
	t0 := time.Now()
	if err := r.Stop(ctx, ws, true); err != nil {
		t.Fatalf("force stop: %v", err)
	}
	t.Logf("forced stop: %v", time.Since(t0))
	if processAlive(st.PID) {
		t.Error("PID 1 alive after forced stop")
	}
	assertNoLeaks(t, root)
	// Nothing left: a forced stop is a no-op, a normal one says so.
	if err := r.Stop(ctx, ws, true); err != nil {
		t.Errorf("forced stop without execution: %v", err)
	}
	if err := r.Stop(ctx, ws, false); !errors.Is(err, ErrNotRunning) {
		t.Errorf("normal stop without execution: %v", err)
	}
	// The layer was kept.
	start(t, r, testSpec(ws))
	if got := sh(t, r, ws, "cat /root/f"); got != "kept\n" {
		t.Errorf("after forced stop and start: %q", got)
	}
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, root)
}

func TestWritebackFailureKeepsExecution(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	const ws = "ws-frozen"
	start(t, r, testSpec(ws))
	st, _ := r.Status(ws)
	freeze(t, st.PID)
	t0 := time.Now()
	err := r.Stop(ctx, ws, false)
	if !errors.Is(err, ErrWritebackFailed) {
		t.Fatalf("normal stop of a frozen guest = %v, want ErrWritebackFailed", err)
	}
	t.Logf("normal stop failed after %v: %v", time.Since(t0), err)
	if !processAlive(st.PID) {
		t.Fatal("the execution was killed")
	}
	if st2, ok := r.Status(ws); !ok || !st2.Running || st2.PID != st.PID {
		t.Fatalf("execution not held after the failed stop: %+v", st2)
	}
	if _, err := os.Stat(r.statePath(ws)); err != nil {
		t.Fatalf("execution record gone: %v", err)
	}
	// FORCE releases it, frozen or not.
	t0 = time.Now()
	if err := r.Stop(ctx, ws, true); err != nil {
		t.Fatalf("force stop: %v", err)
	}
	t.Logf("forced stop of a frozen guest: %v", time.Since(t0))
	if processAlive(st.PID) {
		t.Fatal("PID 1 alive after forced stop")
	}
	assertNoLeaks(t, root)
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
}

func TestForceSupersedesNormalStop(t *testing.T) {
	r, root := newRuntime(t, func(c *Config) { c.WritebackTimeout = 20 * time.Second })
	ctx := context.Background()
	const ws = "ws-supersede"
	start(t, r, testSpec(ws))
	st, _ := r.Status(ws)
	freeze(t, st.PID)
	normal := make(chan error, 1)
	go func() { normal <- r.Stop(ctx, ws, false) }()
	time.Sleep(300 * time.Millisecond)
	t0 := time.Now()
	if err := r.Stop(ctx, ws, true); err != nil {
		t.Fatalf("force stop: %v", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("force waited %v for the normal stop", d)
	}
	if err := <-normal; !errors.Is(err, ErrStopSuperseded) {
		t.Errorf("normal stop = %v, want ErrStopSuperseded", err)
	}
	assertNoLeaks(t, root)
	_ = r.Delete(ctx, ws)
}

func TestExitedExecutionIsReleased(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	const ws = "ws-crash"
	start(t, r, testSpec(ws))
	st, _ := r.Status(ws)
	if err := unix.Kill(st.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, r, 15*time.Second, func(ev Event) bool { return ev.WorkspaceID == ws && ev.Kind != EventCondition })
	if ev.Kind != EventExited || ev.Err != nil || ev.Generation != 1 {
		t.Fatalf("event %+v", ev)
	}
	assertNoLeaks(t, root)
	// A forced stop of an execution that is already gone is fine.
	if err := r.Stop(ctx, ws, true); err != nil {
		t.Errorf("force stop after exit: %v", err)
	}
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
}

func TestGuestPoweroff(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	for _, c := range []struct{ ws, how string }{
		{"ws-poweroff", "busybox poweroff"},
		{"ws-sigterm", "kill -TERM 1"},
		{"ws-shutdown", "request"},
	} {
		start(t, r, testSpec(c.ws))
		sh(t, r, c.ws, "echo data > /root/f")
		if c.how == "request" {
			if err := r.Poweroff(ctx, c.ws); err != nil {
				t.Fatal(err)
			}
		} else {
			_, _, _, _ = r.Exec(ctx, c.ws, []string{"sh", "-c", c.how})
		}
		ev := waitEvent(t, r, 15*time.Second, func(ev Event) bool { return ev.WorkspaceID == c.ws && ev.Kind != EventCondition })
		if ev.Kind != EventGuestExited || ev.Err != nil {
			t.Fatalf("%s: event %+v", c.how, ev)
		}
		assertNoLeaks(t, root)
		start(t, r, testSpec(c.ws))
		if got := sh(t, r, c.ws, "cat /root/f"); got != "data\n" {
			t.Errorf("%s: data after power-off: %q", c.how, got)
		}
		if err := r.Delete(ctx, c.ws); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMemoryLimitOOM(t *testing.T) {
	r, _ := newRuntime(t)
	ctx := context.Background()
	const ws = "ws-oom"
	s := testSpec(ws)
	s.MemoryMiB = 64
	start(t, r, s)
	defer r.Delete(ctx, ws)
	stats, err := r.Stats(ws)
	if err != nil {
		t.Fatal(err)
	}
	if stats.MemoryLimitBytes != 64<<20 {
		t.Fatalf("memory limit %d", stats.MemoryLimitBytes)
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, serr, code, err := r.Exec(cctx, ws, []string{"sh", "-c", `x=$(head -c 300000000 /dev/zero | tr "\0" a); echo survived ${#x}`})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("allocation: exit %d stdout %q stderr %q", code, out, serr)
	if code == 0 {
		t.Fatal("allocating 300 MB in a 64 MiB workspace succeeded")
	}
	stats, err = r.Stats(ws)
	if err != nil {
		t.Fatal(err)
	}
	if stats.OOMKills == 0 {
		t.Errorf("no OOM kill recorded: %+v", stats)
	}
	t.Logf("cgroup after OOM: %+v", stats)
	// PID 1 and the workspace survive; so does this process (the node).
	if got := sh(t, r, ws, "echo alive"); got != "alive\n" {
		t.Errorf("after OOM: %q", got)
	}
	if st, _ := r.Status(ws); !st.Running {
		t.Error("execution ended by the OOM")
	}
}

func TestCPUQuotaRoundsUpToVCPUs(t *testing.T) {
	r, _ := newRuntime(t)
	ctx := context.Background()
	for _, c := range []struct {
		millis uint32
		vcpus  int64
	}{{1500, 2}, {1000, 1}, {1, 1}} {
		ws := fmt.Sprintf("ws-cpu-%d", c.millis)
		s := testSpec(ws)
		s.CPUMillis = c.millis
		s.PidsMax = 321
		start(t, r, s)
		stats, err := r.Stats(ws)
		if err != nil {
			t.Fatal(err)
		}
		if stats.CPUPeriodMicros == 0 || stats.CPUQuotaMicros != c.vcpus*int64(stats.CPUPeriodMicros) {
			t.Errorf("cpu_millis %d: quota %d period %d, want %d vCPUs", c.millis, stats.CPUQuotaMicros, stats.CPUPeriodMicros, c.vcpus)
		}
		if stats.PidsMax != 321 {
			t.Errorf("pids max %d", stats.PidsMax)
		}
		if err := r.Delete(ctx, ws); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAdoptAfterAgentRestart(t *testing.T) {
	r1, root := newRuntime(t)
	ctx := context.Background()
	const ws, wsDead, wsGone = "ws-adopt", "ws-adopt-dead", "ws-adopt-off"
	s := testSpec(ws)
	s.Generation = 7
	start(t, r1, s)
	start(t, r1, testSpec(wsDead))
	start(t, r1, testSpec(wsGone))
	sh(t, r1, ws, "echo before > /root/f; (sleep 1000 &)")
	before, _ := r1.Status(ws)
	startTime, _ := procStartTime(before.PID)
	dead, _ := r1.Status(wsDead)
	gone, _ := r1.Status(wsGone)
	// The agent goes away; the executions do not.
	r1.Close()
	time.Sleep(300 * time.Millisecond)
	if !processAlive(before.PID) {
		t.Fatal("closing the runtime killed the execution")
	}
	// While no agent runs, one execution dies and one guest powers off
	// (its notice waits in the channel, PID 1 for the node).
	if err := unix.Kill(dead.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(gone.PID, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)

	r2, err := New(Config{Root: root, GuestBinary: testGuest, Log: r1.cfg.Log, HealthInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if err := r2.Adopt(ctx); err != nil {
		t.Fatalf("adopt: %v", err)
	}
	execs := r2.Executions()
	if len(execs) != 1 || execs[0].WorkspaceID != ws || execs[0].PID != before.PID || !execs[0].Running || execs[0].Generation != 7 || execs[0].Guest != GuestReady {
		t.Fatalf("adopted: %+v", execs)
	}
	if st, _ := procStartTime(before.PID); st != startTime {
		t.Fatal("PID 1 was replaced")
	}
	if got := sh(t, r2, ws, "cat /root/f; ps | grep -c \"[s]leep 1000\""); got != "before\n1\n" {
		t.Errorf("after adoption: %q", got)
	}
	// The ended executions are reported and released.
	got := map[string]EventKind{}
	for len(got) < 2 {
		ev := waitEvent(t, r2, 10*time.Second, func(ev Event) bool { return ev.Kind != EventCondition })
		got[ev.WorkspaceID] = ev.Kind
	}
	if got[wsDead] != EventExited || got[wsGone] != EventGuestExited {
		t.Errorf("events after adoption: %v", got)
	}
	// A second Adopt changes nothing.
	if err := r2.Adopt(ctx); err != nil {
		t.Fatal(err)
	}
	if execs := r2.Executions(); len(execs) != 1 || execs[0].PID != before.PID {
		t.Fatalf("second adopt: %+v", execs)
	}
	// The adopted execution stops normally, and its end is observed.
	if err := r2.Stop(ctx, ws, false); err != nil {
		t.Fatalf("stop after adoption: %v", err)
	}
	if processAlive(before.PID) {
		t.Fatal("still alive after stop")
	}
	for _, w := range []string{ws, wsDead, wsGone} {
		if err := r2.Delete(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	assertNoLeaks(t, root)
}

// TestAdoptReleasesHalfStartedExecution: the agent died before a start
// completed, with the pid in the record or (before the guest answered, the
// running record being the first with one) without it; the new agent
// releases the execution either way, the second through the cgroup the
// shim was born in.
func TestAdoptReleasesHalfStartedExecution(t *testing.T) {
	for _, keepPID := range []bool{true, false} {
		t.Run(map[bool]string{true: "with pid", false: "without pid"}[keepPID], func(t *testing.T) {
			r1, root := newRuntime(t)
			ctx := context.Background()
			const ws = "ws-half"
			start(t, r1, testSpec(ws))
			st, _ := r1.Status(ws)
			r1.Close()
			rec, err := r1.readState(ws)
			if err != nil {
				t.Fatal(err)
			}
			pidStart := rec.PIDStart
			rec.Phase = phaseStarting
			if !keepPID {
				rec.PID, rec.PIDStart = 0, 0
			}
			if err := r1.writeState(rec); err != nil {
				t.Fatal(err)
			}
			r2, err := New(Config{Root: root, GuestBinary: testGuest, Log: r1.cfg.Log})
			if err != nil {
				t.Fatal(err)
			}
			defer r2.Close()
			if err := r2.Adopt(ctx); err != nil {
				t.Fatal(err)
			}
			if len(r2.Executions()) != 0 {
				t.Fatalf("half-started execution adopted: %+v", r2.Executions())
			}
			// The test process is the shim's parent: a zombie of it is gone
			// for us, so compare start times, not mere existence.
			running := func() bool {
				s, err := procStartTime(st.PID)
				return err == nil && s == pidStart && processAlive(st.PID)
			}
			deadline := time.Now().Add(5 * time.Second)
			for running() && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if running() {
				t.Fatal("half-started execution still running")
			}
			assertNoLeaks(t, root)
			if err := r2.Delete(ctx, ws); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestResizeKeepsData(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	const ws = "ws-resize"
	if err := r.Resize(ctx, ws, 128<<20); !errors.Is(err, ErrNoLayer) {
		t.Errorf("resize without layer: %v", err)
	}
	start(t, r, testSpec(ws))
	sh(t, r, ws, "dd if=/dev/urandom of=/root/blob bs=1M count=8 2>/dev/null && md5sum /root/blob > /root/blob.md5")
	if err := r.Resize(ctx, ws, 128<<20); !errors.Is(err, ErrRunning) {
		t.Errorf("resize while running: %v", err)
	}
	if err := r.Stop(ctx, ws, false); err != nil {
		t.Fatal(err)
	}
	if err := r.Resize(ctx, ws, 32<<20); !errors.Is(err, ErrCapacity) {
		t.Errorf("shrink: %v", err)
	}
	if err := r.Resize(ctx, ws, 100<<20+1); !errors.Is(err, ErrCapacity) {
		t.Errorf("not whole MiB: %v", err)
	}
	if err := r.Resize(ctx, ws, 64<<20); err != nil {
		t.Errorf("same size: %v", err)
	}
	t0 := time.Now()
	if err := r.Resize(ctx, ws, 256<<20); err != nil {
		t.Fatalf("grow: %v", err)
	}
	t.Logf("resize 64 → 256 MiB: %v", time.Since(t0))
	fi, err := os.Stat(r.LayerPath(ws))
	if err != nil || fi.Size() != 256<<20 {
		t.Fatalf("layer after resize: %v %d", err, fi.Size())
	}
	if fs, err := ext4Size(r.LayerPath(ws)); err != nil || fs != 256<<20 {
		t.Fatalf("filesystem after resize: %d %v", fs, err)
	}
	start(t, r, testSpec(ws)) // the spec's smaller capacity does not shrink it
	sh(t, r, ws, "md5sum -c /root/blob.md5 >/dev/null")
	total := strings.Fields(sh(t, r, ws, "df -k / | tail -1"))
	if len(total) < 2 || len(total[1]) < 6 { // at least 100000 KiB
		t.Errorf("df after resize: %v", total)
	}
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, root)
}

func TestGuestConditions(t *testing.T) {
	r, _ := newRuntime(t)
	ctx := context.Background()
	const ws = "ws-cond"
	s := testSpec(ws)
	s.CapacityBytes = 32 << 20
	start(t, r, s)
	defer r.Delete(ctx, ws)

	// A full writable layer.
	_, _, _, _ = r.Exec(ctx, ws, []string{"sh", "-c", "dd if=/dev/zero of=/root/fill bs=1M 2>/dev/null; sync"})
	ev := waitEvent(t, r, 10*time.Second, func(ev Event) bool { return ev.Kind == EventCondition && ev.WorkspaceID == ws })
	if ev.Condition != GuestDiskPressure {
		t.Fatalf("condition after filling the layer: %+v", ev)
	}
	sh(t, r, ws, "rm /root/fill; sync")
	ev = waitEvent(t, r, 10*time.Second, func(ev Event) bool { return ev.Kind == EventCondition && ev.WorkspaceID == ws })
	if ev.Condition != GuestReady {
		t.Fatalf("condition after freeing: %+v", ev)
	}

	// A frozen guest becomes UNRESPONSIVE, then READY again.
	st, _ := r.Status(ws)
	freeze(t, st.PID)
	ev = waitEvent(t, r, 10*time.Second, func(ev Event) bool { return ev.Kind == EventCondition && ev.WorkspaceID == ws })
	if ev.Condition != GuestUnresponsive {
		t.Fatalf("frozen guest: %+v", ev)
	}
	if err := unix.Kill(st.PID, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
	ev = waitEvent(t, r, 10*time.Second, func(ev Event) bool { return ev.Kind == EventCondition && ev.WorkspaceID == ws })
	if ev.Condition != GuestReady {
		t.Fatalf("thawed guest: %+v", ev)
	}
}

func TestInvalidSpecs(t *testing.T) {
	r, _ := newRuntime(t)
	ctx := context.Background()
	for name, mod := range map[string]func(*Spec){
		"bad id":        func(s *Spec) { s.WorkspaceID = "../x" },
		"no template":   func(s *Spec) { s.TemplateDir = "/nonexistent" },
		"relative tmpl": func(s *Spec) { s.TemplateDir = "rootfs" },
		"odd capacity":  func(s *Spec) { s.CapacityBytes = 64<<20 + 5 },
		"tiny capacity": func(s *Spec) { s.CapacityBytes = 1 << 20 },
		"no cpu":        func(s *Spec) { s.CPUMillis = 0 },
		"no memory":     func(s *Spec) { s.MemoryMiB = 0 },
	} {
		s := testSpec("ws-invalid")
		mod(&s)
		err := r.Start(ctx, s)
		if !errors.Is(err, ErrInvalidSpec) && !errors.Is(err, ErrCapacity) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := os.Stat(r.LayerPath("ws-invalid")); !errors.Is(err, os.ErrNotExist) {
		t.Error("an invalid spec made a layer")
	}
}

func TestStartFailureRollsBack(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	const ws = "ws-badroot"
	// A template whose /run is a file: the shim refuses to mount over it.
	bad := filepath.Join(root, "badtemplate")
	if err := os.MkdirAll(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "run"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := testSpec(ws)
	s.TemplateDir = bad
	err := r.Start(ctx, s)
	if !errors.Is(err, ErrStart) || !strings.Contains(err.Error(), "/run") {
		t.Fatalf("start on a broken template: %v", err)
	}
	assertNoLeaks(t, root)
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
}

func execReq(argv []string, stdin []byte, env []string, dir string) protocol.ExecRequest {
	return protocol.ExecRequest{Argv: argv, Stdin: stdin, Env: env, Dir: dir}
}

func TestConcurrentExecutions(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	const n = 12 // more than the 8 loop devices the kernel makes up front
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			s := testSpec(fmt.Sprintf("ws-par-%02d", i))
			s.MemoryMiB = 64
			errs <- r.Start(ctx, s)
		}(i)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := len(r.Executions()); got != n {
		t.Fatalf("%d executions", got)
	}
	loops := map[string]bool{}
	for i := 0; i < n; i++ {
		ws := fmt.Sprintf("ws-par-%02d", i)
		if got := strings.TrimSpace(sh(t, r, ws, "hostname")); got != ws {
			t.Errorf("hostname %q in %s", got, ws)
		}
		rec, err := r.readState(ws)
		if err != nil {
			t.Fatal(err)
		}
		if loops[rec.Loop] {
			t.Errorf("loop device %s used twice", rec.Loop)
		}
		loops[rec.Loop] = true
	}
	for i := 0; i < n; i++ {
		go func(i int) {
			ws := fmt.Sprintf("ws-par-%02d", i)
			if i%2 == 0 {
				errs <- r.Stop(ctx, ws, i%4 == 0)
			} else {
				errs <- r.Delete(ctx, ws)
			}
		}(i)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	assertNoLeaks(t, root)
	for i := 0; i < n; i++ {
		if err := r.Delete(ctx, fmt.Sprintf("ws-par-%02d", i)); err != nil {
			t.Error(err)
		}
	}
}
