package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/node/sandbox/initshim"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// The guest is untrusted: root inside a workspace is whoever the caller is,
// and PID 1 may be subverted. These tests play the workspace's root (with
// the testdata/hostile helper in the template) and a subverted PID 1 (the
// helper as the runtime's guest binary). Each attack ends in a bounded
// refusal and at worst that one workspace UNRESPONSIVE or ended; nothing of
// the host is read, written or held.

var (
	hostileOnce sync.Once
	hostileBin  string // testdata/hostile, static
	hostileTmpl string // the default template with hostileBin at /usr/bin/hostile
	hostileErr  error
)

// hostileSetup builds the helper and a template that holds it.
func hostileSetup(tb testing.TB) (bin, tmpl string) {
	tb.Helper()
	requireSandbox(tb)
	hostileOnce.Do(func() {
		dir := filepath.Join(testBase, "hostile")
		hostileBin = filepath.Join(dir, "hostile")
		build := exec.Command("go", "build", "-trimpath", "-o", hostileBin, "./testdata/hostile")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			hostileErr = fmt.Errorf("build testdata/hostile: %v\n%s", err, out)
			return
		}
		hostileTmpl = filepath.Join(dir, "rootfs")
		if err := os.MkdirAll(hostileTmpl, 0o755); err != nil {
			hostileErr = err
			return
		}
		if out, err := exec.Command("cp", "-a", testTemplate+"/.", hostileTmpl+"/").CombinedOutput(); err != nil {
			hostileErr = fmt.Errorf("copy the template: %v\n%s", err, out)
			return
		}
		if out, err := exec.Command("cp", hostileBin, filepath.Join(hostileTmpl, "usr/bin/hostile")).CombinedOutput(); err != nil {
			hostileErr = fmt.Errorf("install the helper: %v\n%s", err, out)
		}
	})
	if hostileErr != nil {
		tb.Fatal(hostileErr)
	}
	return hostileBin, hostileTmpl
}

// capturedLog is the runtime's log, kept for inspection and shown in the
// test's log.
type capturedLog struct {
	tb  testing.TB
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *capturedLog) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.buf.Write(p)
	c.mu.Unlock()
	c.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (c *capturedLog) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// hostileRuntime is newRuntime with the default template swapped for the
// helper's, and the log captured.
func hostileRuntime(t *testing.T, mod ...func(*Config)) (*Runtime, string, *capturedLog, func(string) Spec) {
	t.Helper()
	_, tmpl := hostileSetup(t)
	logs := &capturedLog{tb: t}
	mod = append([]func(*Config){func(c *Config) {
		c.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}}, mod...)
	r, root := newRuntime(t, mod...)
	spec := func(ws string) Spec {
		s := testSpec(ws)
		s.TemplateDir = tmpl
		return s
	}
	return r, root, logs, spec
}

// within runs fn and fails the test when it takes longer than d.
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	t0 := time.Now()
	fn()
	if took := time.Since(t0); took > d {
		t.Errorf("%s took %v, more than %v", what, took, d)
	}
}

// run runs a command in ws and returns its stdout and exit code.
func run(t *testing.T, r *Runtime, ws string, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, serr, code, err := r.Exec(ctx, ws, argv)
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return string(out) + string(serr), code
}

const hostSecret = "KIBOTOS-HOST-SECRET-4711"

// hostSecretFile writes hostSecret into a file of the host, beside root.
func hostSecretFile(t *testing.T, root string) string {
	t.Helper()
	p := filepath.Join(filepath.Dir(root), filepath.Base(root)+"-ca.key")
	if err := os.WriteFile(p, []byte(hostSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	return p
}

// Finding 1: the node read a power-off marker from a directory the guest
// writes. Now it reads no path at all: the guest's power-off is a notice on
// the channel. Whatever the workspace leaves where the marker was
// (symlinks to host secrets and to /dev/zero, a FIFO), a power-off is
// reported at once, forced stops and re-adoption do not hang, and nothing
// of the host ends up in the log or the events.
func TestHostilePoweroffMarker(t *testing.T) {
	r, root, logs, spec := hostileRuntime(t)
	ctx := context.Background()
	secret := hostSecretFile(t, root)
	plant := func(ws, marker string) {
		t.Helper()
		script := "mkdir -p /run/kibotos/sock && cd /run/kibotos/sock && rm -f poweroff && "
		switch marker {
		case "symlink":
			script += "ln -s " + secret + " poweroff"
		case "fifo":
			script += "mkfifo poweroff"
		case "zero":
			script += "ln -s /dev/zero poweroff"
		}
		sh(t, r, ws, script)
	}
	for _, marker := range []string{"symlink", "fifo", "zero"} {
		ws := "ws-marker-" + marker
		start(t, r, spec(ws))
		plant(ws, marker)
		within(t, 10*time.Second, "power-off with a "+marker+" marker", func() {
			_, _, _, _ = r.Exec(ctx, ws, []string{"kill", "-TERM", "1"})
			ev := waitEvent(t, r, 10*time.Second, func(ev Event) bool { return ev.WorkspaceID == ws && ev.Kind != EventCondition })
			if ev.Kind != EventGuestExited || ev.Err != nil || strings.Contains(ev.Message, hostSecret) {
				t.Errorf("%s: event %+v", marker, ev)
			}
		})
		assertNoLeaks(t, root)
		// A forced stop with the marker planted.
		start(t, r, spec(ws))
		plant(ws, marker)
		within(t, 5*time.Second, "forced stop with a "+marker+" marker", func() {
			if err := r.Stop(ctx, ws, true); err != nil {
				t.Errorf("%s: forced stop: %v", marker, err)
			}
		})
		assertNoLeaks(t, root)
	}

	// A power-off while no node runs, with a FIFO planted: the new node
	// adopts at once and reports the power-off.
	const ws = "ws-marker-adopt"
	start(t, r, spec(ws))
	plant(ws, "fifo")
	st, _ := r.Status(ws)
	r.Close()
	if err := unix.Kill(st.PID, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	r2, err := New(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	within(t, 5*time.Second, "Adopt after a power-off with a FIFO marker", func() {
		if err := r2.Adopt(ctx); err != nil {
			t.Errorf("adopt: %v", err)
		}
	})
	ev := waitEvent(t, r2, 5*time.Second, func(ev Event) bool { return ev.WorkspaceID == ws && ev.Kind != EventCondition })
	if ev.Kind != EventGuestExited || ev.Err != nil {
		t.Errorf("event after adoption: %+v", ev)
	}
	if len(r2.Executions()) != 0 {
		t.Errorf("executions after adoption: %+v", r2.Executions())
	}
	assertNoLeaks(t, root)
	if strings.Contains(logs.String(), hostSecret) {
		t.Error("the host's secret is in the node's log")
	}
	for _, w := range []string{"ws-marker-symlink", "ws-marker-fifo", "ws-marker-zero", ws} {
		if err := r2.Delete(ctx, w); err != nil {
			t.Error(err)
		}
	}
}

// Findings 2 and 3: the socket directory was a writable host directory,
// and the node dialled a socket path the guest controlled. Now nothing of
// the host is mounted writable into the workspace (/run is the
// workspace's own tmpfs, bounded), and the node dials no path: a socket or
// symlink the workspace puts anywhere changes nothing.
func TestHostileSocketDirectory(t *testing.T) {
	r, root, _, spec := hostileRuntime(t)
	ctx := context.Background()
	const ws = "ws-sockdir"
	start(t, r, spec(ws))
	defer r.Delete(ctx, ws)

	// A host socket that must never be dialled, and a symlink to it and a
	// spoofing guest at the old socket path.
	hostSock := filepath.Join(root, "host.sock")
	ln, err := net.Listen("unix", hostSock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialled := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			dialled <- struct{}{}
		}
	}()
	sh(t, r, ws, "mkdir -p /run/kibotos/sock && ln -s "+hostSock+" /run/kibotos/sock/guest.sock")
	sh(t, r, ws, "mkdir -p /run/kibotos/spoof && (hostile serve /run/kibotos/spoof/guest.sock >/tmp/serve.log 2>&1 &) ; sleep 0.2; grep -q listening /tmp/serve.log")
	sh(t, r, ws, "ln -s /run/kibotos/spoof /run/kibotos/sock2")

	// Filling /run stops at its size, in the workspace's memory.
	out, code := run(t, r, ws, "sh", "-c", "dd if=/dev/zero of=/run/kibotos/sock/fill bs=1M count=64 2>&1; df -k /run | tail -1")
	if code == 0 && !strings.Contains(out, "No space left") {
		t.Errorf("64 MiB into /run: %s", out)
	}
	if mi := sh(t, r, ws, "grep -c ' /run' /proc/self/mountinfo"); strings.TrimSpace(mi) != "1" {
		t.Errorf("mounts at or under /run: %s", mi)
	}

	// The node's pings and requests still reach the real guest.
	time.Sleep(3 * r.cfg.HealthInterval)
	if st, _ := r.Status(ws); st.Guest != GuestReady || strings.Contains(st.GuestMessage, "spoofed") {
		t.Errorf("status after the spoofing: %+v", st)
	}
	if got := strings.TrimSpace(sh(t, r, ws, "echo real")); got != "real" {
		t.Errorf("exec after the spoofing: %q", got)
	}
	if err := r.Stop(ctx, ws, false); err != nil {
		t.Errorf("normal stop after the spoofing: %v", err)
	}
	select {
	case <-dialled:
		t.Error("the node dialled the host socket the workspace linked to")
	default:
	}
	// Nothing was written on the host's disk (the run directory holds the
	// two mount points only, while running and after).
	start(t, r, spec(ws))
	sh(t, r, ws, "dd if=/dev/zero of=/run/fill bs=1M count=8 2>/dev/null; true")
	var files []string
	_ = filepath.WalkDir(r.runDir(ws), func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != r.runDir(ws) {
			files = append(files, strings.TrimPrefix(p, r.runDir(ws)))
		}
		return nil
	})
	if strings.Join(files, " ") != "/layer /root" {
		t.Errorf("the run directory on the host holds %v", files)
	}
}

// Finding 5: PID 1 held the host's log file and could be traced by the
// workspace's root. Now its output is a pipe, and it is not dumpable: its
// descriptors, memory and root are out of reach, and so is ptrace.
func TestHostilePID1(t *testing.T) {
	r, _, _, spec := hostileRuntime(t)
	ctx := context.Background()
	const ws = "ws-pid1"
	start(t, r, spec(ws))
	defer r.Delete(ctx, ws)
	st, _ := r.Status(ws)
	logBefore, _ := os.ReadFile(r.LogPath(ws))
	for _, script := range []string{
		"readlink /proc/1/fd/1",
		"echo " + hostSecret + " >> /proc/1/fd/1",
		"echo " + hostSecret + " >> /proc/1/fd/2",
		": > /proc/1/fd/1",
		"cat /proc/1/environ",
		"ls /proc/1/root/",
		"ls /proc/1/cwd/",
		"head -c 1 /proc/1/mem",
		"cat /proc/1/maps",
	} {
		if out, code := run(t, r, ws, "sh", "-c", script); code == 0 {
			t.Errorf("%q succeeded: %s", script, out)
		}
	}
	for _, argv := range [][]string{
		{"hostile", "ptrace-attach", "1"},
		{"hostile", "pidfd-getfd", "1", strconv.Itoa(protocol.NodeChannelFD)},
		{"hostile", "pidfd-getfd", "1", "1"},
	} {
		if out, _ := run(t, r, ws, argv...); strings.TrimSpace(out) != "operation not permitted" {
			t.Errorf("%q: %s", argv, out)
		}
	}
	// The log on the host is the node's copy of the pipe: not grown or
	// truncated by the workspace.
	logAfter, _ := os.ReadFile(r.LogPath(ws))
	if bytes.Contains(logAfter, []byte(hostSecret)) || len(logAfter) < len(logBefore) {
		t.Errorf("the guest log changed under the workspace's writes: %d → %d bytes", len(logBefore), len(logAfter))
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.PID)); err != nil || !bytes.Contains(b, []byte("\nNoNewPrivs:\t1\n")) {
		t.Errorf("PID 1's status: %v\n%s", err, b)
	}
}

// Finding 7: AF_VSOCK is not isolated by the network namespace, and raw and
// packet sockets were allowed. Inside a real workspace, under its real
// filter, creating them is refused; ordinary sockets still work. The
// sockets are only created: a vsock port is never bound or connected (the
// machine's own services use vsock).
func TestHostileSockets(t *testing.T) {
	r, _, _, spec := hostileRuntime(t)
	ctx := context.Background()
	const ws = "ws-sockets"
	start(t, r, spec(ws))
	defer r.Delete(ctx, ws)
	for _, tc := range []struct {
		name        string
		family, typ int
		want        string
	}{
		{"vsock stream", unix.AF_VSOCK, unix.SOCK_STREAM, "address family not supported by protocol"},
		{"vsock datagram", unix.AF_VSOCK, unix.SOCK_DGRAM, "address family not supported by protocol"},
		{"packet", unix.AF_PACKET, unix.SOCK_RAW, "address family not supported by protocol"},
		{"raw IPv4", unix.AF_INET, unix.SOCK_RAW, "operation not permitted"},
		{"raw IPv6", unix.AF_INET6, unix.SOCK_RAW, "operation not permitted"},
		{"TCP", unix.AF_INET, unix.SOCK_STREAM, "ok"},
		{"UDP", unix.AF_INET6, unix.SOCK_DGRAM, "ok"},
		{"unix", unix.AF_UNIX, unix.SOCK_STREAM, "ok"},
	} {
		out, _ := run(t, r, ws, "hostile", "socket", strconv.Itoa(tc.family), strconv.Itoa(tc.typ))
		if got := strings.TrimSpace(out); got != tc.want {
			t.Errorf("%s: socket(%d, %d) inside: %q, want %q", tc.name, tc.family, tc.typ, got, tc.want)
		}
	}
}

// Finding 6: descriptors the node inherited leaked into every PID 1. Now
// the shim closes everything but 0-2 and the channel's three at its exec.
func TestHostileInheritedDescriptor(t *testing.T) {
	r, _, _, spec := hostileRuntime(t)
	ctx := context.Background()
	// An open directory without close-on-exec, as a careless parent of the
	// node would leave it: inherited by the shim, it would be an escape.
	dfd, err := unix.Open(testBase, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	const leaked = 100
	if err := unix.Dup2(dfd, leaked); err != nil {
		t.Fatal(err)
	}
	unix.Close(dfd)
	defer unix.Close(leaked)
	const ws = "ws-leak"
	start(t, r, spec(ws))
	defer r.Delete(ctx, ws)
	st, _ := r.Status(ws)
	dir := fmt.Sprintf("/proc/%d/fd", st.PID)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]string{0: "char", 1: "pipe", 2: "pipe", protocol.ChannelFD: "socket", protocol.NodeChannelFD: "socket", protocol.LogReadFD: "pipe"}
	for _, e := range ents {
		fd, _ := strconv.Atoi(e.Name())
		link, _ := os.Readlink(filepath.Join(dir, e.Name()))
		var s unix.Stat_t
		_ = unix.Stat(filepath.Join(dir, e.Name()), &s)
		kind := map[uint32]string{unix.S_IFCHR: "char", unix.S_IFIFO: "pipe", unix.S_IFSOCK: "socket", unix.S_IFDIR: "dir", unix.S_IFREG: "file"}[s.Mode&unix.S_IFMT]
		t.Logf("PID 1 fd %d: %s (%s)", fd, link, kind)
		if w, ok := want[fd]; ok {
			if kind != w {
				t.Errorf("fd %d of PID 1 is %s (%s), want a %s", fd, link, kind, w)
			}
			delete(want, fd)
			continue
		}
		// The guest's own runtime (epoll, eventfd) and its connections.
		if !strings.HasPrefix(link, "anon_inode:") && kind != "socket" {
			t.Errorf("PID 1 holds fd %d: %s (%s)", fd, link, kind)
		}
	}
	if len(want) > 0 {
		t.Errorf("PID 1 lacks %v", want)
	}
	// A command of the workspace has 0-2 only (and ls its directory).
	if got := strings.Fields(sh(t, r, ws, "ls /proc/self/fd")); len(got) > 4 {
		t.Errorf("a command's descriptors: %v", got)
	}
}

// The masked and read-only paths of /proc and /sys, the capabilities, the
// system call filter and no_new_privs, and a mountinfo without host paths,
// as the workspace's root sees them.
func TestHostileConfinement(t *testing.T) {
	bin, tmpl := hostileSetup(t)
	r, root, _, spec := hostileRuntime(t)
	ctx := context.Background()
	const ws = "ws-confined"
	start(t, r, spec(ws))
	defer r.Delete(ctx, ws)

	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/kallsyms",
		"/proc/kpageflags", "/proc/kpagecount", "/proc/kpagecgroup", "/proc/slabinfo", "/proc/vmallocinfo",
		"/proc/latency_stats", "/proc/timer_stats", "/proc/interrupts"} {
		if out, code := run(t, r, ws, "sh", "-c", "test ! -e "+p+" || head -c 64 "+p+" | wc -c"); code != 0 || (strings.TrimSpace(out) != "0" && strings.TrimSpace(out) != "") {
			t.Errorf("%s reads %s bytes (exit %d)", p, strings.TrimSpace(out), code)
		}
	}
	for _, p := range []string{"/proc/acpi", "/proc/scsi", "/proc/asound", "/sys/firmware", "/sys/devices/virtual/powercap",
		"/sys/block", "/sys/devices/virtual/block"} {
		if out, code := run(t, r, ws, "sh", "-c", "test ! -e "+p+" || ls -A "+p); code != 0 || strings.TrimSpace(out) != "" {
			t.Errorf("%s lists %q (exit %d)", p, out, code)
		}
	}
	for _, script := range []string{"echo 1 > /proc/sys/vm/drop_caches", "echo h > /proc/sysrq-trigger", "touch /sys/firmware/x", "touch /proc/acpi/x"} {
		if out, code := run(t, r, ws, "sh", "-c", script); code == 0 {
			t.Errorf("%q succeeded: %s", script, out)
		}
	}

	// /proc/self/status of a command, and of PID 1.
	want := fmt.Sprintf("%016x", initshim.CapabilityMask())
	for _, who := range []string{"self", "1"} {
		status := sh(t, r, ws, "cat /proc/"+who+"/status")
		fields := map[string]string{}
		for _, l := range strings.Split(status, "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				fields[k] = strings.TrimSpace(v)
			}
		}
		for k, v := range map[string]string{"CapEff": want, "CapPrm": want, "CapBnd": want, "CapInh": "0000000000000000",
			"CapAmb": "0000000000000000", "Seccomp": "2", "NoNewPrivs": "1"} {
			if fields[k] != v {
				t.Errorf("/proc/%s/status: %s is %q, want %q", who, k, fields[k], v)
			}
		}
	}

	// No loop device's backing file (a host path) anywhere in /sys.
	if out := sh(t, r, ws, "find /sys -name backing_file 2>/dev/null; cat /sys/class/block/loop*/loop/backing_file /sys/dev/block/*/loop/backing_file 2>/dev/null; true"); strings.TrimSpace(out) != "" {
		t.Errorf("/sys shows loop backing files:\n%s", out)
	}

	// No host path in the mount table.
	mi := sh(t, r, ws, "cat /proc/self/mountinfo")
	t.Logf("mountinfo inside:\n%s", mi)
	for _, host := range []string{root, testBase, tmpl, testTemplate, bin, testGuest, filepath.Dir(testGuest), os.TempDir() + "/", "/dev/loop"} {
		if strings.Contains(mi, host) {
			t.Errorf("mountinfo inside names %s", host)
		}
	}
}

// Finding 12: the guest's reaper took a ptrace stop for an exit. A command
// that makes PID 1 its tracer (PTRACE_TRACEME) and execs is detached and
// runs on; its exit is its exit. (Where the system call filter refuses
// ptrace altogether, PID 1 cannot become a tracer, and the command only
// learns so; internal/guest tests the reaper without the filter.)
func TestHostileTracemeReaper(t *testing.T) {
	r, _, _, spec := hostileRuntime(t)
	ctx := context.Background()
	const ws = "ws-traceme"
	start(t, r, spec(ws))
	defer r.Delete(ctx, ws)
	var refused bool
	within(t, 10*time.Second, "a command that traces itself under PID 1", func() {
		out, code := run(t, r, ws, "hostile", "traceme-exec", "sh", "-c", "echo ran; exit 7")
		switch {
		case code == 1 && strings.TrimSpace(out) == "operation not permitted":
			refused = true
			t.Log("PTRACE_TRACEME is refused in the workspace")
		case code != 7 || strings.TrimSpace(out) != "ran":
			t.Errorf("traceme-exec: exit %d, output %q", code, out)
		}
	})
	if refused {
		return
	}
	// An orphan does the same (PID 1 becomes the tracer of a process it
	// did not start).
	sh(t, r, ws, "(hostile traceme-exec sh -c 'echo orphan > /tmp/orphan' &) ; true")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if out, _ := run(t, r, ws, "cat", "/tmp/orphan"); strings.TrimSpace(out) == "orphan" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orphan that traced itself under PID 1 never ran")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := sh(t, r, ws, "grep -l '^TracerPid:.*[1-9]' /proc/[0-9]*/status 2>/dev/null; true"); strings.TrimSpace(got) != "" {
		t.Errorf("processes still traced: %s", got)
	}
}

// A subverted PID 1 (the helper as the guest binary): one that floods,
// sends lines past their bound, stalls, lies about its condition, sends
// messages past their bound, floods its log, or swaps what it keeps for
// the node. Each makes its own workspace UNRESPONSIVE (or ended) within a
// bounded time, and a forced stop releases it.
func TestHostileGuest(t *testing.T) {
	bin, _ := hostileSetup(t)
	r, root := newRuntime(t, func(c *Config) {
		c.GuestBinary = bin
		c.InitBinary = "/proc/self/exe"
	})
	ctx := context.Background()
	unresponsive := func(t *testing.T, ws string) Event {
		t.Helper()
		var ev Event
		within(t, 8*time.Second, "UNRESPONSIVE", func() {
			ev = waitEvent(t, r, 8*time.Second, func(ev Event) bool { return ev.WorkspaceID == ws && ev.Kind == EventCondition })
		})
		if ev.Condition != GuestUnresponsive || len(ev.Message) > 2*protocol.MaxText {
			t.Errorf("event %+v", ev)
		}
		return ev
	}
	forceStop := func(t *testing.T, ws string) {
		t.Helper()
		within(t, 5*time.Second, "forced stop", func() {
			if err := r.Stop(ctx, ws, true); err != nil {
				t.Errorf("forced stop: %v", err)
			}
		})
		assertNoLeaks(t, root)
	}
	for _, mode := range []string{"flood", "huge", "stall", "lie"} {
		t.Run(mode, func(t *testing.T) {
			ws := "ws-guest-" + mode
			start(t, r, testSpec(ws))
			unresponsive(t, ws)
			st, _ := r.Status(ws)
			if len(st.GuestMessage) > 2*protocol.MaxText {
				t.Errorf("guest message of %d bytes", len(st.GuestMessage))
			}
			forceStop(t, ws)
		})
	}
	t.Run("longmsg", func(t *testing.T) {
		const ws = "ws-guest-longmsg"
		start(t, r, testSpec(ws))
		time.Sleep(3 * r.cfg.HealthInterval)
		st, _ := r.Status(ws)
		if st.Guest != GuestReady || len(st.GuestMessage) > protocol.MaxText {
			t.Errorf("status: %s, a message of %d bytes", st.Guest, len(st.GuestMessage))
		}
		forceStop(t, ws)
	})
	t.Run("notices", func(t *testing.T) {
		const ws = "ws-guest-notices"
		start(t, r, testSpec(ws))
		ev := waitEvent(t, r, 10*time.Second, func(ev Event) bool { return ev.WorkspaceID == ws && ev.Kind != EventCondition })
		if ev.Kind != EventGuestExited || len(ev.Message) > 2*protocol.MaxText {
			t.Errorf("event of %d bytes: %.200s", len(ev.Message), fmt.Sprintf("%+v", ev))
		}
		assertNoLeaks(t, root)
	})
	t.Run("logflood", func(t *testing.T) {
		const ws = "ws-guest-logflood"
		start(t, r, testSpec(ws))
		time.Sleep(3 * time.Second)
		var total int64
		for _, p := range []string{r.LogPath(ws), r.LogPath(ws) + ".1"} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Logf("%s: %v", p, err)
				continue
			}
			if fi.Size() > logMaxBytes {
				t.Errorf("%s: %d bytes", p, fi.Size())
			}
			total += fi.Size()
		}
		// 3 s at logRateBytes a second (and a read's worth more per
		// second), with room for a slow machine.
		if total > 6*logRateBytes {
			t.Errorf("%d bytes of log in 3s", total)
		}
		if total == 0 {
			t.Error("no log copied")
		}
		if st, _ := r.Status(ws); st.Guest != GuestReady {
			t.Errorf("status while flooding the log: %+v", st)
		}
		forceStop(t, ws)
		if err := r.Delete(ctx, ws); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{r.LogPath(ws), r.LogPath(ws) + ".1"} {
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s after delete: %v", p, err)
			}
		}
	})
	t.Run("swapfds", func(t *testing.T) {
		const ws = "ws-guest-swapfds"
		start(t, r, testSpec(ws))
		r.Close()
		r2, err := New(r.cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer r2.Close()
		within(t, 5*time.Second, "Adopt", func() {
			if err := r2.Adopt(ctx); err != nil {
				t.Errorf("adopt: %v", err)
			}
		})
		if st, ok := r2.Status(ws); !ok || !st.Running || st.Guest != GuestUnresponsive {
			t.Errorf("adopted: %+v", st)
		}
		within(t, 5*time.Second, "forced stop", func() {
			if err := r2.Stop(ctx, ws, true); err != nil {
				t.Errorf("forced stop: %v", err)
			}
		})
		assertNoLeaks(t, root)
	})
}

// A PID 1 (the helper as the guest binary) that fails the protocol version
// handshake of its first ping: it states another version, none, or one the
// node cannot decode. The start fails at once with a permanent
// ErrGuestProtocol that names both versions, nothing of the execution is
// left, and the workspace is never READY.
func TestHostileGuestProtocol(t *testing.T) {
	bin, _ := hostileSetup(t)
	r, root := newRuntime(t, func(c *Config) {
		c.GuestBinary = bin
		c.InitBinary = "/proc/self/exe"
	})
	v := strconv.Itoa(nodewire.GuestProtocolVersion)
	for mode, want := range map[string]string{
		"protoother":  "the guest speaks protocol " + strconv.Itoa(nodewire.GuestProtocolVersion+1) + ", the node " + v,
		"protonone":   "the guest states no protocol version",
		"protozero":   "the guest states no protocol version",
		"protostring": "the guest's answer is not of protocol " + v,
		"protohuge":   "the guest's answer is not of protocol " + v,
		"protoextra":  "the guest's answer is not of protocol " + v,
	} {
		t.Run(mode, func(t *testing.T) {
			ws := "ws-hs-" + mode
			var err error
			within(t, 10*time.Second, "Start", func() { err = r.Start(context.Background(), testSpec(ws)) })
			t.Logf("Start: %.300v", err)
			if !errors.Is(err, ErrGuestProtocol) || !Permanent(err) {
				t.Fatalf("Start = %v; want a permanent ErrGuestProtocol", err)
			}
			if !strings.Contains(err.Error(), want) || len(err.Error()) > protocol.MaxText+200 {
				t.Errorf("Start = %.300q (%d bytes); want it to say %q", err, len(err.Error()), want)
			}
			if st, ok := r.Status(ws); ok {
				t.Errorf("an execution held after a failed handshake: %+v", st)
			}
			assertNoLeaks(t, root)
		})
	}
}
