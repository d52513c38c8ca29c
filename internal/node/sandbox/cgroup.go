package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/kibotos/kibotos/internal/mountinfo"

	"golang.org/x/sys/unix"
)

// cpuPeriodMicros is the CFS period the runtime sets (cgroup v2) or expects
// (cgroup v1 keeps the hierarchy's period, 100000 by default).
const cpuPeriodMicros = 100000

// limits are what an execution's cgroup enforces.
type limits struct {
	MemoryBytes uint64
	VCPUs       uint32
	PidsMax     int
}

// CgroupStats is what the kernel reports for an execution's cgroup.
type CgroupStats struct {
	// Version is 1 or 2.
	Version          int
	MemoryLimitBytes uint64
	MemoryUsageBytes uint64
	// MemoryPeakBytes is the high-water mark (0 when the kernel does not
	// report it).
	MemoryPeakBytes uint64
	// OOMKills counts processes the OOM killer ended inside the cgroup.
	OOMKills uint64
	// CPUQuotaMicros per CPUPeriodMicros; -1 when unlimited.
	CPUQuotaMicros  int64
	CPUPeriodMicros uint64
	// PidsMax is the pids limit, -1 when unlimited; PidsCurrent the count.
	PidsMax     int64
	PidsCurrent int64
}

// cgroups hides the difference between cgroup v1 (one hierarchy per
// controller) and v2 (one unified hierarchy). rel is a path relative to the
// root of each hierarchy, for example "kibotos/0123abcd/ws-1".
type cgroups interface {
	version() int
	// create makes the cgroup (and its parents) and sets its limits.
	create(rel string, l limits) error
	// addProc moves pid into the cgroup.
	addProc(rel string, pid int) error
	// startIn starts the command mk returns so that its process is born
	// in the cgroup, without the migration addProc makes. A migration
	// of a whole process (cgroup.procs) takes the kernel's global
	// cgroup_threadgroup_rwsem for writing, which waits for an RCU grace
	// period whenever no migration happened recently: 8-10 ms on an idle
	// 2-CPU host, tens to hundreds on a busy one, and the larger part of
	// an execution's start before this existed. It returns the started
	// command, or no command when the process could not be placed at
	// birth (nothing was started: the caller starts a fresh command and
	// calls addProc). The error only says why, or that something went
	// wrong on the way that the caller should log; it never means that
	// something was left half done.
	startIn(rel string, mk func() *exec.Cmd) (*exec.Cmd, error)
	// procs lists the processes in the cgroup (union over hierarchies).
	procs(rel string) ([]int, error)
	// kill SIGKILLs every process in the cgroup.
	kill(rel string) error
	// remove removes the cgroup; missing is not an error.
	remove(rel string) error
	// exists reports whether the cgroup exists in any hierarchy.
	exists(rel string) bool
	// children lists the names of the sub-cgroups of rel.
	children(rel string) ([]string, error)
	// paths returns the cgroup's directories on the host.
	paths(rel string) []string
	stats(rel string) (CgroupStats, error)
}

// detectCgroups picks v2 when /sys/fs/cgroup is a unified hierarchy
// (cgroup.controllers exists), otherwise v1 with the hierarchies found in
// /proc/self/mountinfo. A hybrid host (v1 controllers plus an empty
// /sys/fs/cgroup/unified) is v1.
func detectCgroups() (cgroups, error) {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
		if err != nil {
			return nil, err
		}
		have := strings.Fields(string(b))
		for _, c := range []string{"memory", "cpu", "pids"} {
			if !contains(have, c) {
				return nil, fmt.Errorf("sandbox: cgroup v2 controller %q is not available at /sys/fs/cgroup", c)
			}
		}
		return &cgroupV2{root: "/sys/fs/cgroup"}, nil
	}
	mounts, err := v1Mounts()
	if err != nil {
		return nil, err
	}
	v1 := &cgroupV1{mounts: map[string]string{}}
	for _, c := range []string{"memory", "cpu", "pids"} {
		m, ok := mounts[c]
		if !ok {
			return nil, fmt.Errorf("sandbox: cgroup v1 controller %q is not mounted", c)
		}
		v1.mounts[c] = m
	}
	return v1, nil
}

// v1Mounts maps each v1 controller to its hierarchy's mount point.
func v1Mounts() (map[string]string, error) {
	mi, err := mountinfo.ReadSelf()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, m := range mi {
		if m.FSType != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(m.SuperOptions, ",") {
			if _, seen := out[opt]; !seen {
				out[opt] = m.MountPoint
			}
		}
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func writeCgroupFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return nil
}

func readInts(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// readMaxInt reads a number or "max" (-1).
func readMaxInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// keyed reads "key value" lines.
func keyed(path, key string) (uint64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// killPids SIGKILLs pids, never this process: a node thread that forked an
// execution from inside its cgroup (cgroupV1.startIn) and could not move
// back makes the node appear in the cgroup until that thread ends.
func killPids(pids []int) {
	self := os.Getpid()
	for _, p := range pids {
		if p != self {
			_ = unix.Kill(p, unix.SIGKILL)
		}
	}
}

// rmdirCgroup removes a cgroup directory (cgroupfs directories are removed
// with rmdir even though they list files).
func rmdirCgroup(dir string) error {
	err := unix.Rmdir(dir)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("rmdir %s: %w", dir, err)
}

func subdirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// ---- cgroup v2 ----

type cgroupV2 struct{ root string }

func (c *cgroupV2) version() int { return 2 }

func (c *cgroupV2) dir(rel string) string { return filepath.Join(c.root, rel) }

func (c *cgroupV2) create(rel string, l limits) error {
	// Enable the controllers on the way down; the parents hold no process.
	parts := strings.Split(filepath.Clean(rel), "/")
	cur := c.root
	for _, p := range parts {
		for _, ctl := range []string{"memory", "cpu", "pids"} {
			if err := writeCgroupFile(filepath.Join(cur, "cgroup.subtree_control"), "+"+ctl); err != nil {
				return fmt.Errorf("sandbox: cgroup v2: %w", err)
			}
		}
		cur = filepath.Join(cur, p)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("sandbox: cgroup v2: %w", err)
		}
	}
	d := c.dir(rel)
	if err := writeCgroupFile(filepath.Join(d, "memory.max"), strconv.FormatUint(l.MemoryBytes, 10)); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(d, "memory.swap.max")); err == nil {
		if err := writeCgroupFile(filepath.Join(d, "memory.swap.max"), "0"); err != nil {
			return err
		}
	}
	quota := uint64(l.VCPUs) * cpuPeriodMicros
	if err := writeCgroupFile(filepath.Join(d, "cpu.max"), fmt.Sprintf("%d %d", quota, cpuPeriodMicros)); err != nil {
		return err
	}
	return writeCgroupFile(filepath.Join(d, "pids.max"), strconv.Itoa(l.PidsMax))
}

func (c *cgroupV2) addProc(rel string, pid int) error {
	return writeCgroupFile(filepath.Join(c.dir(rel), "cgroup.procs"), strconv.Itoa(pid))
}

// startIn uses clone3's CLONE_INTO_CGROUP (Linux 5.7): the child is
// created in the cgroup. Without it (older kernel, or any failure of that
// clone) it returns no command and the caller falls back to addProc.
func (c *cgroupV2) startIn(rel string, mk func() *exec.Cmd) (*exec.Cmd, error) {
	fd, err := unix.Open(c.dir(rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	cmd := mk()
	attr := syscall.SysProcAttr{}
	if cmd.SysProcAttr != nil {
		attr = *cmd.SysProcAttr
	}
	attr.UseCgroupFD, attr.CgroupFD = true, fd
	cmd.SysProcAttr = &attr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("clone into cgroup: %w", err)
	}
	return cmd, nil
}

func (c *cgroupV2) procs(rel string) ([]int, error) {
	p, err := readInts(filepath.Join(c.dir(rel), "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return p, err
}

func (c *cgroupV2) kill(rel string) error {
	if !c.exists(rel) {
		return nil
	}
	if err := writeCgroupFile(filepath.Join(c.dir(rel), "cgroup.kill"), "1"); err == nil {
		return nil
	}
	p, err := c.procs(rel)
	killPids(p)
	return err
}

func (c *cgroupV2) remove(rel string) error { return rmdirCgroup(c.dir(rel)) }

func (c *cgroupV2) exists(rel string) bool {
	_, err := os.Stat(c.dir(rel))
	return err == nil
}

func (c *cgroupV2) children(rel string) ([]string, error) { return subdirs(c.dir(rel)) }

func (c *cgroupV2) paths(rel string) []string { return []string{c.dir(rel)} }

func (c *cgroupV2) stats(rel string) (CgroupStats, error) {
	d := c.dir(rel)
	s := CgroupStats{Version: 2}
	lim, err := readMaxInt(filepath.Join(d, "memory.max"))
	if err != nil {
		return s, err
	}
	if lim >= 0 {
		s.MemoryLimitBytes = uint64(lim)
	}
	s.MemoryUsageBytes, _ = readUint(filepath.Join(d, "memory.current"))
	s.MemoryPeakBytes, _ = readUint(filepath.Join(d, "memory.peak"))
	s.OOMKills, _ = keyed(filepath.Join(d, "memory.events"), "oom_kill")
	if b, err := os.ReadFile(filepath.Join(d, "cpu.max")); err == nil {
		f := strings.Fields(string(b))
		if len(f) == 2 {
			if f[0] == "max" {
				s.CPUQuotaMicros = -1
			} else {
				s.CPUQuotaMicros, _ = strconv.ParseInt(f[0], 10, 64)
			}
			s.CPUPeriodMicros, _ = strconv.ParseUint(f[1], 10, 64)
		}
	}
	s.PidsMax, _ = readMaxInt(filepath.Join(d, "pids.max"))
	s.PidsCurrent, _ = readMaxInt(filepath.Join(d, "pids.current"))
	return s, nil
}

// ---- cgroup v1 ----

type cgroupV1 struct {
	// mounts maps "memory", "cpu", "pids" to their hierarchy's mount point
	// (co-mounted controllers share one).
	mounts map[string]string
}

func (c *cgroupV1) version() int { return 1 }

func (c *cgroupV1) dir(ctl, rel string) string { return filepath.Join(c.mounts[ctl], rel) }

// hierarchies lists each distinct hierarchy once.
func (c *cgroupV1) hierarchies() []string {
	var out []string
	for _, ctl := range []string{"memory", "cpu", "pids"} {
		if m := c.mounts[ctl]; !contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

func (c *cgroupV1) create(rel string, l limits) error {
	for _, h := range c.hierarchies() {
		if err := os.MkdirAll(filepath.Join(h, rel), 0o755); err != nil {
			return fmt.Errorf("sandbox: cgroup v1: %w", err)
		}
	}
	mem := c.dir("memory", rel)
	if err := writeCgroupFile(filepath.Join(mem, "memory.limit_in_bytes"), strconv.FormatUint(l.MemoryBytes, 10)); err != nil {
		return err
	}
	// With swap accounting, memory+swap gets the same limit: no swap.
	if _, err := os.Stat(filepath.Join(mem, "memory.memsw.limit_in_bytes")); err == nil {
		if err := writeCgroupFile(filepath.Join(mem, "memory.memsw.limit_in_bytes"), strconv.FormatUint(l.MemoryBytes, 10)); err != nil {
			return err
		}
	}
	cpu := c.dir("cpu", rel)
	period, err := readUint(filepath.Join(cpu, "cpu.cfs_period_us"))
	if err != nil {
		return err
	}
	if period != cpuPeriodMicros {
		if err := writeCgroupFile(filepath.Join(cpu, "cpu.cfs_period_us"), strconv.Itoa(cpuPeriodMicros)); err == nil {
			period = cpuPeriodMicros
		}
	}
	if err := writeCgroupFile(filepath.Join(cpu, "cpu.cfs_quota_us"), strconv.FormatUint(uint64(l.VCPUs)*period, 10)); err != nil {
		return err
	}
	return writeCgroupFile(filepath.Join(c.dir("pids", rel), "pids.max"), strconv.Itoa(l.PidsMax))
}

func (c *cgroupV1) addProc(rel string, pid int) error {
	for _, h := range c.hierarchies() {
		if err := writeCgroupFile(filepath.Join(h, rel, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// startIn forks from a thread that sits in the cgroup, so that the child is
// born there. cgroup v1 has no CLONE_INTO_CGROUP, but it lets a thread move
// itself alone: writing "0" to a hierarchy's tasks file moves the calling
// thread only, and the kernel skips the global threadgroup lock (and its
// RCU grace period) for exactly that case. So: lock a goroutine to its OS
// thread, move that thread into the cgroup in every hierarchy, fork the
// command from it (clone copies the calling thread's cgroups), and move the
// thread back to where it was. While it sits in the cgroup the thread only
// forks; the Go runtime creates new threads from a clean template thread,
// never from a locked one, so nothing else of the node lands in the
// cgroup. Should the thread fail to move back, it is left locked and ends
// with its goroutine, so that it never runs other work of the node; kill
// never signals the node itself meanwhile (killPids skips it).
//
// It returns no command, and starts nothing, when the thread's own cgroups
// cannot be read or joined, and when the fork from inside fails (for
// example a pids.max below 2, which the forking thread itself counts
// against); the caller then starts a fresh command and migrates it.
func (c *cgroupV1) startIn(rel string, mk func() *exec.Cmd) (*exec.Cmd, error) {
	type result struct {
		cmd *exec.Cmd
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		cmd, clean, err := c.startFromThread(rel, mk)
		if clean {
			runtime.UnlockOSThread()
		} else {
			err = errors.Join(err, errors.New("the forking thread could not move back to its cgroups; it ends"))
		}
		done <- result{cmd, err}
	}()
	res := <-done
	return res.cmd, res.err
}

// startFromThread does startIn's work on the locked calling thread. clean
// reports whether the thread is back in its own cgroups.
func (c *cgroupV1) startFromThread(rel string, mk func() *exec.Cmd) (cmd *exec.Cmd, clean bool, err error) {
	own, err := threadCgroups()
	if err != nil {
		return nil, true, err
	}
	type move struct{ into, back string }
	var moves []move
	for _, h := range c.hierarchies() {
		var cur string
		for ctl, m := range c.mounts {
			if m != h {
				continue
			}
			if p, ok := own[ctl]; ok {
				cur = p
				break
			}
		}
		if cur == "" || !strings.HasPrefix(cur, "/") || strings.HasPrefix(cur, "/..") {
			return nil, true, fmt.Errorf("own cgroup %q in %s is not below its mount", cur, h)
		}
		back := filepath.Join(h, cur, "tasks")
		if _, err := os.Stat(back); err != nil {
			return nil, true, err
		}
		moves = append(moves, move{into: filepath.Join(h, rel, "tasks"), back: back})
	}
	moveBack := func(ms []move) bool {
		ok := true
		for _, m := range ms {
			if err := writeCgroupFile(m.back, "0"); err != nil {
				ok = false
			}
		}
		return ok
	}
	for i, m := range moves {
		if err := writeCgroupFile(m.into, "0"); err != nil {
			return nil, moveBack(moves[:i]), err
		}
	}
	cmd = mk()
	err = cmd.Start()
	clean = moveBack(moves)
	if err != nil {
		return nil, clean, fmt.Errorf("fork from inside the cgroup: %w", err)
	}
	return cmd, clean, nil
}

// threadCgroups maps each v1 controller (and name=…) to the calling
// thread's cgroup path in /proc/thread-self/cgroup.
func threadCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[1] == "" {
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			out[ctl] = f[2]
		}
	}
	return out, nil
}

func (c *cgroupV1) procs(rel string) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, h := range c.hierarchies() {
		p, err := readInts(filepath.Join(h, rel, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return out, err
		}
		for _, pid := range p {
			if !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out, nil
}

func (c *cgroupV1) kill(rel string) error {
	p, err := c.procs(rel)
	killPids(p)
	return err
}

func (c *cgroupV1) remove(rel string) error {
	var errs []error
	for _, h := range c.hierarchies() {
		if err := rmdirCgroup(filepath.Join(h, rel)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *cgroupV1) exists(rel string) bool {
	for _, h := range c.hierarchies() {
		if _, err := os.Stat(filepath.Join(h, rel)); err == nil {
			return true
		}
	}
	return false
}

func (c *cgroupV1) children(rel string) ([]string, error) {
	var out []string
	for _, h := range c.hierarchies() {
		d, err := subdirs(filepath.Join(h, rel))
		if err != nil {
			return out, err
		}
		for _, n := range d {
			if !contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out, nil
}

func (c *cgroupV1) paths(rel string) []string {
	var out []string
	for _, h := range c.hierarchies() {
		out = append(out, filepath.Join(h, rel))
	}
	return out
}

func (c *cgroupV1) stats(rel string) (CgroupStats, error) {
	s := CgroupStats{Version: 1}
	mem := c.dir("memory", rel)
	var err error
	if s.MemoryLimitBytes, err = readUint(filepath.Join(mem, "memory.limit_in_bytes")); err != nil {
		return s, err
	}
	s.MemoryUsageBytes, _ = readUint(filepath.Join(mem, "memory.usage_in_bytes"))
	s.MemoryPeakBytes, _ = readUint(filepath.Join(mem, "memory.max_usage_in_bytes"))
	s.OOMKills, _ = keyed(filepath.Join(mem, "memory.oom_control"), "oom_kill")
	cpu := c.dir("cpu", rel)
	if q, err := readMaxInt(filepath.Join(cpu, "cpu.cfs_quota_us")); err == nil {
		s.CPUQuotaMicros = q
	}
	s.CPUPeriodMicros, _ = readUint(filepath.Join(cpu, "cpu.cfs_period_us"))
	s.PidsMax, _ = readMaxInt(filepath.Join(c.dir("pids", rel), "pids.max"))
	s.PidsCurrent, _ = readMaxInt(filepath.Join(c.dir("pids", rel), "pids.current"))
	return s, nil
}
