package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCgroupV1IOLimits checks what the v1 implementation writes for IO
// limits, on a fake blkio hierarchy.
func TestCgroupV1IOLimits(t *testing.T) {
	blkio := t.TempDir()
	rel := "kibotos/tag/ws-1"
	files := []string{"blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device",
		"blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device"}
	if err := os.MkdirAll(filepath.Join(blkio, rel), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(blkio, rel, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := &cgroupV1{mounts: map[string]string{"blkio": blkio}}
	dev := unix.Mkdev(7, 12)
	if err := c.limitIO(rel, dev, IOLimits{ReadBytesPerSec: 1 << 20, WriteBytesPerSec: 2 << 20, WriteIOPS: 100}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"blkio.throttle.read_bps_device":   "7:12 1048576",
		"blkio.throttle.write_bps_device":  "7:12 2097152",
		"blkio.throttle.read_iops_device":  "", // no cap: nothing written
		"blkio.throttle.write_iops_device": "7:12 100",
	}
	for f, w := range want {
		b, _ := os.ReadFile(filepath.Join(blkio, rel, f))
		if got := string(b); got != w {
			t.Errorf("%s = %q, want %q", f, got, w)
		}
	}
	if err := (&cgroupV1{mounts: map[string]string{}}).limitIO(rel, dev, DefaultIOLimits()); err == nil {
		t.Error("IO limits without blkio: no error")
	}
	if err := (&cgroupV1{mounts: map[string]string{}}).limitIO(rel, dev, IOLimits{}); err != nil {
		t.Errorf("no IO limits without blkio: %v", err)
	}
}

// TestCgroupV2IOLimits checks io.max and that create enables the io
// controller on the way down, on a fake hierarchy.
func TestCgroupV2IOLimits(t *testing.T) {
	root := t.TempDir()
	rel := "kibotos/tag/ws-1"
	for _, p := range []string{"", "kibotos", "kibotos/tag", rel} {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
		// Each "+ctl" write overwrites the start of the fake file.
		if err := os.WriteFile(filepath.Join(root, p, "cgroup.subtree_control"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"memory.max", "cpu.max", "pids.max", "io.max"} {
		if err := os.WriteFile(filepath.Join(root, rel, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := &cgroupV2{root: root, io: true}
	if err := c.create(rel, cgroupLimits{MemoryBytes: 64 << 20, VCPUs: 1, PidsMax: 64}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"", "kibotos", "kibotos/tag"} {
		if b, _ := os.ReadFile(filepath.Join(root, p, "cgroup.subtree_control")); !strings.HasPrefix(string(b), "+io") {
			t.Errorf("%s/cgroup.subtree_control = %q: the last write was not +io", p, b)
		}
	}
	dev := unix.Mkdev(7, 3)
	if err := c.limitIO(rel, dev, IOLimits{ReadBytesPerSec: 1 << 20, WriteIOPS: 500}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(root, rel, "io.max"))
	if want := "7:3 rbps=1048576 wbps=max riops=max wiops=500"; string(b) != want {
		t.Errorf("io.max = %q, want %q", b, want)
	}
	if err := (&cgroupV2{root: root}).limitIO(rel, dev, DefaultIOLimits()); err == nil {
		t.Error("IO limits without the io controller: no error")
	}
	if err := (&cgroupV2{root: root}).limitIO(rel, dev, IOLimits{}); err != nil {
		t.Errorf("no IO limits without the io controller: %v", err)
	}
}

// TestWorkspaceIOThrottle runs O_DIRECT writes and reads on the writable
// layer of a real workspace capped at 1 MiB/s each way: 4 MiB take about
// 4 s each (the first slice of the throttle passes at once). Buffered writes
// are not throttled on cgroup v1 (the page cache is written back outside
// the cgroup): they are only logged.
func TestWorkspaceIOThrottle(t *testing.T) {
	if testing.Short() {
		t.Skip("takes about 10 s")
	}
	const capBytes = 1 << 20
	r, root := newRuntime(t, func(c *Config) {
		c.IO = &IOLimits{ReadBytesPerSec: capBytes, WriteBytesPerSec: capBytes}
	})
	const ws = "ws-io"
	start(t, r, testSpec(ws))
	loop, err := blockDevice(r.get(ws).st.Loop)
	if err != nil {
		t.Fatal(err)
	}
	rel := r.cgroupRel(ws)
	switch c := r.cg.(type) {
	case *cgroupV1:
		b, err := os.ReadFile(filepath.Join(c.dir("blkio", rel), "blkio.throttle.write_bps_device"))
		if want := fmt.Sprintf("%s %d", devString(loop), capBytes); err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("blkio.throttle.write_bps_device = %q, %v; want %q", b, err, want)
		}
	case *cgroupV2:
		b, err := os.ReadFile(filepath.Join(c.dir(rel), "io.max"))
		if err != nil || !strings.Contains(string(b), fmt.Sprintf("%s rbps=%d wbps=%d", devString(loop), capBytes, capBytes)) {
			t.Errorf("io.max = %q, %v", b, err)
		}
	}
	timed := func(script string) time.Duration {
		t.Helper()
		t0 := time.Now()
		sh(t, r, ws, script)
		return time.Since(t0)
	}
	const minimum = 3 * time.Second // 4 MiB at 1 MiB/s, less a first slice
	if d := timed("dd if=/dev/zero of=/root/direct bs=1M count=4 oflag=direct 2>/dev/null"); d < minimum {
		t.Errorf("4 MiB of O_DIRECT writes at 1 MiB/s took %v, want at least %v", d, minimum)
	} else {
		t.Logf("4 MiB of O_DIRECT writes: %v", d)
	}
	if d := timed("dd if=/root/direct of=/dev/null bs=1M iflag=direct 2>/dev/null"); d < minimum {
		t.Errorf("4 MiB of O_DIRECT reads at 1 MiB/s took %v, want at least %v", d, minimum)
	} else {
		t.Logf("4 MiB of O_DIRECT reads: %v", d)
	}
	t.Logf("4 MiB of buffered writes (cgroup v%d): %v", r.cg.version(),
		timed("dd if=/dev/zero of=/root/buffered bs=1M count=4 2>/dev/null"))
	if err := r.Delete(context.Background(), ws); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, root)
}

// TestDefaultIOLimits: without Config.IO, a workspace gets DefaultIOLimits
// on its loop device.
func TestDefaultIOLimits(t *testing.T) {
	r, _ := newRuntime(t)
	const ws = "ws-io-default"
	start(t, r, testSpec(ws))
	defer func() { _ = r.Delete(context.Background(), ws) }()
	c, ok := r.cg.(*cgroupV1)
	if !ok {
		t.Skip("checks the cgroup v1 files")
	}
	loop, err := blockDevice(r.get(ws).st.Loop)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range v1IOWrites(loop, DefaultIOLimits()) {
		b, err := os.ReadFile(filepath.Join(c.dir("blkio", r.cgroupRel(ws)), w.file))
		if err != nil || strings.TrimSpace(string(b)) != w.line {
			t.Errorf("%s = %q, %v; want %q", w.file, b, err, w.line)
		}
	}
}
