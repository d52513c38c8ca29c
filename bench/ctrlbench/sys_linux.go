//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
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

// cpuSample is a point-in-time reading of CPU time: this process, the
// kibotos-ctrl process, and the whole machine.
type cpuSample struct {
	ok            bool
	client        time.Duration
	server        time.Duration
	machineBusy   time.Duration
	machineTotal  time.Duration
	serverMissing bool
}

// clkTck is USER_HZ, the unit of /proc times; 100 on every Linux
// architecture Go supports.
const clkTck = 100

func sampleCPU(serverPID int) cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return s
	}
	s.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", serverPID))
	if err == nil {
		// Fields after the parenthesized command name; utime and stime are
		// fields 14 and 15 of the whole line.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				s.server = time.Duration(u+st) * time.Second / clkTck
			}
		}
	} else {
		s.serverMissing = true
	}
	b, err = os.ReadFile("/proc/stat")
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
		if i >= 8 { // guest time is already counted in user
			break
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	s.machineTotal = time.Duration(total) * time.Second / clkTck
	s.machineBusy = time.Duration(total-idle) * time.Second / clkTck
	s.ok = true
	return s
}
