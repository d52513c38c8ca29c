//go:build linux

package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	"github.com/kibotos/kibotos/bench/internal/crunref"
)

// Targets of the issue.
const (
	seqP50Max    = 60 * time.Millisecond
	seqP99Max    = 150 * time.Millisecond
	refRatioMax  = 1.5
	stopP50Max   = 100 * time.Millisecond
	leakFreeNote = "none"
)

// pct returns the nearest-rank percentile q (0 < q <= 1) of sorted.
func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// dist is a sorted set of durations.
type dist []time.Duration

func newDist(ds []time.Duration) dist {
	d := slices.Clone(ds)
	slices.Sort(d)
	return d
}

func (d dist) p50() time.Duration { return pct(d, 0.50) }
func (d dist) p99() time.Duration { return pct(d, 0.99) }
func (d dist) max() time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[len(d)-1]
}
func (d dist) min() time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[0]
}

func sampleDist(ss []createSample, f func(*createSample) time.Duration) dist {
	var out []time.Duration
	for i := range ss {
		if ss[i].Err == nil && !ss[i].Observed.IsZero() {
			out = append(out, f(&ss[i]))
		}
	}
	return newDist(out)
}

func refDist(rs []crunref.Sample, f func(*crunref.Sample) time.Duration) dist {
	out := make([]time.Duration, 0, len(rs))
	for i := range rs {
		out = append(out, f(&rs[i]))
	}
	return newDist(out)
}

func f1(d time.Duration) string { return fmt.Sprintf("%.1f", benchkit.MS(d)) }

func verdict(ok bool, why string) string {
	if ok {
		return "**yes**"
	}
	return "**no** (" + why + ")"
}

func (b *bench) report() string {
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	ctx := context.Background()

	goVersion, err := benchkit.Output(ctx, b.modRoot, "go", "version")
	if err != nil {
		goVersion = runtime.Version()
	}
	rev := b.srcRev
	if rev == "" {
		rev = "unknown (not a git checkout)"
	}
	host, _ := os.Hostname()

	p("# Workspace benchmark: kibotos-ctrl --dev with its embedded node, real sandboxes\n\n")
	p("- Date: %s; whole run %.0f s\n", b.started.UTC().Format("2006-01-02 15:04:05 UTC"), time.Since(b.started).Seconds())
	p("- Command: `%s` (as root)\n", strings.TrimSpace("go run ./bench/workspacebench "+strings.Join(b.cfg.args, " ")))
	p("- Go: `%s`\n", goVersion)
	p("- Code measured: `%s`, git revision `%s`", b.srcDir, rev)
	if len(b.dirty) > 0 {
		d := b.dirty
		more := ""
		if len(d) > 25 {
			d, more = d[:25], fmt.Sprintf(", … (%d in all)", len(b.dirty))
		}
		p("; uncommitted changes outside bench/ when the binaries were built: %s%s", strings.Join(d, ", "), more)
	}
	p("\n")
	p("- Host: %s, %s/%s, kernel %s, nproc %s (%s), cgroup v%d\n", host, runtime.GOOS, runtime.GOARCH, kernelRelease(), benchkit.NProc(), benchkit.CPUModel(), cgroupVersion())
	p("- Load average at start %s", b.loadStart)
	if b.loadSeq != "" {
		p(", after the sequential phase %s", b.loadSeq)
	}
	p(", at end %s (includes this benchmark's own work)", b.loadEnd)
	if b.busyStart != "" {
		p("; other busy processes at start: %s", b.busyStart)
	}
	p("\n")
	p("- Server: `kibotos-ctrl --dev` (SQLite, embedded node agent) built with `CGO_ENABLED=0 go build ./cmd/kibotos-ctrl ./cmd/kibotos-guest`, data directory on %s (%s)\n", b.tmpFS, b.tmp)
	p("- Client: connect-go over golang.org/x/net/http2 with mutual TLS (dev operator certificate), one connection, in this process\n")
	if b.rootfs != "" {
		p("- Template: default (busybox-static), `%s`\n", strings.TrimPrefix(b.rootfs, b.tmp+"/"))
	}
	if b.ref != nil {
		p("- Reference: %s\n", b.crunVer)
	}

	seqObs := sampleDist(b.seq, (*createSample).observed)
	seqSrv := sampleDist(b.seq, (*createSample).completed)
	concObs := sampleDist(b.conc, (*createSample).observed)
	concSrv := sampleDist(b.conc, (*createSample).completed)
	refTot := refDist(b.refs, func(r *crunref.Sample) time.Duration { return r.Total })
	stops := newDist(b.seqStop)

	p("\n## Results\n\n")
	p("| # | measurement | n | p50 ms | p99 ms | target | met? |\n")
	p("|---|---|---:|---:|---:|---|---|\n")
	if b.cfg.seq > 0 {
		v := verdict(len(seqObs) > 0 && seqObs.p50() <= seqP50Max && seqObs.p99() <= seqP99Max && len(b.seqErrs) == 0,
			fmt.Sprintf("p50 %s, p99 %s ms; %d errors", f1(seqObs.p50()), f1(seqObs.p99()), len(b.seqErrs)))
		p("| 1 | CreateWorkspace → AVAILABLE, one after another (%s); client-observed, GetWorkspaceCommand every %v | %d | %s | %s | p50 ≤ %.0f ms, p99 ≤ %.0f ms | %s |\n",
			createSpec, b.cfg.poll, len(seqObs), f1(seqObs.p50()), f1(seqObs.p99()), benchkit.MS(seqP50Max), benchkit.MS(seqP99Max), v)
		p("| 1′ | same, CreateWorkspace sent → command `completed_at` (server clock, same host; no polling error) | %d | %s | %s | (lower bound of 1) | — |\n",
			len(seqSrv), f1(seqSrv.p50()), f1(seqSrv.p99()))
	}
	if b.cfg.conc > 0 {
		p("| 1b | CreateWorkspace → AVAILABLE, %d sent at once; client-observed, ListWorkspaces(CREATING) every %v | %d | %s | %s | — (no target; all %d AVAILABLE after %.0f ms; %d errors) | — |\n",
			b.cfg.conc, b.cfg.batchPoll, len(concObs), f1(concObs.p50()), f1(concObs.p99()), b.cfg.conc, benchkit.MS(b.concMakespan), len(b.concErrs))
		p("| 1b′ | same, → command `completed_at` | %d | %s | %s | — | — |\n", len(concSrv), f1(concSrv.p50()), f1(concSrv.p99()))
	}
	if b.ref != nil && len(refTot) > 0 {
		p("| 2 | Reference: crun, same rootfs + fresh ext4 layer on loop + overlay + kibotos-guest, until the guest answers (interleaved with 1) | %d | %s | %s | — | — |\n",
			len(refTot), f1(refTot.p50()), f1(refTot.p99()))
		if len(seqObs) > 0 {
			r50 := float64(seqObs.p50()) / float64(refTot.p50())
			r99 := float64(seqObs.p99()) / float64(refTot.p99())
			rs := float64(seqSrv.p50()) / float64(refTot.p50())
			p("| 2r | ratio 1 ÷ 2 (p50; p99 column: p99 ratio) | | **%.2f×** | %.2f× | p50 ≤ %.1f× | %s |\n",
				r50, r99, refRatioMax, verdict(r50 <= refRatioMax, fmt.Sprintf("%.2f×", r50)))
			p("| 2r′ | ratio 1′ ÷ 2 | | %.2f× | | (lower bound of 2r) | — |\n", rs)
		}
	}
	if len(stops) > 0 {
		p("| 3 | StopWorkspace (normal, guest writeback confirmed), idle workspace, until STOPPED | %d | %s | %s | p50 ≤ %.0f ms | %s |\n",
			len(stops), f1(stops.p50()), f1(stops.p99()), benchkit.MS(stopP50Max), verdict(stops.p50() <= stopP50Max, f1(stops.p50())+" ms"))
	}
	if r := b.idle; r != nil {
		idleObs := sampleDist(r.Samples, (*createSample).observed)
		p("| 4 | %d idle workspaces at once (%s): all AVAILABLE? (create latency; ListWorkspaces every 50 ms) | %d | %s | %s | all %d AVAILABLE | %s |\n",
			r.N, r.Spec, r.Available, f1(idleObs.p50()), f1(idleObs.p99()), r.N,
			verdict(r.Available == r.N && len(r.Errs) == 0, fmt.Sprintf("%d of %d; %d errors", r.Available, r.N, len(r.Errs))))
		dRSS := int64(r.After.RSS) - int64(r.Before.RSS)
		dAvail := int64(r.Before.MemAvailable) - int64(r.After.MemAvailable)
		p("| 4m | kibotos-ctrl (node agent) RSS before → with %d running: %.1f → %.1f MiB; per workspace | | %.1f KiB | | — (no target) | — |\n",
			r.N, float64(r.Before.RSS)/1024, float64(r.After.RSS)/1024, float64(dRSS)/float64(r.N))
		p("| 4h | host memory per workspace (MemAvailable %.0f → %.0f MiB) ÷ %d | | %.2f MiB | | — (no target) | — |\n",
			float64(r.Before.MemAvailable)/1024, float64(r.After.MemAvailable)/1024, r.N, float64(dAvail)/1024/float64(r.N))
	}
	leakV := verdict(len(b.leaks) == 0 && len(b.refLeaks) == 0 && len(b.finalLeak) == 0,
		fmt.Sprintf("%d left", len(b.leaks)+len(b.refLeaks)+len(b.finalLeak)))
	p("| 5 | leftovers after deleting everything (sandbox.Leaks of the node, writable layers, loop devices and mounts under the run's directory; reference: mounts, loops, crun state, cgroups) | | | | none | %s |\n", leakV)

	b.reportWake(p)
	b.reportBreakdown(p, seqObs)
	b.reportReference(p)
	b.reportStop(p)
	b.reportIdle(p)
	b.reportCPU(p)
	b.reportErrors(p)
	b.reportMethod(p)
	return w.String()
}

type printer func(format string, args ...any)

// reportBreakdown splits the sequential creates with the node's log.
func (b *bench) reportBreakdown(p printer, seqObs dist) {
	if len(b.seq) == 0 || b.slog == nil {
		return
	}
	var rpc, call, toNode, setup, guest, report, observe, total []time.Duration
	missing := 0
	for i := range b.seq {
		s := &b.seq[i]
		st, ok := b.slog.starts[s.ID]
		if !ok {
			missing++
			continue
		}
		rpc = append(rpc, s.Accepted.Sub(s.T0))
		if d, ok := b.slog.createCalls[s.CommandID]; ok {
			call = append(call, d)
		}
		toNode = append(toNode, st.begin().Sub(s.Accepted))
		setup = append(setup, st.Setup)
		guest = append(guest, st.Total-st.Setup)
		report = append(report, s.CompletedAt.Sub(st.Time))
		observe = append(observe, s.Observed.Sub(s.CompletedAt))
		total = append(total, s.observed())
	}
	p("\n## Where the time of a sequential create goes\n\n")
	p("Each create split at the client's clock and the server's records (same host clock): the command's `completed_at`, and the embedded node's `execution started` log record (logged at the end of the runtime's Start, with its `total` and `setup` durations). Percentiles are per component, so the p50 column does not add up exactly to the p50 of the total. %d of %d creates had no node record.\n\n", missing, len(b.seq))
	p("| component | what it contains | p50 ms | p99 ms | mean ms |\n|---|---|---:|---:|---:|\n")
	row := func(name, what string, ds []time.Duration) {
		d := newDist(ds)
		p("| %s | %s | %s | %s | %s |\n", name, what, f1(d.p50()), f1(d.p99()), f1(mean(ds)))
	}
	row("A. CreateWorkspace RPC", "client → server → client: validation, durable admission (SQLite commit + fsync), TLS/HTTP/2", rpc)
	if len(call) > 0 {
		row("  A.1 of which server handler", "the server's own `call` log duration", call)
	}
	row("B. accepted → node Start begins", "reconciler kick and pass (pending query, placement transaction + commit), desired state pushed on the node stream, agent worker, STARTING report queued, template lookup, runtime lock and releaseLeftovers", toNode)
	row("C. node Start: setup", "writable layer (sparse file + mkfs.ext4 + fsyncs), state file, cgroup, loop device, init shim in new namespaces (mounts, pivot_root), exec of kibotos-guest", setup)
	row("D. node Start: guest wait", "guest exec'd → its first ping answered (the runtime's readiness wait), state file, health start", guest)
	row("E. node Start end → completed_at", "RUNNING report over the node stream, report transaction", report)
	row("F. completed_at → client sees COMPLETED", fmt.Sprintf("commit of E, polling resolution (%v pause + one GetWorkspaceCommand round trip)", b.cfg.poll), observe)
	row("total (client-observed)", "", total)
	b.reportInsideStart(p)
}

// reportInsideStart splits the node's Start (C and D above) with the
// inotify tracer's timestamps.
func (b *bench) reportInsideStart(p printer) {
	if b.tracer == nil || b.slog == nil {
		return
	}
	// Runtimes before the shim was born in its cgroup wrote three state
	// files per start (starting, + pid after the fork, running); later
	// ones write two (starting, running), so C4 and C5 have no boundary
	// there, and make the layer while they write the first and make the
	// cgroup, so C1-C3 are one row (the layer alone is shown apart).
	names3 := []string{
		"C1. Start begins → layer image created",
		"C2. layer: mkfs.ext4 of a sparse image, fsync, rename",
		"C3. directory fsync, state file #1 (fsync), cgroup with limits",
		fmt.Sprintf("C4. log file, loop device, fork + exec of the init shim (the node's InitBinary: kibotos-guest, %.1f MB, since b7d7b67; before, kibotos-ctrl itself, %.1f MB)", b.guestMB, b.ctrlMB),
		"C5. state file #2 (fsync), cgroup join, configuration; in the shim: its start-up, cgroup namespace, ext4 + overlay + /proc /sys /dev /tmp /run mounts, pivot_root, exec of kibotos-guest",
		"D1. kibotos-guest start-up until it listens on its socket",
		"D2. socket exists → the runtime's first ping answered (its readiness wait: ping retries, or a readiness signal, depending on the runtime's version)",
		"D3. state file #3 (fsync), health checker, log record",
	}
	names2 := []string{
		"C1-C3. layer (sparse clone or mkfs.ext4, fsync, rename, directory fsync) in parallel with state file #1 (file fsync'd, directory not) and the cgroup with limits",
		fmt.Sprintf("C4+C5. log file, loop device, fork + exec of the init shim inside the execution's cgroup (kibotos-guest, %.1f MB), configuration; in the shim: its start-up, cgroup namespace, ext4 + overlay + /proc /sys /dev /tmp /run mounts, pivot_root, exec of kibotos-guest", b.guestMB),
		names3[5],
		names3[6],
		"D3. state file #2 (running; file fsync'd, directory not), health checker, log record",
	}
	namesChannel := []string{names2[0], names2[1],
		"D1+D2. kibotos-guest start-up until the runtime's first request on its channel is answered (its readiness wait)",
		names2[4],
	}
	var names []string
	var segs [][]time.Duration
	var layerAlone []time.Duration
	n := 0
	for i := range b.seq {
		s := &b.seq[i]
		st, ok := b.slog.starts[s.ID]
		ev, ok2 := b.tracer.get(s.ID)
		if !ok || !ok2 || ev.LayerNew.IsZero() || ev.LayerReady.IsZero() || ev.RunDir.IsZero() || len(ev.StateBegin) < 2 {
			continue
		}
		begin, setupEnd, end := st.begin(), st.begin().Add(st.Setup), st.Time
		var marks []time.Time
		switch {
		case ev.GuestSock.IsZero() && len(ev.StateBegin) == 2:
			// Runtimes whose guest serves on the node's channel create no
			// socket file: guest start-up and the first answer are one row.
			marks = []time.Time{begin, ev.RunDir, setupEnd, ev.StateBegin[1], end}
			layerAlone = append(layerAlone, ev.LayerReady.Sub(ev.LayerNew))
		case ev.GuestSock.IsZero():
			continue
		case len(ev.StateBegin) >= 3:
			marks = []time.Time{begin, ev.LayerNew, ev.LayerReady, ev.RunDir, ev.StateBegin[1], setupEnd, ev.GuestSock, ev.StateBegin[2], end}
		default:
			marks = []time.Time{begin, ev.RunDir, setupEnd, ev.GuestSock, ev.StateBegin[1], end}
			layerAlone = append(layerAlone, ev.LayerReady.Sub(ev.LayerNew))
		}
		if names == nil {
			switch len(marks) - 1 {
			case len(names3):
				names = names3
			case len(names2):
				names = names2
			default:
				names = namesChannel
			}
			segs = make([][]time.Duration, len(names))
		}
		if len(marks) != len(names)+1 {
			continue // a run mixes both (cannot happen: one server binary)
		}
		for j := range names {
			segs[j] = append(segs[j], marks[j+1].Sub(marks[j]))
		}
		n++
	}
	if n == 0 {
		return
	}
	p("\n### Inside the node's Start (C + D)\n\n")
	p("Timestamps from an inotify watch of the node's state directory (the layer image appearing and renamed in, the state file writes, the run directory, the guest's socket appearing through its bind mount), combined with the `setup` and `total` of the node's log record; %d of %d sequential creates fully traced. Inotify times are when the benchmark read the event, so a busy machine shifts time between neighbouring rows.\n\n", n, len(b.seq))
	p("| step | p50 ms | p99 ms | mean ms |\n|---|---:|---:|---:|\n")
	for j, name := range names {
		d := newDist(segs[j])
		p("| %s | %s | %s | %s |\n", name, f1(d.p50()), f1(d.p99()), f1(mean(segs[j])))
	}
	if len(layerAlone) > 0 && len(names) != len(names3) {
		d := newDist(layerAlone)
		p("| of which, in parallel: layer image created → renamed in (C2 before) | %s | %s | %s |\n", f1(d.p50()), f1(d.p99()), f1(mean(layerAlone)))
	}
	if len(b.refs) > 0 {
		lay := refDist(b.refs, func(r *crunref.Sample) time.Duration { return r.Layer })
		p("\nFor comparison the reference's identical layer step (C2 + the directory fsync) takes %s ms p50.\n", f1(lay.p50()))
	}
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s / time.Duration(len(ds))
}

func (b *bench) reportReference(p printer) {
	if b.ref == nil || len(b.refs) == 0 {
		return
	}
	p("\n## Reference (crun) breakdown\n\n")
	p("| step | p50 ms | p99 ms | mean ms |\n|---|---:|---:|---:|\n")
	for _, c := range []struct {
		name string
		f    func(*crunref.Sample) time.Duration
	}{
		{"layer: sparse image, mkfs.ext4 (runtime's options), fsync, rename, fsync dir", func(r *crunref.Sample) time.Duration { return r.Layer }},
		{"mounts: loop device (LOOP_CONFIGURE, autoclear), ext4, overlay over the template", func(r *crunref.Sample) time.Duration { return r.Mounts }},
		{"`crun run --detach`: namespaces, cgroup + limits, container mounts, pivot_root, exec of kibotos-guest", func(r *crunref.Sample) time.Duration { return r.Crun }},
		{fmt.Sprintf("ready: crun returned → guest answers a ping (polled every %v)", crunref.PingEvery), func(r *crunref.Sample) time.Duration { return r.Ready }},
		{"**total**", func(r *crunref.Sample) time.Duration { return r.Total }},
		{"teardown (not in total): crun delete --force, unmounts, loop detach, removal", func(r *crunref.Sample) time.Duration { return r.Teardown }},
	} {
		var ds []time.Duration
		for i := range b.refs {
			ds = append(ds, c.f(&b.refs[i]))
		}
		d := newDist(ds)
		p("| %s | %s | %s | %s |\n", c.name, f1(d.p50()), f1(d.p99()), f1(mean(ds)))
	}
	lay := refDist(b.refs, func(r *crunref.Sample) time.Duration { return r.Layer })
	noLayer := refDist(b.refs, func(r *crunref.Sample) time.Duration { return r.Total - r.Layer })
	p("\nWithout the layer creation the reference takes %s ms p50 (the layer: %s ms).\n", f1(noLayer.p50()), f1(lay.p50()))
}

func (b *bench) reportStop(p printer) {
	if len(b.seqStop) == 0 {
		return
	}
	var client, wb, kr, rest []time.Duration
	for i, id := range b.seqStopWS {
		if b.slog == nil {
			break
		}
		st, ok := b.slog.stops[id]
		if !ok {
			continue
		}
		client = append(client, b.seqStop[i])
		wb = append(wb, st.Writeback)
		kr = append(kr, st.KillRelease)
		rest = append(rest, b.seqStop[i]-st.Writeback-st.KillRelease)
	}
	del := newDist(b.seqDelete)
	p("\n## Where the time of a normal stop goes\n\n")
	p("The workspace had just become AVAILABLE (idle: only kibotos-guest runs in it). From the node's `execution stopped` record.\n\n")
	p("| component | p50 ms | p99 ms | mean ms |\n|---|---:|---:|---:|\n")
	for _, c := range []struct {
		name string
		ds   []time.Duration
	}{
		{"StopWorkspace, client-observed (admission → STOPPED)", client},
		{"node: guest writeback (syncfs of the layer, confirmed over the socket)", wb},
		{"node: kill PID 1, wait for the loop device to detach, remove the cgroup", kr},
		{"rest: admission commit, reconciler push, agent, STOPPED report, completion wake-up of the waiting call", rest},
	} {
		d := newDist(c.ds)
		p("| %s | %s | %s | %s |\n", c.name, f1(d.p50()), f1(d.p99()), f1(mean(c.ds)))
	}
	p("\nDeleteWorkspace of the stopped workspace (for information): p50 %s ms, p99 %s ms, n=%d.\n", f1(del.p50()), f1(del.p99()), len(del))
}

func (b *bench) reportIdle(p printer) {
	r := b.idle
	if r == nil {
		return
	}
	p("\n## %d idle workspaces\n\n", r.N)
	p("Created at once, %s each; memory read %v after the last became AVAILABLE (so that health pings run), and %v before creating the first.\n\n", r.Spec, b.cfg.settle, b.cfg.settle)
	p("| metric | before (0 running) | with %d running | delta | per workspace | after deleting all |\n|---|---:|---:|---:|---:|---:|\n", r.N)
	kib := func(name string, f func(memReading) uint64, sign int64) {
		bf, af, ad := int64(f(r.Before)), int64(f(r.After)), int64(f(r.AfterDelete))
		d := (af - bf) * sign
		p("| %s | %.1f MiB | %.1f MiB | %+.1f MiB | %.1f KiB | %.1f MiB |\n", name, float64(bf)/1024, float64(af)/1024, float64(d)/1024, float64(d)/float64(r.N), float64(ad)/1024)
	}
	kib("kibotos-ctrl VmRSS (API + reconciler + embedded node agent)", func(m memReading) uint64 { return m.RSS }, 1)
	kib("kibotos-ctrl RssAnon", func(m memReading) uint64 { return m.RssAnon }, 1)
	p("| kibotos-ctrl Go heap in use | %.1f MiB | %.1f MiB | %+.1f MiB | %.1f KiB | %.1f MiB |\n", r.Before.HeapInuse/(1<<20), r.After.HeapInuse/(1<<20),
		(r.After.HeapInuse-r.Before.HeapInuse)/(1<<20), (r.After.HeapInuse-r.Before.HeapInuse)/1024/float64(r.N), r.AfterDelete.HeapInuse/(1<<20))
	p("| kibotos-ctrl goroutines | %.0f | %.0f | %+.0f | %.1f | %.0f |\n", r.Before.Goroutines, r.After.Goroutines, r.After.Goroutines-r.Before.Goroutines,
		(r.After.Goroutines-r.Before.Goroutines)/float64(r.N), r.AfterDelete.Goroutines)
	p("| kibotos-ctrl threads | %d | %d | %+d | | %d |\n", r.Before.Threads, r.After.Threads, int64(r.After.Threads)-int64(r.Before.Threads), r.AfterDelete.Threads)
	kib("host memory used (MemAvailable decrease)", func(m memReading) uint64 { return m.MemAvailable }, -1)
	kib("host kernel slab", func(m memReading) uint64 { return m.Slab }, 1)
	p("| charged to the executions' cgroups (%d → %d cgroups) | %.1f MiB | %.1f MiB | %+.1f MiB | %.1f KiB | %.1f MiB |\n", r.Before.Cgroups, r.After.Cgroups,
		float64(r.Before.CgroupBytes)/(1<<20), float64(r.After.CgroupBytes)/(1<<20), (float64(r.After.CgroupBytes)-float64(r.Before.CgroupBytes))/(1<<20),
		(float64(r.After.CgroupBytes)-float64(r.Before.CgroupBytes))/1024/float64(r.N), float64(r.AfterDelete.CgroupBytes)/(1<<20))
	obs := sampleDist(r.Samples, (*createSample).observed)
	srv := sampleDist(r.Samples, (*createSample).completed)
	del := newDist(r.DeleteLat)
	p("\n- Creation: %d of %d AVAILABLE; last one %.1f s after the first request; per workspace client-observed p50 %s ms, p99 %s ms (to `completed_at`: p50 %s, p99 %s ms).\n",
		r.Available, r.N, r.Makespan.Seconds(), f1(obs.p50()), f1(obs.p99()), f1(srv.p50()), f1(srv.p99()))
	p("- Deletion, all at once: %d deleted in %.1f s; DeleteWorkspace p50 %s ms, p99 %s ms.\n", len(r.DeleteLat), r.DeleteSpan.Seconds(), f1(del.p50()), f1(del.p99()))
	p("- CPU while the %d sat idle (%v): kibotos-ctrl %.1f%% of one CPU (health pings every 2 s per execution), machine %.0f%% busy.\n",
		r.N, r.CPUIdle.Wall.Round(time.Second), 100*r.CPUIdle.Server.Seconds()/r.CPUIdle.Wall.Seconds(), 100*r.CPUIdle.MachineBusy)
	p("- Leftovers after deleting everything, server still running: %s.", listOrNone(b.leaks))
	if b.ref != nil {
		p(" Reference: %s.", listOrNone(b.refLeaks))
	}
	p(" After cleanup: %s.\n", listOrNone(b.finalLeak))
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return leakFreeNote
	}
	if len(l) > 10 {
		return fmt.Sprintf("%d items: %s, …", len(l), strings.Join(l[:10], "; "))
	}
	return strings.Join(l, "; ")
}

func (b *bench) reportCPU(p printer) {
	p("\n## CPU\n\n")
	p("| phase | wall s | kibotos-ctrl CPU s | benchmark process CPU s | machine busy |\n|---|---:|---:|---:|---:|\n")
	row := func(name string, u cpuUse) {
		if u.Wall == 0 {
			return
		}
		p("| %s | %.1f | %.1f | %.1f | %.0f%% |\n", name, u.Wall.Seconds(), u.Server.Seconds(), u.Self.Seconds(), 100*u.MachineBusy)
	}
	row(fmt.Sprintf("sequential (%d creates + stops + deletes, and the reference)", len(b.seq)), b.cpuSeq)
	row(fmt.Sprintf("%d at once, creation", b.cfg.conc), b.cpuConc)
	if b.idle != nil {
		row(fmt.Sprintf("%d idle, creation", b.idle.N), b.idle.CPUCreate)
		row(fmt.Sprintf("%d idle, idle", b.idle.N), b.idle.CPUIdle)
	}
	p("\nThe machine has %s CPUs; the benchmark client, kibotos-ctrl, the executions and anything else on the machine share them. kibotos-ctrl's CPU excludes the init shims and guests (their own processes).\n", benchkit.NProc())
}

func (b *bench) reportErrors(p printer) {
	var lines []string
	add := func(what string, errs []string) {
		if len(errs) > 0 {
			lines = append(lines, fmt.Sprintf("- %s: %d errors, first: `%s`", what, len(errs), errs[0]))
		}
	}
	add("sequential", b.seqErrs)
	add("reference", b.refErrs)
	add("at once", b.concErrs)
	add("wake", b.wakeErrs)
	if b.idle != nil {
		add("idle", b.idle.Errs)
	}
	if b.slog != nil && b.slog.nProblem > 0 {
		lines = append(lines, fmt.Sprintf("- kibotos-ctrl logged %d WARN/ERROR records, first: `%s`", b.slog.nProblem, b.slog.problems[0]))
	}
	if b.ref != nil && b.ref.OOMAdjErr() != nil {
		lines = append(lines, fmt.Sprintf("- reference: oom_score_adj -998 could not be set (`%v`); the runtime's init shim ignores the same failure (no CAP_SYS_RESOURCE here), so neither has it", b.ref.OOMAdjErr()))
	}
	for _, n := range b.notes {
		lines = append(lines, "- "+n)
	}
	if len(lines) > 0 {
		p("\n## Errors and notes\n\n%s\n", strings.Join(lines, "\n"))
	}
}

func (b *bench) reportMethod(p printer) {
	p("\n## Method and measurement error\n\n")
	p("- Order: %d unrecorded warm-up rounds; then %d sequential rounds, each `CreateWorkspace` → wait for the command → normal `StopWorkspace` → `DeleteWorkspace` (so every create finds an empty node), with one reference start interleaved per round (alternately before and after ours, so both see the same background); then %d rounds of the polling-vs-waiting comparison, each create also stopped and deleted; then %d created at once and deleted at once; then %d idle ones.\n",
		b.cfg.warmup, b.cfg.seq, b.cfg.wake, b.cfg.conc, b.cfg.idle)
	p("- Client-observed latency (rows 1, 1b, 4): from just before `CreateWorkspace` is sent to the arrival of the first answer showing completion. The API has no watch, so completion is polled: sequentially `GetWorkspaceCommand` with a %v pause between polls (error: up to the pause plus one round trip, about %v + 0.3 ms, on top of the true time); at once, one `ListWorkspaces(states=[CREATING])` with a %v pause (50 ms in phase 4).\n",
		b.cfg.poll, b.cfg.poll, b.cfg.batchPoll)
	p("- `completed_at` rows (1′, 1b′): the command's completion time recorded by ctrl inside the completing transaction (microseconds, same host clock as the client), minus the client's send time: no polling error, but it excludes that transaction's commit and the answer's way back, so it is a lower bound.\n")
	p("- Reference (row 2): see the breakdown; it includes everything our node does to start an execution except what only a control plane does (API, store, reconciler, node stream, state files). Its readiness is polled every %v (a tight poll: whatever readiness wait our runtime has is part of ours). Its layer and overlay are mounted from a harness thread with its own mount namespace (ours: by the init shim in the execution's namespace), and crun's cgroup-v1 `/sys/fs/cgroup` mounts every controller (ours: memory only).\n", crunref.PingEvery)
	p("- Stop (row 3): `StopWorkspace` waits for completion; latency from send to answer.\n")
	p("- Memory (rows 4m, 4h): VmRSS of the kibotos-ctrl process (one process: API, store, reconciler and the embedded node agent; the init shims exec into kibotos-guest, which runs in the executions' own cgroups and is not part of it). Host memory: the decrease of MemAvailable (page cache, kernel memory of namespaces, mounts, loop devices and ext4 included) divided by the number of workspaces; anything else running on the machine skews it, see the load average.\n")
	p("- Percentiles are nearest-rank: for n ≤ 100, p99 is the largest or second-largest value.\n")
}
