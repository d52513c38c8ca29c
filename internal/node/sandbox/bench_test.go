package sandbox

import (
	"context"
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
