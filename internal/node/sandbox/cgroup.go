package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cpuPeriodMicros is the CFS period the runtime sets (cgroup v2) or expects
// (cgroup v1 keeps the hierarchy's period, 100000 by default).
const cpuPeriodMicros = 100000

// cgroupLimits are what an execution's cgroup enforces from its creation.
// Its device list and IO limits name devices and come later
// (limitDevices, limitIO).
type cgroupLimits struct {
	MemoryBytes uint64
	VCPUs       uint32
	PidsMax     int
}

// cgroupWrite is one write to a control file of a cgroup.
type cgroupWrite struct{ file, line string }

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
	create(rel string, l cgroupLimits) error
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
	// limitDevices makes allow the cgroup's device list (devices.go):
	// the devices its processes may open or make, nothing else. On a
	// cgroup that has a list already, narrowing it never allows less
	// than both lists for a moment.
	limitDevices(rel string, allow []deviceRule) error
	// limitIO sets the IO limits l of the cgroup on the block device dev
	// (io.go); limits that cap nothing write nothing.
	limitIO(rel string, dev uint64, l IOLimits) error
}

// detectCgroups picks v2 when /sys/fs/cgroup is a unified hierarchy
// (cgroup.controllers exists), otherwise v1 with the hierarchies found in
// /proc/self/mountinfo. A hybrid host (v1 controllers plus an empty
// /sys/fs/cgroup/unified) is v1. memory, cpu and pids are needed, and on v1
// devices (on v2 the device list is a BPF program); the IO controller
// (blkio, io) only for IO limits (limitIO fails without it).
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
		return &cgroupV2{root: "/sys/fs/cgroup", io: contains(have, "io")}, nil
	}
	mounts, err := v1Mounts()
	if err != nil {
		return nil, err
	}
	v1 := &cgroupV1{mounts: map[string]string{}}
	for _, c := range []string{"memory", "cpu", "pids", "devices", "blkio"} {
		m, ok := mounts[c]
		if !ok {
			if c == "blkio" {
				continue
			}
			return nil, fmt.Errorf("sandbox: cgroup v1 controller %q is not mounted", c)
		}
		v1.mounts[c] = m
	}
	return v1, nil
}

// contains reports whether list holds s.
func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// writeCgroupFile writes value to a cgroup control file in one write (the
// kernel acts on each write; its error is the write's or the close's).
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

// readInts reads whitespace-separated integers (cgroup.procs).
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

// readUint reads one unsigned number.
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

// subdirs lists the names of the directories in dir; a missing dir has none.
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
