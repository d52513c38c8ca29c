package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// BenchmarkStartStop measures Start until the guest answers (the layer
// exists after the first iteration) and a normal stop (writeback confirmed,
// killed, released). Run as root:
//
//	go test -run '^$' -bench StartStop -benchtime 20x ./internal/node/sandbox/
func BenchmarkStartStop(b *testing.B) {
	r, _ := newRuntime(b)
	ctx := context.Background()
	const ws = "ws-bench"
	// The first start makes the layer (mkfs.ext4); measure it apart.
	t0 := time.Now()
	start(b, r, testSpec(ws))
	first := time.Since(t0)
	if err := r.Stop(ctx, ws, false); err != nil {
		b.Fatal(err)
	}
	var startD, stopD time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		start(b, r, testSpec(ws))
		t1 := time.Now()
		if err := r.Stop(ctx, ws, false); err != nil {
			b.Fatal(err)
		}
		startD += t1.Sub(t0)
		stopD += time.Since(t1)
	}
	b.StopTimer()
	b.ReportMetric(float64(first.Microseconds())/1000, "ms/first-start")
	b.ReportMetric(float64(startD.Microseconds())/float64(b.N)/1000, "ms/start")
	b.ReportMetric(float64(stopD.Microseconds())/float64(b.N)/1000, "ms/stop")
	if err := r.Delete(ctx, ws); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLayerResize grows a stopped workspace's 1 GiB writable layer
// holding 512 MiB of data to 2 GiB (Resize: truncate, e2fsck -f,
// resize2fs) and, in the same run, a sparse copy of the same image by hand
// (truncate + e2fsck -f -p + resize2fs) as the reference; the data's
// checksum is verified after the node's resize. Run as root:
//
//	go test -run '^$' -bench LayerResize -benchtime 3x ./internal/node/sandbox/
func BenchmarkLayerResize(b *testing.B) {
	r, _ := newRuntime(b, func(c *Config) { c.IO = &IOLimits{} })
	ctx := context.Background()
	var node, byHand time.Duration
	for i := 0; i < b.N; i++ {
		ws := fmt.Sprintf("ws-bench-resize-%d", i)
		s := testSpec(ws)
		s.CapacityBytes = 1 << 30
		start(b, r, s)
		sh(b, r, ws, "dd if=/dev/urandom of=/root/data bs=1M count=512 2>/dev/null && md5sum /root/data > /root/data.md5")
		if err := r.Stop(ctx, ws, false); err != nil {
			b.Fatal(err)
		}
		ref := r.LayerPath(ws) + ".ref"
		if out, err := exec.Command("cp", "--sparse=always", r.LayerPath(ws), ref).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v %s", err, out)
		}
		// Caches alike for both: the copy is written back before either
		// is timed (its dirty pages would otherwise be flushed by its
		// resize2fs).
		if f, err := os.OpenFile(ref, os.O_RDWR, 0); err == nil {
			_ = f.Sync()
			f.Close()
		}
		t0 := time.Now()
		if err := r.Resize(ctx, ws, 2<<30); err != nil {
			b.Fatal(err)
		}
		node += time.Since(t0)
		t0 = time.Now()
		if err := os.Truncate(ref, 2<<30); err != nil {
			b.Fatal(err)
		}
		if out, code, err := runTool(ctx, "e2fsck", "-f", "-p", ref); err != nil && code >= 4 {
			b.Fatalf("e2fsck: %v %s", err, out)
		}
		if out, _, err := runTool(ctx, "resize2fs", ref); err != nil {
			b.Fatalf("resize2fs: %v %s", err, out)
		}
		byHand += time.Since(t0)
		os.Remove(ref)
		start(b, r, s)
		sh(b, r, ws, "md5sum -c /root/data.md5 >/dev/null")
		if err := r.Delete(ctx, ws); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(node.Microseconds())/float64(b.N)/1000, "ms/resize")
	b.ReportMetric(float64(byHand.Microseconds())/float64(b.N)/1000, "ms/by-hand")
}
