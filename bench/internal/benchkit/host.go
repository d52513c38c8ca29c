package benchkit

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Output runs name in dir and returns its trimmed standard output.
func Output(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// NProc is the number of CPUs as nproc(1) reports it.
func NProc() string {
	if out, err := Output(context.Background(), "", "nproc"); err == nil && out != "" {
		return out
	}
	return strconv.Itoa(runtime.NumCPU())
}

// LoadAvg returns the 1, 5 and 15 minute load averages.
func LoadAvg() string {
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

// CPUModel returns the first "model name" of /proc/cpuinfo.
func CPUModel() string {
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

// Tail returns the last n bytes of a file (or why it could not be read).
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// MS is d in milliseconds.
func MS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// CPUSample is a point-in-time reading of CPU time: this process, a server
// process, and the whole machine.
type CPUSample struct {
	OK           bool // the machine-wide reading worked
	At           time.Time
	Self         time.Duration
	Server       time.Duration
	MachineBusy  time.Duration
	MachineTotal time.Duration
}
