//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// fsType names the file system of path when it matters to the benchmark.
func fsType(path string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return "unknown"
	}
	switch st.Type {
	case 0x01021994:
		return "tmpfs"
	case 0xEF53:
		return "ext2/3/4"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x794c7630:
		return "overlayfs"
	}
	return "other"
}

// procStatus returns the fields of /proc/<pid>/status in KiB (VmRSS,
// RssAnon, RssFile, ...).
func procStatus(pid int) map[string]uint64 {
	out := map[string]uint64{}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return out
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if n, ok := strings.CutSuffix(v, " kB"); ok {
			if x, err := strconv.ParseUint(n, 10, 64); err == nil {
				out[k] = x
			}
		} else if x, err := strconv.ParseUint(v, 10, 64); err == nil {
			out[k] = x
		}
	}
	return out
}

// memInfo returns /proc/meminfo in KiB.
func memInfo() map[string]uint64 {
	out := map[string]uint64{}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return out
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n := strings.TrimSuffix(strings.TrimSpace(v), " kB")
		if x, err := strconv.ParseUint(n, 10, 64); err == nil {
			out[k] = x
		}
	}
	return out
}

// nodeCgroupMemory returns the memory charged to all executions of the node
// whose state directory is root (the runtime records its cgroup base in
// root/runtime.json), in bytes, and the number of execution cgroups.
func nodeCgroupMemory(root string) (uint64, int, error) {
	b, err := os.ReadFile(filepath.Join(root, "runtime.json"))
	if err != nil {
		return 0, 0, err
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return 0, 0, err
	}
	base := m["cgroup"]
	if base == "" {
		return 0, 0, fmt.Errorf("no cgroup in %s/runtime.json", root)
	}
	// cgroup v2, else the v1 memory hierarchy (hierarchical accounting).
	dir, file := filepath.Join("/sys/fs/cgroup", base), "memory.current"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil {
		dir, file = filepath.Join("/sys/fs/cgroup/memory", base), "memory.usage_in_bytes"
	}
	v, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(v)), 10, 64)
	if err != nil {
		return 0, 0, err
	}
	ents, _ := os.ReadDir(dir)
	kids := 0
	for _, e := range ents {
		if e.IsDir() {
			kids++
		}
	}
	return n, kids, nil
}

// cpuSample is a reading of CPU time: the server process and the whole
// machine.
type cpuSample struct {
	ok           bool
	at           time.Time
	self         time.Duration
	server       time.Duration
	machineBusy  time.Duration
	machineTotal time.Duration
}

// clkTck is USER_HZ, the unit of /proc times.
const clkTck = 100

func sampleCPU(serverPID int) cpuSample {
	s := cpuSample{at: time.Now()}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", serverPID)); err == nil {
		if i := bytes.LastIndexByte(b, ')'); i >= 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				s.server = time.Duration(u+st) * time.Second / clkTck
			}
		}
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return s
	}
	var total, idle int64
	for i, v := range f[1:] {
		if i >= 8 {
			break
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i == 3 || i == 4 {
			idle += n
		}
	}
	s.machineTotal = time.Duration(total) * time.Second / clkTck
	s.machineBusy = time.Duration(total-idle) * time.Second / clkTck
	s.ok = true
	return s
}

// cpuUse summarizes CPU use between two samples.
type cpuUse struct {
	Wall        time.Duration
	Server      time.Duration // kibotos-ctrl (API, reconciler, node agent; not the executions)
	Self        time.Duration // this benchmark process
	MachineBusy float64       // share of all CPUs busy
}

func cpuBetween(a, b cpuSample) cpuUse {
	u := cpuUse{Wall: b.at.Sub(a.at), Server: b.server - a.server, Self: b.self - a.self}
	if a.ok && b.ok && b.machineTotal > a.machineTotal {
		u.MachineBusy = float64(b.machineBusy-a.machineBusy) / float64(b.machineTotal-a.machineTotal)
	}
	return u
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// cpuModel returns the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// cgroupVersion reports 2 on a unified hierarchy, else 1.
func cgroupVersion() int {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return 2
	}
	return 1
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// busyProcesses lists the processes other than ours that used the most CPU
// recently (by ps), for the report's caveats.
func otherBusyProcesses(self, server int) string {
	out, err := output(context.Background(), "", "ps", "-eo", "pid,pcpu,etime,comm", "--sort=-pcpu", "--no-headers")
	if err != nil {
		return ""
	}
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		pid, _ := strconv.Atoi(f[0])
		pc, _ := strconv.ParseFloat(f[1], 64)
		if pid == self || pid == server || pc < 5 || f[3] == "ps" {
			continue
		}
		keep = append(keep, fmt.Sprintf("%s (pid %s, %s%% CPU over its %s lifetime)", f[3], f[0], f[1], f[2]))
		if len(keep) == 5 {
			break
		}
	}
	return strings.Join(keep, "; ")
}
