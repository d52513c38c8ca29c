package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/node/sandbox/initshim"
)

// statusFields parses /proc/PID/status.
func statusFields(s string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// hostProcOf finds the host PID of the process whose PID in its own
// namespace is nsPID and whose command line is cmdline (NUL-separated).
func hostProcOf(nsPID int32, cmdline string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || string(b) != cmdline {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		ns := strings.Fields(statusFields(string(st))["NSpid"])
		if len(ns) >= 2 && ns[len(ns)-1] == strconv.Itoa(int(nsPID)) {
			return pid
		}
	}
	return 0
}

// TestDataPlaneSecurityInside checks, from inside a real workspace and
// through the public ProcessService (the process started by the guest for
// the data plane), what isolates it: exactly the kept capabilities, the
// system call filter and no_new_privs; host IDs from the workspace's user
// namespace range; a PID namespace of its own; no host path among its
// mounts; the workspace's cgroup; no access to the guest's channel (PID 1's
// descriptors), to any unix socket of the workspace or of the host
// (abstract ones too), nor to ctrl's listener.
func TestDataPlaneSecurityInside(t *testing.T) {
	e := newDPEnv(t, "e2e-dpsec-ws")
	tok := e.token()
	ctx := t.Context()

	// Capabilities, seccomp, no_new_privs.
	st := statusFields(e.mustRun(tok, "cat", "/proc/self/status"))
	kept := fmt.Sprintf("%016x", initshim.CapabilityMask())
	for k, want := range map[string]string{"CapEff": kept, "CapPrm": kept, "CapBnd": kept,
		"CapInh": "0000000000000000", "CapAmb": "0000000000000000", "Seccomp": "2", "NoNewPrivs": "1"} {
		if st[k] != want {
			t.Errorf("inside, %s = %q, want %q", k, st[k], want)
		}
	}

	// As another user: no capabilities at all, the same bounding set.
	uid, gid := uint32(1000), uint32(1001)
	as, err := e.proc.StartProcess(ctx, bearer(&ctrlv1.StartProcessRequest{WorkspaceId: e.id, Argv: []string{"cat", "/proc/self/status"}, Uid: &uid, Gid: &gid}, tok))
	if err != nil {
		t.Fatal(err)
	}
	ar, err := dpEvents(ctx, e.proc, tok, &ctrlv1.ProcessEventsRequest{WorkspaceId: e.id, ProcessId: as.Msg.GetProcessId()})
	if err != nil || ar.exit.GetExitCode() != 0 {
		t.Fatalf("cat /proc/self/status as 1000:1001: %v, %v, %q", ar.exit, err, ar.stderr)
	}
	ast := statusFields(ar.stdout)
	for k, want := range map[string]string{"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": kept,
		"CapInh": "0000000000000000", "CapAmb": "0000000000000000", "Seccomp": "2", "NoNewPrivs": "1",
		"Uid": "1000\t1000\t1000\t1000", "Gid": "1001\t1001\t1001\t1001"} {
		if ast[k] != want {
			t.Errorf("inside as 1000:1001, %s = %q, want %q", k, ast[k], want)
		}
	}

	// A running process: its host view.
	sl, err := e.proc.StartProcess(ctx, bearer(&ctrlv1.StartProcessRequest{WorkspaceId: e.id, Argv: []string{"sleep", "31.4159"}}, tok))
	if err != nil {
		t.Fatal(err)
	}
	var host int
	for deadline := time.Now().Add(5 * time.Second); host == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		host = hostProcOf(sl.Msg.GetPid(), "sleep\x0031.4159\x00")
	}
	if host == 0 {
		t.Fatalf("no host process for pid %d inside", sl.Msg.GetPid())
	}
	hdir := "/proc/" + strconv.Itoa(host)
	b, err := os.ReadFile(hdir + "/uid_map")
	if err != nil {
		t.Fatal(err)
	}
	um := strings.Fields(string(b))
	if len(um) != 3 || um[0] != "0" || um[2] != "65536" {
		t.Fatalf("host view of the process's uid_map = %q, want one line 0 BASE 65536", b)
	}
	base, _ := strconv.ParseUint(um[1], 10, 32)
	if base == 0 {
		t.Fatalf("uid_map %q maps the workspace's root to the host's", b)
	}
	if inside := strings.Fields(e.mustRun(tok, "cat", "/proc/self/uid_map")); !slices.Equal(inside, um) {
		t.Errorf("uid_map inside = %q, host view %q", inside, um)
	}
	b, err = os.ReadFile(hdir + "/status")
	if err != nil {
		t.Fatal(err)
	}
	hs := statusFields(string(b))
	for _, k := range []string{"Uid", "Gid"} {
		for _, f := range strings.Fields(hs[k]) {
			if id, _ := strconv.ParseUint(f, 10, 32); id < base || id >= base+65536 {
				t.Errorf("on the host, the process's %s = %q: %d outside the workspace's range [%d, %d)", k, hs[k], id, base, base+65536)
			}
		}
	}

	// Cgroup: the workspace's, seen as the namespace's root inside.
	rt, err := os.ReadFile(filepath.Join(e.nodeRoot, "runtime.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rtm map[string]string
	if err := json.Unmarshal(rt, &rtm); err != nil || rtm["cgroup"] == "" {
		t.Fatalf("runtime.json: %s (%v)", rt, err)
	}
	wantCg := "/" + strings.Trim(rtm["cgroup"], "/") + "/" + e.id
	// controller list (v1; "" for v2) → path
	cgOf := func(pid int) map[string]string {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if p := strings.SplitN(l, ":", 3); len(p) == 3 {
				out[p[1]] = p[2]
			}
		}
		return out
	}
	procCg, ctrlCg := cgOf(host), cgOf(e.p.cmd.Process.Pid)
	placed := 0
	for ctl, path := range procCg {
		// The hierarchies the runtime uses hold the workspace's cgroup;
		// the others (net_cls, perf_event, ... on cgroup v1) their root.
		if path == wantCg {
			placed++
			if ctrlCg[ctl] == path {
				t.Errorf("the process shares ctrl's (the node's) cgroup %s:%s", ctl, path)
			}
			continue
		}
		if path != "/" || slices.ContainsFunc([]string{"memory", "pids", "cpu", "devices"}, func(c string) bool { return slices.Contains(strings.Split(ctl, ","), c) }) {
			t.Errorf("on the host, the process's cgroup %s:%s, want the workspace's %s", ctl, path, wantCg)
		}
	}
	if placed == 0 {
		t.Errorf("on the host, the process is in no cgroup of the workspace (%s): %v", wantCg, procCg)
	}
	// Inside, every hierarchy shows the root of the cgroup namespace.
	for _, l := range strings.Split(strings.TrimSpace(e.mustRun(tok, "cat", "/proc/self/cgroup")), "\n") {
		if p := strings.SplitN(l, ":", 3); len(p) != 3 || p[2] != "/" {
			t.Errorf("/proc/self/cgroup inside: %q, want the namespace's root /", l)
		}
	}

	// PID namespace: only the workspace's processes.
	hostNS, err := os.Readlink(hdir + "/ns/pid")
	if err != nil {
		t.Fatal(err)
	}
	if self, _ := os.Readlink("/proc/self/ns/pid"); self == hostNS {
		t.Fatalf("the process is in the test's PID namespace %s", self)
	}
	list := e.mustRun(tok, "sh", "-c", `for p in /proc/[0-9]*; do echo "${p#/proc/} $(cat $p/comm 2>/dev/null)"; done`)
	procs := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(list), "\n") {
		pid, comm, _ := strings.Cut(l, " ")
		procs[pid] = comm
	}
	if len(procs) > 8 {
		t.Errorf("inside, %d processes are visible:\n%s", len(procs), list)
	}
	for pid, comm := range procs {
		if !slices.Contains([]string{"kibotos-guest", "sleep", "sh", "cat"}, comm) {
			t.Errorf("inside, process %s %q is visible: not one of the workspace's", pid, comm)
		}
	}
	if c, ok := procs[strconv.Itoa(os.Getpid())]; ok && c == filepath.Base(os.Args[0]) {
		t.Errorf("the test process (pid %d) is visible inside", os.Getpid())
	}
	if c, ok := procs[strconv.Itoa(e.p.cmd.Process.Pid)]; ok && c == "kibotos-ctrl" {
		t.Errorf("ctrl (pid %d) is visible inside", e.p.cmd.Process.Pid)
	}
	if procs["1"] != "kibotos-guest" || procs[strconv.Itoa(int(sl.Msg.GetPid()))] != "sleep" {
		t.Errorf("inside, the processes are %q; want the guest as 1 and sleep as %d", procs, sl.Msg.GetPid())
	}

	// Mounts: no host path.
	wd, _ := os.Getwd()
	mi := e.mustRun(tok, "cat", "/proc/self/mountinfo")
	for _, l := range strings.Split(strings.TrimSpace(mi), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 {
			t.Errorf("mountinfo line %q", l)
			continue
		}
		for _, hostPath := range []string{e.dataDir, e.nodeRoot, binDir, wd, "/work", os.TempDir(), "/root", "/home"} {
			if hostPath == "/" || hostPath == "" {
				continue
			}
			if f[3] == hostPath || strings.HasPrefix(f[3], hostPath+"/") || strings.Contains(l, e.dataDir) || strings.Contains(l, binDir) {
				t.Errorf("inside, a mount shows the host path %s:\n%s", hostPath, l)
				break
			}
		}
	}
	t.Logf("mountinfo inside:\n%s", mi)

	// The probe: PID 1's descriptors, unix sockets, ctrl's listener.
	probe := buildStatic(t, "testdata/dpprobe", "dpprobe")
	e.install(tok, probe, "/tmp/dpprobe")
	out := e.mustRun(tok, "/tmp/dpprobe", "proc1")
	// open /proc/1/fd/N is refused, or finds nothing (the mask).
	if !strings.Contains(out, "pidfd_getfd 1 0: refused") || (!strings.Contains(out, "open /proc/1/fd/0: refused") && !strings.Contains(out, "readdir /proc/1/fd: ok 0 entries")) {
		t.Errorf("dpprobe proc1 tried nothing:\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, ": ok") && !strings.HasPrefix(l, "readdir /proc/1/fd:") {
			t.Errorf("a descriptor of the guest (PID 1) is reachable: %s", l)
		}
	}
	t.Run("ListPID1Descriptors", func(t *testing.T) {
		// Refused, or masked (an empty directory: the sandbox mounts an
		// empty tmpfs over it).
		if !strings.Contains(out, "readdir /proc/1/fd: refused") && !strings.Contains(out, "readdir /proc/1/fd: ok 0 entries") {
			first, _, _ := strings.Cut(out, "\n")
			owner := strings.TrimSpace(e.mustRun(tok, "stat", "-c", "%u:%g %A", "/proc/1/fd"))
			t.Errorf("/proc/1/fd of the guest can be listed from inside (%s, the directory is %s): the mask over it is missing", first, owner)
		}
	})

	// A process holds no descriptor of the guest: only its standard
	// streams (pipes, or its terminal) and the directory it reads.
	checkFds := func(how string, out string) {
		t.Helper()
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(l)
			if len(f) != 3 {
				t.Errorf("%s: dpprobe fds line %q", how, l)
				continue
			}
			switch {
			case (f[1] == "0" || f[1] == "1" || f[1] == "2") && (strings.HasPrefix(f[2], "pipe:") || strings.HasPrefix(f[2], "/dev/pts/")):
			case f[2] == "self":
			default:
				t.Errorf("%s: the process holds %s → %s:\n%s", how, f[1], f[2], out)
			}
		}
	}
	checkFds("pipes", e.mustRun(tok, "/tmp/dpprobe", "fds"))
	pt, err := e.proc.StartProcess(ctx, bearer(&ctrlv1.StartProcessRequest{WorkspaceId: e.id, Argv: []string{"/tmp/dpprobe", "fds"},
		Pty: &ctrlv1.ProcessPty{Rows: 24, Cols: 80}}, tok))
	if err != nil {
		t.Fatal(err)
	}
	r, err := dpEvents(ctx, e.proc, tok, &ctrlv1.ProcessEventsRequest{WorkspaceId: e.id, ProcessId: pt.Msg.GetProcessId()})
	if err != nil || r.exit.GetExitCode() != 0 {
		t.Fatalf("dpprobe fds on a terminal: %v, %v", r.exit, err)
	}
	checkFds("terminal", strings.ReplaceAll(r.stdout, "\r", ""))

	// Every unix socket of the host's network namespace (the node's, ctrl's
	// and the test's; abstract ones as @name) and one the test listens on.
	abstract := fmt.Sprintf("@kibotos-e2e-%d", os.Getpid())
	ln, err := net.Listen("unix", abstract)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pathSock := filepath.Join(e.dataDir, "e2e.sock")
	ln2, err := net.Listen("unix", pathSock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	hostSocks := []string{abstract, pathSock}
	if f, err := os.Open("/proc/net/unix"); err == nil {
		sc := bufio.NewScanner(f)
		sc.Scan()
		for sc.Scan() {
			if fl := strings.Fields(sc.Text()); len(fl) >= 8 && !slices.Contains(hostSocks, fl[7]) && len(hostSocks) < 300 {
				hostSocks = append(hostSocks, fl[7])
			}
		}
		f.Close()
	}
	out = e.mustRun(tok, "/tmp/dpprobe", "unix")
	t.Logf("dpprobe unix (the workspace's own):\n%s", out)
	if strings.Contains(out, "ANSWERED") {
		t.Errorf("a unix socket inside the workspace answers ProcessService:\n%s", out)
	}
	out = e.mustRun(tok, append([]string{"/tmp/dpprobe", "connect"}, hostSocks...)...)
	t.Logf("dpprobe connect, %d sockets of the host:\n%s", len(hostSocks), out)
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, ": ok") {
			t.Errorf("a host socket is reachable from inside: %s", l)
		}
	}
	if n := strings.Count(out, ": refused"); n < len(hostSocks) {
		t.Errorf("the probe tried %d of %d host sockets:\n%s", n, len(hostSocks), out)
	}

	// ctrl's listener, on loopback and on the host's other addresses.
	u, err := url.Parse(e.p.url)
	if err != nil {
		t.Fatal(err)
	}
	port := u.Port()
	addrs := []string{u.Host, net.JoinHostPort("::1", port)}
	if ifs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
				addrs = append(addrs, net.JoinHostPort(ipn.IP.String(), port))
			}
		}
	}
	out = e.mustRun(tok, append([]string{"/tmp/dpprobe", "tcp"}, addrs...)...)
	t.Logf("dpprobe tcp:\n%s", out)
	if strings.Contains(out, ": ok") || strings.Count(out, ": refused") != len(addrs) {
		t.Errorf("ctrl's listener from inside:\n%s", out)
	}
	// The process kept running through all this, in the workspace.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ls, err := e.proc.ListProcesses(cctx, bearer(&ctrlv1.ListProcessesRequest{WorkspaceId: e.id}, tok))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ls.Msg.GetProcesses() {
		if p.GetProcessId() == sl.Msg.GetProcessId() && !p.GetRunning() {
			t.Errorf("sleep ended: %v", p)
		}
	}
}
