package main

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
)

// opFunc issues one request as worker w. It returns an error when the call
// failed or its answer was not what the benchmark expects.
type opFunc func(ctx context.Context, w int) error

// result is one measurement: an operation at a concurrency, on one store and
// population.
type result struct {
	Store      string
	Op         string
	Population string
	Conc       int

	N        int           // successful operations in the measured window
	Errors   int           // failed operations in the measured window
	FirstErr string        // the first failure, for the report
	Elapsed  time.Duration // measured window: its start to the last completion
	P50, P99 time.Duration
	OpsPerS  float64

	// CPU over the measured window, per operation: this process (the
	// client) and the kibotos-ctrl process; MachineBusy is the busy share of
	// all CPUs of the machine (1 = every CPU busy all the time).
	ClientCPU, ServerCPU time.Duration
	// OtherCPU is the rest of the machine's busy time per operation: the
	// PostgreSQL backends, the kernel's work for other processes, and
	// anything else running on the machine.
	OtherCPU    time.Duration
	MachineBusy float64
	CPUOK       bool

	// Target is the verdict of the table's "target met?" column.
	Target string
}

// measure runs conc workers calling op in a loop for warmup+dur. Calls that
// start during the warm-up are not recorded; calls that start before the end
// of the window are recorded even when they finish after it.
// sample, when not nil, reads CPU counters at the start of the window and
// after the last call.
func measure(ctx context.Context, conc int, warmup, dur time.Duration, op opFunc, sample func() benchkit.CPUSample) result {
	start := time.Now()
	from := start.Add(warmup)
	end := from.Add(dur)
	cpu0 := make(chan benchkit.CPUSample, 1)
	if sample != nil {
		go func() {
			select {
			case <-time.After(time.Until(from)):
			case <-ctx.Done():
			}
			cpu0 <- sample()
		}()
	}

	lats := make([][]time.Duration, conc)
	errs := make([]int, conc)
	last := make([]time.Time, conc)
	var (
		mu       sync.Mutex
		firstErr string
		wg       sync.WaitGroup
	)
	for w := range conc {
		wg.Go(func() {
			l := make([]time.Duration, 0, 4096)
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				err := op(ctx, w)
				t1 := time.Now()
				if t0.Before(from) {
					continue
				}
				if t1.After(last[w]) {
					last[w] = t1
				}
				if err != nil {
					if ctx.Err() != nil {
						break
					}
					errs[w]++
					mu.Lock()
					if firstErr == "" {
						firstErr = err.Error()
					}
					mu.Unlock()
					continue
				}
				l = append(l, t1.Sub(t0))
			}
			lats[w] = l
		})
	}
	wg.Wait()

	r := result{Conc: conc, FirstErr: firstErr}
	if sample != nil {
		c0, c1 := <-cpu0, sample()
		ops := 0
		for w := range conc {
			ops += len(lats[w]) + errs[w]
		}
		if c0.OK && c1.OK && ops > 0 && c1.MachineTotal > c0.MachineTotal {
			r.CPUOK = true
			r.ClientCPU = (c1.Self - c0.Self) / time.Duration(ops)
			r.ServerCPU = (c1.Server - c0.Server) / time.Duration(ops)
			r.MachineBusy = float64(c1.MachineBusy-c0.MachineBusy) / float64(c1.MachineTotal-c0.MachineTotal)
			other := (c1.MachineBusy - c0.MachineBusy) - (c1.Self - c0.Self) - (c1.Server - c0.Server)
			r.OtherCPU = max(0, other) / time.Duration(ops)
		}
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	r.N = len(all)
	for _, e := range errs {
		r.Errors += e
	}
	lastDone := from
	for _, t := range last {
		if t.After(lastDone) {
			lastDone = t
		}
	}
	r.Elapsed = lastDone.Sub(from)
	if r.Elapsed > 0 {
		r.OpsPerS = float64(r.N) / r.Elapsed.Seconds()
	}
	r.P50 = percentile(all, 0.50)
	r.P99 = percentile(all, 0.99)
	return r
}

// percentile returns the nearest-rank percentile q (0 < q <= 1) of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
