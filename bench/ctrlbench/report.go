package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
)

// Targets of the issue.
const (
	createMinOpsPerS = 1000.0                // SQLite durable creates, at concurrency >= 16
	createMaxP99     = 25 * time.Millisecond // SQLite durable creates
	listMaxP99       = 20 * time.Millisecond // a page of 100 at the large population
	listMaxRatio     = 1.5                   // large population vs small, p50 and p99
)

// find returns the result for (store, op, population, conc), or nil.
func (b *bench) find(store, op, pop string, conc int) *result {
	for i := range b.results {
		r := &b.results[i]
		if r.Store == store && r.Op == op && r.Population == pop && r.Conc == conc {
			return r
		}
	}
	return nil
}

// ratio compares a list result at the large population with the first page
// at the small population: p50 and p99 ratios, ok when there is a baseline.
func (b *bench) ratio(r *result) (p50, p99 float64, ok bool) {
	base := b.find(r.Store, opListFirst, popLabel(b.cfg.small), r.Conc)
	if base == nil || base.P50 == 0 || base.P99 == 0 || r.Population == base.Population {
		return 0, 0, false
	}
	return float64(r.P50) / float64(base.P50), float64(r.P99) / float64(base.P99), true
}

// verdict fills the "target met?" column of r.
func (b *bench) verdict(r *result) string {
	if r.Errors > 0 {
		return fmt.Sprintf("no (%d errors)", r.Errors)
	}
	var fails []string
	switch {
	case (r.Op == opCreate || r.Op == opCreateConn) && r.Store == "sqlite":
		if r.Conc > 1 && r.OpsPerS < createMinOpsPerS {
			fails = append(fails, fmt.Sprintf("%.0f ops/s < %.0f", r.OpsPerS, createMinOpsPerS))
		}
		if r.P99 > createMaxP99 {
			fails = append(fails, fmt.Sprintf("p99 %.1f > %.0f ms", benchkit.MS(r.P99), benchkit.MS(createMaxP99)))
		}
		if len(fails) == 0 && r.Conc == 1 {
			return "yes (p99 only at c=1)"
		}
	case r.Op == opListFirst || r.Op == opListRandom:
		p50r, p99r, ok := b.ratio(r)
		if !ok {
			return "— (baseline)"
		}
		if r.P99 > listMaxP99 {
			fails = append(fails, fmt.Sprintf("p99 %.1f > %.0f ms", benchkit.MS(r.P99), benchkit.MS(listMaxP99)))
		}
		if p50r > listMaxRatio {
			fails = append(fails, fmt.Sprintf("p50 ×%.2f", p50r))
		}
		if p99r > listMaxRatio {
			fails = append(fails, fmt.Sprintf("p99 ×%.2f", p99r))
		}
	default:
		return "— (no target)"
	}
	if len(fails) > 0 {
		return "no (" + strings.Join(fails, ", ") + ")"
	}
	return "yes"
}

func (b *bench) report() string {
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	ctx := context.Background()

	goVersion, err := benchkit.Output(ctx, b.modRoot, "go", "version")
	if err != nil {
		goVersion = runtime.Version()
	}
	rev, err := benchkit.Output(ctx, b.modRoot, "git", "rev-parse", "HEAD")
	if err != nil {
		rev = "unknown (not a git checkout)"
	} else if st, err := benchkit.Output(ctx, b.modRoot, "git", "status", "--porcelain"); err == nil && st != "" {
		rev += " (with uncommitted changes)"
	}
	host, _ := os.Hostname()

	p("# kibotos-ctrl benchmark\n\n")
	p("- Date: %s\n", b.started.UTC().Format("2006-01-02 15:04:05 UTC"))
	p("- Go: `%s`\n", goVersion)
	p("- nproc: %s (%s)\n", benchkit.NProc(), benchkit.CPUModel())
	p("- Host: %s, %s/%s; load average at start %s, at end %s\n", host, runtime.GOOS, runtime.GOARCH, b.loadStart, benchkit.LoadAvg())
	p("- Git revision: `%s`\n", rev)
	if b.revision != "" && b.revision != "unknown" {
		p("- Server reports source revision: `%s`\n", b.revision)
	}
	p("- Command: `go run ./bench/ctrlbench %s`\n", strings.Join(b.cfg.args, " "))
	p("- Each measurement: %v warm-up (not recorded), then %v measured; concurrency = client goroutines\n", b.cfg.warmup, b.cfg.duration)
	p("- Client: connect-go (Connect protocol, binary proto) over golang.org/x/net/http2 with mutual TLS (dev operator certificate); one shared client, i.e. one HTTP/2 connection, unless the operation says otherwise\n")
	if b.cfg.serverProfile != "" {
		p("- Server: bench/ctrlprof (ctrl.Main, as kibotos-ctrl, with a CPU profile: expect a few %% overhead) as a subprocess on 127.0.0.1, sharing the %s CPUs with the client\n", benchkit.NProc())
	} else {
		p("- Server: the real `kibotos-ctrl --dev` binary as a subprocess on 127.0.0.1, sharing the %s CPUs with the client\n", benchkit.NProc())
	}
	for _, s := range b.cfg.stores {
		switch s {
		case "sqlite":
			p("- SQLite: data directory on %s (%s)\n", benchkit.FSType(b.tmp), b.tmp)
		case "postgres":
			p("- PostgreSQL: %s, server %s, fresh database per run\n", b.pgInfo, redact(b.cfg.postgresURL))
		}
	}
	for _, l := range b.seeding {
		p("- Seeding: %s\n", l)
	}

	p("\n## Results\n\n")
	p("| store | operation | population | concurrency | ops/s | p50 ms | p99 ms | target met? |\n")
	p("|---|---|---|---:|---:|---:|---:|---|\n")
	for i := range b.results {
		r := &b.results[i]
		r.Target = b.verdict(r)
		p("| %s | %s | %s | %d | %.0f | %.2f | %.2f | %s |\n", r.Store, r.Op, r.Population, r.Conc, r.OpsPerS, benchkit.MS(r.P50), benchkit.MS(r.P99), r.Target)
	}

	p("\n## List latency, %s vs %s Egresses\n\n", popLabel(b.cfg.large), popLabel(b.cfg.small))
	p("Baseline: the first page of decile=3 at %s (at %s the selection is exactly one page).\n\n", popLabel(b.cfg.small), popLabel(b.cfg.small))
	p("| store | operation at %s | concurrency | p50 ms %s | p50 ms %s | p50 ratio | p99 ms %s | p99 ms %s | p99 ratio | ≤ %.1fx? |\n",
		popLabel(b.cfg.large), popLabel(b.cfg.small), popLabel(b.cfg.large), popLabel(b.cfg.small), popLabel(b.cfg.large), listMaxRatio)
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for i := range b.results {
		r := &b.results[i]
		if r.Op != opListFirst && r.Op != opListRandom {
			continue
		}
		p50r, p99r, ok := b.ratio(r)
		if !ok {
			continue
		}
		base := b.find(r.Store, opListFirst, popLabel(b.cfg.small), r.Conc)
		okStr := "yes"
		if p50r > listMaxRatio || p99r > listMaxRatio {
			okStr = "no"
		}
		p("| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", r.Store, r.Op, r.Conc,
			benchkit.MS(base.P50), benchkit.MS(r.P50), p50r, benchkit.MS(base.P99), benchkit.MS(r.P99), p99r, okStr)
	}

	p("\n## CPU per operation\n\n")
	p("CPU time over each measured window divided by the operations started in it: the benchmark client (this process: TLS, HTTP/2, proto), the kibotos-ctrl process, and the rest of the machine (the PostgreSQL backends, and anything else that ran). Machine busy is the share of all %s CPUs in use; near 100%% the latencies above are dominated by CPU queueing rather than by the store.\n\n", benchkit.NProc())
	p("| store | operation | population | concurrency | client CPU µs/op | server CPU µs/op | other CPU µs/op | machine busy |\n")
	p("|---|---|---|---:|---:|---:|---:|---:|\n")
	for _, r := range b.results {
		if !r.CPUOK {
			continue
		}
		p("| %s | %s | %s | %d | %d | %d | %d | %.0f%% |\n", r.Store, r.Op, r.Population, r.Conc,
			r.ClientCPU.Microseconds(), r.ServerCPU.Microseconds(), r.OtherCPU.Microseconds(), 100*r.MachineBusy)
	}

	var errs []string
	for _, r := range b.results {
		if r.Errors > 0 {
			errs = append(errs, fmt.Sprintf("- %s %s %s c=%d: %d errors, first: `%s`", r.Store, r.Op, r.Population, r.Conc, r.Errors, r.FirstErr))
		}
	}
	if len(errs) > 0 {
		p("\n## Errors\n\n%s\n", strings.Join(errs, "\n"))
	}

	p("\n## Targets\n\n")
	p("- SQLite CreateEgress (durable, fresh command ID): p99 ≤ %.0f ms at every concurrency, and ≥ %.0f ops/s at concurrency > 1 (at concurrency 1 throughput is just 1/latency, so only p99 is judged). PostgreSQL creates have no target.\n", benchkit.MS(createMaxP99), createMinOpsPerS)
	p("- ListEgresses page of %d at %s (both stores, every concurrency): p99 ≤ %.0f ms, and p50 and p99 at most %.1f× the %s first page at the same concurrency.\n", pageSize, popLabel(b.cfg.large), benchkit.MS(listMaxP99), listMaxRatio, popLabel(b.cfg.small))
	p("- GetEgress has no target; %s rows are the baseline of the ratios.\n", popLabel(b.cfg.small))
	p("- Population `%s+` for creates: the store held %s seeded Egresses when creates began, plus those created by earlier create measurements.\n", popLabel(b.cfg.large), popLabel(b.cfg.large))
	return w.String()
}
