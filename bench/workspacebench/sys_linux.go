//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
)

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

// cpuUse summarizes CPU use between two samples.
type cpuUse struct {
	Wall        time.Duration
	Server      time.Duration // kibotos-ctrl (API, reconciler, node agent; not the executions)
	Self        time.Duration // this benchmark process
	MachineBusy float64       // share of all CPUs busy
}

func cpuBetween(a, b benchkit.CPUSample) cpuUse {
	u := cpuUse{Wall: b.At.Sub(a.At), Server: b.Server - a.Server, Self: b.Self - a.Self}
	if a.OK && b.OK && b.MachineTotal > a.MachineTotal {
		u.MachineBusy = float64(b.MachineBusy-a.MachineBusy) / float64(b.MachineTotal-a.MachineTotal)
	}
	return u
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
	out, err := benchkit.Output(context.Background(), "", "ps", "-eo", "pid,pcpu,etime,comm", "--sort=-pcpu", "--no-headers")
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
