package sandbox

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// IOLimits caps the IO of each execution on its writable layer, that is on
// its loop device: bytes and operations per second, each direction on its
// own; zero is no cap. The node chooses them (Config.IO); the API has no
// field for them.
//
// cgroup v1 throttles with blkio.throttle.{read,write}_{bps,iops}_device,
// cgroup v2 with io.max. On cgroup v1 buffered writes are not throttled:
// the kernel's flusher threads write the page cache back outside the
// execution's cgroup, so only reads and O_DIRECT writes are. cgroup v2
// charges the writeback to the cgroup that dirtied the pages and throttles
// it too (a normal stop's writeback included).
//
// There is no proportional weight (blkio.weight, io.weight): it needs the
// BFQ scheduler (or io.cost) on the device, and a loop device has no
// scheduler by default.
type IOLimits struct {
	ReadBytesPerSec  uint64
	WriteBytesPerSec uint64
	ReadIOPS         uint64
	WriteIOPS        uint64
}

// DefaultIOLimits are the limits when Config.IO is nil: 256 MiB/s and
// 8192 operations per second each way. They are a guard against one
// workspace taking a whole fast disk, generous for a workspace's builds
// and installs; a node on a slower disk, or with many workspaces, sets
// lower ones.
func DefaultIOLimits() IOLimits {
	return IOLimits{
		ReadBytesPerSec:  256 << 20,
		WriteBytesPerSec: 256 << 20,
		ReadIOPS:         8192,
		WriteIOPS:        8192,
	}
}

// none reports whether l caps nothing.
func (l IOLimits) none() bool { return l == IOLimits{} }

// ioLimits are the IO limits of the runtime's executions.
func (r *Runtime) ioLimits() IOLimits {
	if r.cfg.IO != nil {
		return *r.cfg.IO
	}
	return DefaultIOLimits()
}

// devString is a device number as cgroup files write it ("7:3").
func devString(dev uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
}

// v1IOWrites are the blkio throttle files and lines of l on dev (only the
// caps that are set: a fresh cgroup has none).
func v1IOWrites(dev uint64, l IOLimits) []cgroupWrite {
	var out []cgroupWrite
	for _, x := range []struct {
		file string
		v    uint64
	}{
		{"blkio.throttle.read_bps_device", l.ReadBytesPerSec},
		{"blkio.throttle.write_bps_device", l.WriteBytesPerSec},
		{"blkio.throttle.read_iops_device", l.ReadIOPS},
		{"blkio.throttle.write_iops_device", l.WriteIOPS},
	} {
		if x.v > 0 {
			out = append(out, cgroupWrite{x.file, fmt.Sprintf("%s %d", devString(dev), x.v)})
		}
	}
	return out
}

// v2IOMax is the io.max line of l on dev ("max" for no cap).
func v2IOMax(dev uint64, l IOLimits) string {
	v := func(n uint64) string {
		if n == 0 {
			return "max"
		}
		return fmt.Sprint(n)
	}
	return strings.Join([]string{devString(dev),
		"rbps=" + v(l.ReadBytesPerSec), "wbps=" + v(l.WriteBytesPerSec),
		"riops=" + v(l.ReadIOPS), "wiops=" + v(l.WriteIOPS)}, " ")
}
