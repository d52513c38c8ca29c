package guest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// Thresholds of the pressure conditions.
const (
	// DiskPressurePercent: DISK_PRESSURE when less than this share of the
	// writable layer is free.
	DiskPressurePercent = 5
	// MemoryPressurePercent: MEMORY_PRESSURE when the working set (usage
	// minus inactive page cache) is at least this share of the limit.
	MemoryPressurePercent = 90
)

// Condition measures the guest: READY, or MEMORY_PRESSURE / DISK_PRESSURE
// (memory first when both) with a message naming every pressure seen.
func (a *Agent) Condition() (protocol.Condition, string) {
	cond := protocol.ConditionReady
	var msgs []string
	if p, msg, ok := memoryPressure(a.cfg.CgroupRoot); ok && p {
		cond = protocol.ConditionMemoryPressure
		msgs = append(msgs, msg)
	}
	if p, msg, ok := diskPressure(a.cfg.DiskPath); ok && p {
		if cond == protocol.ConditionReady {
			cond = protocol.ConditionDiskPressure
		}
		msgs = append(msgs, msg)
	}
	return cond, strings.Join(msgs, "; ")
}

// diskPressure reports whether less than DiskPressurePercent of the
// filesystem at path is available (ok=false when it cannot be measured).
func diskPressure(path string) (pressure bool, msg string, ok bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil || st.Blocks == 0 {
		return false, "", false
	}
	free := st.Bavail * uint64(st.Bsize)
	total := st.Blocks * uint64(st.Bsize)
	if st.Bavail*100 >= st.Blocks*DiskPressurePercent {
		return false, "", true
	}
	return true, fmt.Sprintf("writable layer has %d MiB free of %d MiB", free>>20, total>>20), true
}

// memoryPressure reads the workspace's own cgroup (cgroup v2 at root, or
// the v1 memory controller at root/memory).
func memoryPressure(root string) (pressure bool, msg string, ok bool) {
	limit, usage, inactive, ok := readMemory(root)
	if !ok || limit == 0 || limit >= 1<<60 {
		return false, "", false
	}
	ws := usage
	if inactive < ws {
		ws -= inactive
	} else {
		ws = 0
	}
	if ws*100 < limit*MemoryPressurePercent {
		return false, "", true
	}
	return true, fmt.Sprintf("memory working set %d MiB of %d MiB limit", ws>>20, limit>>20), true
}

func readMemory(root string) (limit, usage, inactive uint64, ok bool) {
	// cgroup v2
	if l, err := readUintFile(filepath.Join(root, "memory.max")); err == nil {
		u, err := readUintFile(filepath.Join(root, "memory.current"))
		if err != nil {
			return 0, 0, 0, false
		}
		return l, u, statValue(filepath.Join(root, "memory.stat"), "inactive_file"), true
	} else if isMax(err) {
		return 0, 0, 0, false
	}
	// cgroup v1
	dir := filepath.Join(root, "memory")
	l, err := readUintFile(filepath.Join(dir, "memory.limit_in_bytes"))
	if err != nil {
		return 0, 0, 0, false
	}
	u, err := readUintFile(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return 0, 0, 0, false
	}
	return l, u, statValue(filepath.Join(dir, "memory.stat"), "total_inactive_file"), true
}

type maxError struct{}

func (maxError) Error() string { return "unlimited" }

func isMax(err error) bool { _, ok := err.(maxError); return ok }

func readUintFile(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, maxError{}
	}
	return strconv.ParseUint(s, 10, 64)
}

func statValue(path, key string) uint64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
