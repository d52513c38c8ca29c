//go:build linux

package benchkit

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FSType names the file system of path when it matters to a benchmark.
func FSType(path string) string {
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

// clkTck is USER_HZ, the unit of /proc times; 100 on every Linux
// architecture Go supports.
const clkTck = 100

// SampleCPU reads the CPU times of this process, of serverPID and of the
// machine.
func SampleCPU(serverPID int) CPUSample {
	s := CPUSample{At: time.Now()}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.Self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", serverPID)); err == nil {
		// Fields after the parenthesized command name; utime and stime are
		// fields 14 and 15 of the whole line.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				s.Server = time.Duration(u+st) * time.Second / clkTck
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
		if i >= 8 { // guest time is already counted in user
			break
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	s.MachineTotal = time.Duration(total) * time.Second / clkTck
	s.MachineBusy = time.Duration(total-idle) * time.Second / clkTck
	s.OK = true
	return s
}
