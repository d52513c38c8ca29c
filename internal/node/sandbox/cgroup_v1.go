package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/internal/mountinfo"
)

// cgroupV1 is cgroup v1: one hierarchy per controller (memory, cpu, pids,
// devices and blkio, possibly co-mounted; see v1Mounts), the same relative
// path made in each. Limits are memory.limit_in_bytes (and
// memory.memsw.limit_in_bytes), cpu.cfs_quota_us, pids.max, the device
// list (devices.deny, devices.allow) and blkio.throttle.*_device; a
// process is born in its cgroup by forking from a thread moved there
// (startIn).
type cgroupV1 struct {
	// mounts maps "memory", "cpu", "pids", "devices" and, when mounted,
	// "blkio" to their hierarchy's mount point (co-mounted controllers
	// share one).
	mounts map[string]string
}

// v1Controllers are the controllers the runtime uses on cgroup v1, blkio
// only when it is mounted.
var v1Controllers = []string{"memory", "cpu", "pids", "devices", "blkio"}

func (c *cgroupV1) version() int { return 1 }

func (c *cgroupV1) dir(ctl, rel string) string { return filepath.Join(c.mounts[ctl], rel) }

// hierarchies lists each distinct hierarchy once.
func (c *cgroupV1) hierarchies() []string {
	var out []string
	for _, ctl := range v1Controllers {
		if m, ok := c.mounts[ctl]; ok && !contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

func (c *cgroupV1) create(rel string, l cgroupLimits) error {
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
	err = startCmd(cmd)
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

// limitDevices writes the device list: on a fresh cgroup (which allows
// everything) it denies all, then allows each of allow; otherwise it
// allows what is missing, then denies what is too much (v1DeviceWrites).
// It reads the list back: the kernel keeps a child's list within its
// parent's, and a list other than allow is an error.
func (c *cgroupV1) limitDevices(rel string, allow []deviceRule) error {
	d := c.dir("devices", rel)
	cur, err := readDevicesList(filepath.Join(d, "devices.list"))
	if err != nil {
		return fmt.Errorf("sandbox: cgroup v1 devices: %w", err)
	}
	for _, w := range v1DeviceWrites(cur, allow) {
		if err := writeCgroupFile(filepath.Join(d, w.file), w.line); err != nil {
			return fmt.Errorf("sandbox: cgroup v1 devices: %w", err)
		}
	}
	got, err := readDevicesList(filepath.Join(d, "devices.list"))
	if err != nil {
		return fmt.Errorf("sandbox: cgroup v1 devices: %w", err)
	}
	if !sameDevices(got, allow) {
		return fmt.Errorf("sandbox: cgroup v1 devices: %s lists %v, want %v", d, got, allow)
	}
	return nil
}

// limitIO writes the blkio throttle limits of dev.
func (c *cgroupV1) limitIO(rel string, dev uint64, l IOLimits) error {
	if l.none() {
		return nil
	}
	if _, ok := c.mounts["blkio"]; !ok {
		return errors.New("sandbox: IO limits need the cgroup v1 blkio controller, which is not mounted")
	}
	d := c.dir("blkio", rel)
	for _, w := range v1IOWrites(dev, l) {
		if err := writeCgroupFile(filepath.Join(d, w.file), w.line); err != nil {
			return fmt.Errorf("sandbox: cgroup v1 blkio: %w", err)
		}
	}
	return nil
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
