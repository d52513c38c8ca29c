//go:build linux

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
)

// memReading is one reading of the memory the idle phase reports.
type memReading struct {
	At           time.Time
	RSS, RssAnon uint64 // kibotos-ctrl (API + reconciler + embedded node agent), KiB
	MemAvailable uint64 // host, KiB
	Slab         uint64 // host kernel slab, KiB
	CgroupBytes  uint64 // charged to the node's execution cgroups
	Cgroups      int
	HeapInuse    float64 // go_memstats_heap_inuse_bytes of kibotos-ctrl
	Goroutines   float64
	Threads      uint64
}

func (b *bench) readMemory(ctx context.Context) memReading {
	st := procStatus(b.srv.PID())
	mi := memInfo()
	r := memReading{At: time.Now(), RSS: st["VmRSS"], RssAnon: st["RssAnon"], Threads: st["Threads"],
		MemAvailable: mi["MemAvailable"], Slab: mi["Slab"]}
	r.CgroupBytes, r.Cgroups, _ = nodeCgroupMemory(b.nodeRoot)
	if m, err := b.srv.metrics(ctx); err == nil {
		r.HeapInuse, r.Goroutines = m["go_memstats_heap_inuse_bytes"], m["go_goroutines"]
	}
	return r
}

// idleResult is phase 4.
type idleResult struct {
	N         int
	Spec      wsSpec
	Samples   []createSample
	Available int
	Makespan  time.Duration
	Errs      []string

	Before, After, AfterDelete memReading

	DeleteLat  []time.Duration
	DeleteSpan time.Duration
	CPUCreate  cpuUse
	CPUIdle    cpuUse // the settle period with every workspace idle
}

// idlePhase creates N idle workspaces at once, waits until all are
// AVAILABLE, reads memory, then deletes them all at once.
func (b *bench) idlePhase(ctx context.Context) error {
	n := b.cfg.idle
	res := &idleResult{N: n, Spec: idleSpec}
	b.idle = res
	logf("idle: settling %v, then %d workspaces (%s) at once", b.cfg.settle, n, idleSpec)
	if err := sleepCtx(ctx, b.cfg.settle); err != nil {
		return err
	}
	res.Before = b.readMemory(ctx)
	c0 := benchkit.SampleCPU(b.srv.PID())
	t0 := time.Now()
	samples, err := b.api.createBatch(ctx, n, idleSpec, 50*time.Millisecond, 4*time.Minute)
	res.Makespan = time.Since(t0)
	c1 := benchkit.SampleCPU(b.srv.PID())
	res.CPUCreate = cpuBetween(c0, c1)
	res.Samples = samples
	for i := range samples {
		if samples[i].Err != nil {
			res.Errs = append(res.Errs, samples[i].Err.Error())
		} else {
			res.Available++
		}
	}
	if err != nil {
		return fmt.Errorf("idle: %w", err)
	}
	logf("idle: %d/%d AVAILABLE after %.1f s; settling %v", res.Available, n, res.Makespan.Seconds(), b.cfg.settle)
	if err := sleepCtx(ctx, b.cfg.settle); err != nil {
		return err
	}
	res.After = b.readMemory(ctx)
	res.CPUIdle = cpuBetween(c1, benchkit.SampleCPU(b.srv.PID()))
	logf("idle: kibotos-ctrl RSS %d → %d MiB, MemAvailable %d → %d MiB; deleting all at once",
		res.Before.RSS>>10, res.After.RSS>>10, res.Before.MemAvailable>>10, res.After.MemAvailable>>10)
	lats, span, errs := b.api.removeAll(ctx, b.api.liveWorkspaces())
	res.DeleteLat, res.DeleteSpan = lats, span
	for _, e := range errs {
		res.Errs = append(res.Errs, e.Error())
	}
	res.AfterDelete = b.readMemory(ctx)
	logf("idle: deleted %d in %.1f s (%d failed)", len(lats), span.Seconds(), len(errs))
	if len(errs) > 0 {
		return fmt.Errorf("idle: %d deletes failed, first: %w", len(errs), errs[0])
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
