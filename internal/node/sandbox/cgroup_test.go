package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/mountinfo"
)

// TestCgroupV2Limits checks what the v2 implementation writes, on a fake
// hierarchy (this host may be v1).
func TestCgroupV2Limits(t *testing.T) {
	root := t.TempDir()
	rel := "kibotos/tag/ws-1"
	files := map[string]string{
		"cgroup.subtree_control":                  "",
		"kibotos/cgroup.subtree_control":          "",
		"kibotos/tag/cgroup.subtree_control":      "",
		"kibotos/tag/ws-1/cgroup.subtree_control": "",
		"kibotos/tag/ws-1/memory.max":             "max\n",
		"kibotos/tag/ws-1/memory.swap.max":        "max\n",
		"kibotos/tag/ws-1/cpu.max":                "max 100000\n",
		"kibotos/tag/ws-1/pids.max":               "max\n",
	}
	for p, c := range files {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := &cgroupV2{root: root}
	if err := c.create(rel, cgroupLimits{MemoryBytes: 128 << 20, VCPUs: 2, PidsMax: 512}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"memory.max":      "134217728",
		"memory.swap.max": "0",
		"cpu.max":         "200000 100000",
		"pids.max":        "512",
	}
	for f, w := range want {
		b, _ := os.ReadFile(filepath.Join(root, rel, f))
		if got := strings.TrimSpace(string(b)); !strings.HasPrefix(got, w) {
			t.Errorf("%s = %q, want %q", f, got, w)
		}
	}
	// Stats parse what the kernel reports.
	for f, v := range map[string]string{
		"memory.max":     "134217728\n",
		"memory.current": "1048576\n",
		"memory.peak":    "2097152\n",
		"memory.events":  "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n",
		"cpu.max":        "200000 100000\n",
		"pids.max":       "max\n",
		"pids.current":   "3\n",
	} {
		if err := os.WriteFile(filepath.Join(root, rel, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.stats(rel)
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != 2 || s.MemoryLimitBytes != 128<<20 || s.MemoryUsageBytes != 1<<20 || s.MemoryPeakBytes != 2<<20 ||
		s.OOMKills != 2 || s.CPUQuotaMicros != 200000 || s.CPUPeriodMicros != 100000 || s.PidsMax != -1 || s.PidsCurrent != 3 {
		t.Errorf("stats: %+v", s)
	}
}

// TestCgroupV2Processes moves, lists and kills a real process with the v2
// implementation on the host's unified hierarchy (the hybrid
// /sys/fs/cgroup/unified when the host is v1), which has cgroup.kill even
// without controllers.
func TestCgroupV2Processes(t *testing.T) {
	requireSandbox(t)
	root := ""
	mounts, err := mountinfo.ReadSelf()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m.FSType == "cgroup2" && m.Root == "/" {
			root = m.MountPoint
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup2 hierarchy mounted")
	}
	c := &cgroupV2{root: root}
	rel := "kibotos-test-v2/ws-v2"
	if err := os.MkdirAll(filepath.Join(root, rel), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.remove(rel)
		_ = c.remove("kibotos-test-v2")
	}()
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if err := c.addProc(rel, cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	pids, err := c.procs(rel)
	if err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Errorf("procs = %v, %v", pids, err)
	}
	if names, _ := c.children("kibotos-test-v2"); len(names) != 1 || names[0] != "ws-v2" {
		t.Errorf("children = %v", names)
	}
	if err := c.kill(rel); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		t.Fatal("cgroup.kill did not kill")
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		if err := c.remove(rel); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c.exists(rel) {
		t.Error("cgroup still exists")
	}
}

func TestProcStartTime(t *testing.T) {
	st, err := procStartTime(os.Getpid())
	if err != nil || st == 0 {
		t.Fatalf("%d %v", st, err)
	}
	fd, err := openProcess(os.Getpid(), st)
	if err != nil || fd < 0 {
		t.Fatalf("openProcess self: %d %v", fd, err)
	}
	if fd2, _ := openProcess(os.Getpid(), st+1); fd2 >= 0 {
		t.Error("openProcess accepted a wrong start time")
	}
}

// TestStartInCgroup checks that the init shim is born in its execution's
// cgroup (no migration) and that no thread of the node is left there.
func TestStartInCgroup(t *testing.T) {
	r, _ := newRuntime(t)
	const ws = "ws-startin"
	rel := r.cgroupRel(ws)
	r.cgMu.Lock()
	err := r.cg.create(rel, cgroupLimits{MemoryBytes: 64 << 20, VCPUs: 1, PidsMax: 64})
	r.cgMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.removeCgroup(rel) }()
	before, _ := threadCgroups()
	cmd, why := r.cg.startIn(rel, func() *exec.Cmd { return exec.Command("sleep", "100") })
	if cmd == nil {
		t.Fatalf("startIn did not start: %v", why)
	}
	if why != nil {
		t.Errorf("startIn: %v", why)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-done
	}()
	pids, err := r.cg.procs(rel)
	if err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Errorf("procs of the cgroup = %v, %v; want only %d", pids, err, cmd.Process.Pid)
	}
	// Not a single thread of this process in the cgroup, in any hierarchy.
	for _, p := range r.cg.paths(rel) {
		for _, f := range []string{"tasks", "cgroup.threads"} {
			tids, err := readInts(filepath.Join(p, f))
			if err != nil {
				continue
			}
			for _, tid := range tids {
				if _, err := os.Stat(filepath.Join("/proc/self/task", strconv.Itoa(tid))); err == nil {
					t.Errorf("thread %d of the test process is in %s", tid, p)
				}
			}
		}
	}
	if after, _ := threadCgroups(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("this thread's cgroups changed: %v → %v", before, after)
	}
	// Whatever lists the node in a cgroup, kill never signals it.
	killPids([]int{os.Getpid()})
}

// TestExecutionInItsCgroup checks that every thread of the guest is in the
// execution's cgroup in each hierarchy and that no thread of the node is
// there once Start returned.
func TestExecutionInItsCgroup(t *testing.T) {
	r, _ := newRuntime(t)
	const ws = "ws-cgroup"
	start(t, r, testSpec(ws))
	st, _ := r.Status(ws)
	rel := r.cgroupRel(ws)
	pids, err := r.cg.procs(rel)
	if err != nil || len(pids) != 1 || pids[0] != st.PID {
		t.Errorf("processes of the cgroup = %v, %v; want only PID 1 (%d)", pids, err, st.PID)
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", st.PID))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of PID 1: %v", err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/cgroup", st.PID, task.Name()))
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) != 3 {
				continue
			}
			ours := f[1] == "" && r.cg.version() == 2
			for _, ctl := range strings.Split(f[1], ",") {
				ours = ours || ctl == "memory" || ctl == "cpu" || ctl == "pids"
			}
			if ours && f[2] != "/"+rel {
				t.Errorf("thread %s of PID 1: %s, want %s", task.Name(), line, "/"+rel)
			}
		}
	}
	for _, p := range r.cg.paths(rel) {
		for _, f := range []string{"tasks", "cgroup.threads"} {
			tids, err := readInts(filepath.Join(p, f))
			if err != nil {
				continue
			}
			for _, tid := range tids {
				if _, err := os.Stat(filepath.Join("/proc/self/task", strconv.Itoa(tid))); err == nil {
					t.Errorf("thread %d of the test process is in %s", tid, p)
				}
			}
		}
	}
	// Whatever lists the node in a cgroup, kill never signals it.
	killPids([]int{os.Getpid()})
	if err := r.Delete(context.Background(), ws); err != nil {
		t.Fatal(err)
	}
}

// TestCgroupBaseRemovedWhenEmpty: the runtime's own cgroup (parent/tag)
// goes with its last execution cgroup.
func TestCgroupBaseRemovedWhenEmpty(t *testing.T) {
	r, _ := newRuntime(t)
	ctx := context.Background()
	baseExists := func() bool {
		for _, p := range r.cg.paths(r.cgBase) {
			if _, err := os.Stat(p); err == nil {
				return true
			}
		}
		return false
	}
	start(t, r, testSpec("ws-base-1"))
	start(t, r, testSpec("ws-base-2"))
	if !baseExists() {
		t.Fatal("no runtime cgroup while executions run")
	}
	if err := r.Stop(ctx, "ws-base-1", false); err != nil {
		t.Fatal(err)
	}
	if !baseExists() {
		t.Fatal("runtime cgroup removed while an execution runs in it")
	}
	if err := r.Delete(ctx, "ws-base-2"); err != nil {
		t.Fatal(err)
	}
	if baseExists() {
		t.Errorf("runtime cgroup %s left behind after the last execution", r.cgBase)
	}
	// And a start after that makes it again.
	start(t, r, testSpec("ws-base-1"))
	if err := r.Delete(ctx, "ws-base-1"); err != nil {
		t.Fatal(err)
	}
	if baseExists() {
		t.Errorf("runtime cgroup %s left behind", r.cgBase)
	}
}
