package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// cgroupV2 is cgroup v2: one unified hierarchy at root (/sys/fs/cgroup).
// Limits are memory.max (and memory.swap.max 0), cpu.max, pids.max, io.max
// and the device list, a BPF_PROG_TYPE_CGROUP_DEVICE program attached to
// the cgroup; a process is born in its cgroup with clone3's
// CLONE_INTO_CGROUP, and cgroup.kill ends them all.
type cgroupV2 struct {
	root string
	// io is whether the io controller is available (root's
	// cgroup.controllers): it is enabled on the way down, and IO limits
	// need it.
	io bool
}

func (c *cgroupV2) version() int { return 2 }

func (c *cgroupV2) dir(rel string) string { return filepath.Join(c.root, rel) }

func (c *cgroupV2) create(rel string, l cgroupLimits) error {
	// Enable the controllers on the way down; the parents hold no process.
	parts := strings.Split(filepath.Clean(rel), "/")
	ctls := []string{"memory", "cpu", "pids"}
	if c.io {
		ctls = append(ctls, "io")
	}
	cur := c.root
	for _, p := range parts {
		for _, ctl := range ctls {
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
	if err := startCmd(cmd); err != nil {
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

// limitDevices attaches the device program of allow (deviceProgram) to the
// cgroup, as the OCI runtimes do: with BPF_F_ALLOW_MULTI, so that the
// programs of the cgroup and of its parents must all allow, and with
// BPF_PROG_ATTACH rather than a BPF link, so that the cgroup holds the
// program beyond this process. Then it detaches the device programs the
// cgroup had before (an earlier list): until then both apply, so nothing
// the new list allows is refused meanwhile, and nothing it refuses is
// allowed once it is attached.
func (c *cgroupV2) limitDevices(rel string, allow []deviceRule) error {
	prog, err := loadDeviceProgram(allow)
	if err != nil {
		return fmt.Errorf("sandbox: cgroup v2 device program: %w", err)
	}
	defer prog.Close()
	fd, err := unix.Open(c.dir(rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sandbox: cgroup v2: %w", err)
	}
	defer unix.Close(fd)
	old, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		return fmt.Errorf("sandbox: cgroup v2 device programs of %s: %w", c.dir(rel), err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: fd, Program: prog, Attach: ebpf.AttachCGroupDevice, Flags: unix.BPF_F_ALLOW_MULTI,
	}); err != nil {
		return fmt.Errorf("sandbox: cgroup v2 attach device program to %s: %w", c.dir(rel), err)
	}
	for _, p := range old.Programs {
		op, err := ebpf.NewProgramFromID(p.ID)
		if err != nil {
			return fmt.Errorf("sandbox: cgroup v2 device program %d of %s: %w", p.ID, c.dir(rel), err)
		}
		err = link.RawDetachProgram(link.RawDetachProgramOptions{Target: fd, Program: op, Attach: ebpf.AttachCGroupDevice})
		op.Close()
		if err != nil {
			return fmt.Errorf("sandbox: cgroup v2 detach device program %d of %s: %w", p.ID, c.dir(rel), err)
		}
	}
	return nil
}

// limitIO writes io.max for dev.
func (c *cgroupV2) limitIO(rel string, dev uint64, l IOLimits) error {
	if l.none() {
		return nil
	}
	if !c.io {
		return errors.New("sandbox: IO limits need the cgroup v2 io controller, which is not available")
	}
	return writeCgroupFile(filepath.Join(c.dir(rel), "io.max"), v2IOMax(dev, l))
}
