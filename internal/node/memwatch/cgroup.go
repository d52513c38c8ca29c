package memwatch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/internal/mountinfo"
)

// maxFileBytes bounds every read of a cgroup or PSI file (memory.stat is a
// few KiB).
const maxFileBytes = 64 << 10

// Cgroup is where the workspaces' memory is accounted.
type Cgroup struct {
	// Dir is the parent cgroup's directory in the memory hierarchy; each
	// workspace's cgroup is a directory below it named by its ID.
	Dir string
	// Version is 1 or 2.
	Version int
	// PSIFile is the PSI file read for psi_some_avg10: Dir/memory.pressure
	// on v2, /proc/pressure/memory on v1; empty reads none.
	PSIFile string
}

// Locate finds the workspaces' parent cgroup of the sandbox runtime whose
// state directory is stateDir, from the runtime.json the runtime writes
// there when it starts ("cgroup": the parent, relative to the root of each
// hierarchy): below /sys/fs/cgroup on a unified (v2) hierarchy, below the
// memory controller's mount point on v1.
func Locate(stateDir string) (Cgroup, error) {
	b, err := readBounded(filepath.Join(stateDir, "runtime.json"))
	if err != nil {
		return Cgroup{}, fmt.Errorf("memwatch: %w", err)
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return Cgroup{}, fmt.Errorf("memwatch: runtime.json: %w", err)
	}
	rel := m["cgroup"]
	if rel == "" || path.IsAbs(rel) || path.Clean(rel) != rel || strings.HasPrefix(rel, "..") {
		return Cgroup{}, fmt.Errorf("memwatch: runtime.json names no usable cgroup (%q)", rel)
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		dir := filepath.Join("/sys/fs/cgroup", rel)
		return Cgroup{Dir: dir, Version: 2, PSIFile: filepath.Join(dir, "memory.pressure")}, nil
	}
	mounts, err := mountinfo.ReadSelf()
	if err != nil {
		return Cgroup{}, fmt.Errorf("memwatch: %w", err)
	}
	for _, mt := range mounts {
		if mt.FSType != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(mt.SuperOptions, ",") {
			if opt == "memory" {
				return Cgroup{Dir: filepath.Join(mt.MountPoint, rel), Version: 1, PSIFile: "/proc/pressure/memory"}, nil
			}
		}
	}
	return Cgroup{}, errors.New("memwatch: no cgroup v2 hierarchy at /sys/fs/cgroup and no cgroup v1 memory controller mounted")
}

// used is the memory of the cgroup at dir, its inactive file cache left
// out; a cgroup that does not exist uses nothing.
func (c Cgroup) used(dir string) (uint64, error) {
	usageFile, inactiveKey := "memory.current", "inactive_file"
	if c.Version == 1 {
		usageFile, inactiveKey = "memory.usage_in_bytes", "total_inactive_file"
	}
	b, err := readBounded(filepath.Join(dir, usageFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	usage, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memwatch: %s: %w", filepath.Join(dir, usageFile), err)
	}
	stat, err := readBounded(filepath.Join(dir, "memory.stat"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil // removed between the two reads
	}
	if err != nil {
		return 0, err
	}
	inactive, _ := statValue(stat, inactiveKey)
	if inactive >= usage {
		return 0, nil
	}
	return usage - inactive, nil
}

// psi is the PSI some avg10 of PSIFile, 0 when it cannot be read.
func (c Cgroup) psi() uint32 {
	if c.PSIFile == "" {
		return 0
	}
	b, err := readBounded(c.PSIFile)
	if err != nil {
		return 0
	}
	v, _ := ParsePSI(b)
	return v
}

// statValue returns the value of key in a memory.stat ("key value" lines).
func statValue(stat []byte, key string) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(stat))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// ParsePSI returns the avg10 of the "some" line of a PSI file
// ("some avg10=12.34 avg60=... avg300=... total=..."), in hundredths of a
// percent (1234), at most 10000; ok is false when there is none.
func ParsePSI(b []byte) (uint32, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "some" {
			continue
		}
		for _, kv := range f[1:] {
			v, ok := strings.CutPrefix(kv, "avg10=")
			if !ok {
				continue
			}
			return hundredths(v)
		}
	}
	return 0, false
}

// hundredths parses a non-negative decimal with at most two decimals
// ("12.34", "7", "0.5") into hundredths, capped at 10000 (100 %).
func hundredths(s string) (uint32, bool) {
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(whole) > 3 || len(frac) > 2 {
		return 0, false
	}
	w, err := strconv.ParseUint(whole, 10, 32)
	if err != nil {
		return 0, false
	}
	var f uint64
	if frac != "" {
		if f, err = strconv.ParseUint(frac, 10, 32); err != nil {
			return 0, false
		}
		if len(frac) == 1 {
			f *= 10
		}
	}
	return uint32(min(w*100+f, 10000)), true
}

// readBounded reads at most maxFileBytes of a file.
func readBounded(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxFileBytes))
}
