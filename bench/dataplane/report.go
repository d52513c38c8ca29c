//go:build linux

package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
)

// Targets of the issue.
const (
	execP50Max    = 5 * time.Millisecond
	execP99Max    = 20 * time.Millisecond
	ttfcP50Max    = 30 * time.Millisecond
	streamMinPct  = 50.0
	refusalP99Max = 100 * time.Millisecond
	closeP99Max   = time.Second
)

// dist is a sorted sample of durations.
type dist []time.Duration

func newDist(ds []time.Duration) dist {
	d := slices.Clone(ds)
	slices.Sort(d)
	return d
}

// p is the nearest-rank q-th percentile in milliseconds (NaN when empty).
func (d dist) p(q float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q/100*float64(len(d)))) - 1
	i = max(0, min(i, len(d)-1))
	return benchkit.MS(d[i])
}

func (d dist) max() float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	return benchkit.MS(d[len(d)-1])
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	if math.Abs(v) >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// mibps returns the median and the best MiB/s of runs.
func mibps(runs []streamRun) (median, best float64) {
	if len(runs) == 0 {
		return math.NaN(), math.NaN()
	}
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = r.mibps()
	}
	slices.Sort(v)
	median = v[len(v)/2]
	if len(v)%2 == 0 {
		median = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return median, v[len(v)-1]
}

func (b *bench) report() string {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	host, _ := os.Hostname()
	p("# Data plane, end to end (%s)\n\n", b.started.UTC().Format("2006-01-02 15:04 UTC"))
	p("- Command: `go run ./bench/dataplane %s` (as root)\n", strings.Join(b.cfg.args, " "))
	p("- Host: %s, %s/%s, kernel %s, nproc %s (%s), %s\n", host, runtime.GOOS, runtime.GOARCH, kernel(), benchkit.NProc(), benchkit.CPUModel(), runtime.Version())
	p("- Load average (1 5 15 min): start %s, end %s (the machine is shared: other engineers' builds and tests run on the same CPUs)\n", b.loadStart, b.loadEnd)
	if len(b.phaseLoad) > 0 {
		p("- Per measurement (1-minute load average is the first number): %s\n", strings.Join(b.phaseLoad, "; "))
	}
	p("- Source: %s", b.srcRev)
	if b.srv != nil && b.srv.Revision != "" {
		p("; server reports %s", b.srv.Revision)
	}
	p("\n- Workspaces: memory %d MiB, cpu %d millis, writable layer %d MiB, default template (busybox); reference: %s\n",
		wsSpec.MemoryMiB, wsSpec.CPUMillis, wsSpec.LayerBytes>>20, orNone(b.crunVer))
	p("- Client: connect-go over golang.org/x/net/http2, TLS (dev CA, no client certificate), one HTTP/2 connection for the data plane; Bearer data-plane token (EXEC)\n\n")

	p("## Summary\n\n| measurement | ours | reference | ratio | target | met? |\n|---|---|---|---|---|---|\n")
	if r := b.exec; r != nil {
		o, f := newDist(r.Ours), newDist(r.Ref)
		p("| exec `true` p50, ms | %s | %s | %s | ≤ 5 ms | %s |\n", ms(o.p(50)), ms(f.p(50)), ratio(o.p(50), f.p(50)), yes(len(o) > 0 && o.p(50) <= benchkit.MS(execP50Max)))
		p("| exec `true` p99, ms | %s | %s | %s | ≤ 20 ms | %s |\n", ms(o.p(99)), ms(f.p(99)), ratio(o.p(99), f.p(99)), yes(len(o) > 0 && o.p(99) <= benchkit.MS(execP99Max)))
	}
	if r := b.ttfc; r != nil {
		t := newDist(pick(r.Samples, func(s ttfcSample) time.Duration { return s.Total }))
		p("| time to first command p50, ms | %s | — | — | ≤ 30 ms | %s |\n", ms(t.p(50)), yes(len(t) > 0 && t.p(50) <= benchkit.MS(ttfcP50Max)))
		p("| time to first command p99, ms | %s | — | — | — | — |\n", ms(t.p(99)))
	}
	if r := b.stream; r != nil {
		om, _ := mibps(r.Ours)
		cm, _ := mibps(r.Connect)
		rm, _ := mibps(r.Raw)
		p("| streaming, MiB/s (median) vs connect handler | %.0f | %.0f | %s | ≥ 50 %% | %s |\n", om, cm, pct(om, cm), yes(om/cm*100 >= streamMinPct))
		p("| streaming, MiB/s (median) vs raw HTTP/2 body | %.0f | %.0f | %s | ≥ 50 %% | %s |\n", om, rm, pct(om, rm), yes(om/rm*100 >= streamMinPct))
		if len(r.Source) > 0 {
			sm, _ := mibps(r.Source)
			p("| streaming vs `head -c \\| cat` in the workspace (nothing sent), MiB/s | %.0f | %.0f | %s | — | — |\n", om, sm, pct(om, sm))
		}
		if len(r.OursDD) > 0 {
			dm, _ := mibps(r.OursDD)
			p("| streaming with `dd bs=1M` as the source vs connect handler, MiB/s | %.0f | %.0f | %s | — | — |\n", dm, cm, pct(dm, cm))
		}
	}
	if r := b.revoke; r != nil {
		rf, st := newDist(r.Refusal), newDist(r.Stream)
		p("| revocation answered → old token refused, p99 ms | %s | — | — | ≤ 100 ms | %s |\n", ms(rf.p(99)), yes(len(rf) > 0 && rf.p(99) <= benchkit.MS(refusalP99Max) && r.LateOK == 0))
		p("| revocation answered → open stream closed, p99 ms | %s | — | — | ≤ 1 s | %s |\n", ms(st.p(99)), yes(len(st) > 0 && st.p(99) <= benchkit.MS(closeP99Max)))
	}
	if r := b.files; r != nil {
		um, _ := mibps(r.Up)
		dm, _ := mibps(r.Down)
		ucm, _ := mibps(r.RefUpConnect)
		dcm, _ := mibps(r.RefDownConnect)
		p("| files up (WriteFile), MiB/s vs connect | %.0f | %.0f | %s | — | — |\n", um, ucm, pct(um, ucm))
		p("| files down (ReadFile), MiB/s vs connect | %.0f | %.0f | %s | — | — |\n", dm, dcm, pct(dm, dcm))
		pm, _ := mibps(r.DownPlain)
		pcm, _ := mibps(r.RefDownConnectPlain)
		p("| files down, a client without gzip, MiB/s vs connect | %.0f | %.0f | %s | — | — |\n", pm, pcm, pct(pm, pcm))
		if len(r.KiboUp)+len(r.KiboDown) > 0 {
			km, _ := mibps(r.KiboUp)
			kd, _ := mibps(r.KiboDown)
			rp, _ := mibps(r.RefUpRaw)
			rg, _ := mibps(r.RefRaw)
			p("| `kibo workspace cp` in, MiB/s vs raw HTTP/2 POST | %.0f | %.0f | %s | — | — |\n", km, rp, pct(km, rp))
			p("| `kibo workspace cp` out, MiB/s vs raw HTTP/2 GET | %.0f | %.0f | %s | — | — |\n", kd, rg, pct(kd, rg))
		}
	}
	if r := b.conc; r != nil {
		p("| %d streams over %d workspaces: completed | %d/%d in %.2f s | — | — | all | %s |\n", r.Streams, r.Workspaces, r.Completed, r.Streams, r.Wall.Seconds(), yes(r.Completed == r.Streams))
	}
	p("\n")

	if r := b.exec; r != nil {
		o, f := newDist(r.Ours), newDist(r.Ref)
		p("## 1. Exec round trip of `true`\n\n")
		p("Ours: `StartProcess` sent → the `exited` event received on `ProcessEvents`, through the public endpoint over TLS, in one AVAILABLE workspace. ")
		p("Reference: `crun exec` of `true` in a running crun container of the same rootfs, layer and kibotos-guest (bench/internal/crunref), forked into the container's cgroup; fork of crun → its exit. ")
		p("%d measured runs each after %d warm-up runs, interleaved (alternating which goes first).\n\n", b.cfg.n, b.cfg.warmup)
		p("| | n | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|---|\n")
		p("| ours | %d | %s | %s | %s | %s |\n", len(o), ms(o.p(50)), ms(o.p(90)), ms(o.p(99)), ms(o.max()))
		p("| `crun exec` | %d | %s | %s | %s | %s |\n", len(f), ms(f.p(50)), ms(f.p(90)), ms(f.p(99)), ms(f.max()))
		p("| ratio ours / crun | | %s | %s | %s | |\n\n", ratio(o.p(50), f.p(50)), ratio(o.p(90), f.p(90)), ratio(o.p(99), f.p(99)))
		if r.RefErr != "" {
			p("Reference problem: `%s`\n\n", r.RefErr)
		}
		if len(r.Errors) > 0 {
			p("%d runs failed; first: `%s`\n\n", len(r.Errors), r.Errors[0])
		}
	}
	if r := b.ttfc; r != nil {
		p("## 2. Time to first command\n\n")
		p("`CreateWorkspace` sent → the output of `echo hi` received: create; wait with `GetWorkspaceCommand(wait_timeout=30s)` until the command is COMPLETED (the notifier-backed wait); `CreateDataPlaneSession` (EXEC); `StartProcess` + `ProcessEvents` until the first output. %d runs after 2 warm-up runs, one workspace each, deleted after (not timed).\n\n", len(r.Samples))
		p("| step | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|\n")
		for _, row := range []struct {
			name string
			f    func(ttfcSample) time.Duration
		}{
			{"create → AVAILABLE (the wait's answer)", func(s ttfcSample) time.Duration { return s.Create }},
			{"(create → the command's completed_at, server clock)", func(s ttfcSample) time.Duration { return s.Completed }},
			{"session (CreateDataPlaneSession)", func(s ttfcSample) time.Duration { return s.Session }},
			{"exec: StartProcess sent → first output", func(s ttfcSample) time.Duration { return s.Exec }},
			{"**total**", func(s ttfcSample) time.Duration { return s.Total }},
		} {
			d := newDist(pick(r.Samples, row.f))
			p("| %s | %s | %s | %s | %s |\n", row.name, ms(d.p(50)), ms(d.p(90)), ms(d.p(99)), ms(d.max()))
		}
		del := newDist(r.Delete)
		p("\nDelete after each (not in the total): p50 %s ms, p99 %s ms.\n\n", ms(del.p(50)), ms(del.p(99)))
		if len(r.Errors) > 0 {
			p("%d runs failed; first: `%s`\n\n", len(r.Errors), r.Errors[0])
		}
	}
	if r := b.stream; r != nil {
		p("## 3. Streaming\n\n")
		p("Ours: the stdout of `head -c %d /dev/zero` (busybox) in the workspace, read by the client from `ProcessEvents` through the public endpoint; `StartProcess` sent → `exited` received, bytes delivered. ", b.cfg.streamBytes)
		p("References, in this process on loopback, served by net/http's HTTP/2 with the TLS config kibotos-ctrl uses (its dev server certificate, `pki.ServerConfig` + `ctrl.TLSConfig`), read by the same kind of client (a second HTTP/2 connection with the same TLS config): ")
		p("*connect*: a connect-go `ProcessService.ProcessEvents` handler sending the same bytes as 32 KiB `output` events (read by the same client code as ours); *raw*: a handler writing the body in 32 KiB writes. ")
		p("%d runs each, alternating.\n\n", b.cfg.streamRepeats)
		p("| | runs | MiB/s median | MiB/s best | delivered MiB (each) | mean KiB per event (raw: per read) | dropped MiB (total, events) |\n|---|---|---|---|---|---|---|\n")
		for _, row := range []struct {
			name string
			runs []streamRun
		}{{"ours (`head -c`)", r.Ours}, {"ours (`dd bs=1M`)", r.OursDD}, {"`head -c \\| cat` in the workspace, nothing sent", r.Source}, {"connect handler", r.Connect}, {"raw HTTP/2 body", r.Raw}} {
			if len(row.runs) == 0 {
				continue
			}
			m, best := mibps(row.runs)
			var delivered []string
			var dropped, bytes int64
			var events, outEvents int
			for _, s := range row.runs {
				delivered = append(delivered, fmt.Sprintf("%.0f", float64(s.Bytes)/(1<<20)))
				dropped += s.Dropped
				events += s.DroppedEvents
				bytes += s.Bytes
				outEvents += s.Events
			}
			perEvent := math.NaN()
			if outEvents > 0 {
				perEvent = float64(bytes) / float64(outEvents) / 1024
			}
			p("| %s | %d | %.0f | %.0f | %s | %.1f | %.1f (%d) |\n", row.name, len(row.runs), m, best, strings.Join(delivered, ", "), perEvent, float64(dropped)/(1<<20), events)
		}
		om, ob := mibps(r.Ours)
		cm, cb := mibps(r.Connect)
		rm, rb := mibps(r.Raw)
		p("\nOurs as a share of the reference: median %s of connect, %s of raw; best %s of connect, %s of raw.\n\n", pct(om, cm), pct(om, rm), pct(ob, cb), pct(ob, rb))
		p("CPU per GiB delivered, in CPU-seconds (mean over the runs): *client* is this process (for the references, their server too), *ctrl* kibotos-ctrl with its node, *guest* the workspace's PID 1 and its reaped children (`head`); *throttled*: the time the workspace's cgroup spent throttled by its CPU quota (%d millis → whole vCPUs); *busy*: the machine's CPUs (all %s) busy.\n\n", wsSpec.CPUMillis, benchkit.NProc())
		p("| | client | ctrl | guest | throttled s | machine busy |\n|---|---|---|---|---|---|\n")
		for _, row := range []struct {
			name string
			runs []streamRun
		}{{"ours (`head -c`)", r.Ours}, {"connect handler", r.Connect}, {"raw HTTP/2 body", r.Raw}} {
			var self, ctl, guest, thr time.Duration
			var busy, gib float64
			for _, s := range row.runs {
				self += s.CPU.Self
				ctl += s.CPU.Ctrl
				guest += s.CPU.Guest
				thr += s.CPU.Throttled
				busy += s.CPU.Busy
				gib += float64(s.Bytes) / (1 << 30)
			}
			if gib == 0 {
				continue
			}
			p("| %s | %.2f | %.2f | %.2f | %.2f | %.0f %% |\n", row.name, self.Seconds()/gib, ctl.Seconds()/gib, guest.Seconds()/gib, thr.Seconds()/gib, busy/float64(len(row.runs))*100)
		}
		p("\n")
		if len(r.Errors) > 0 {
			p("Failures: `%s`\n\n", strings.Join(r.Errors, "`; `"))
		}
	}
	if r := b.revoke; r != nil {
		rf, rs, st := newDist(r.Refusal), newDist(r.RefusalFromSent), newDist(r.Stream)
		p("## 4. Revocation\n\n")
		p("Per round: a new EXEC token; an open `ProcessEvents` stream of a `sleep 1000` (started once) admitted (its first event received); a verifier loop calling `ListProcesses` with the token back to back (one at a time); then `RevokeWorkspaceDataPlane`. ")
		p("Times from the revocation's answer (client clock) to the verifier's first `unauthenticated` answer, and to the stream's end. %d rounds; %d verifier calls in all.\n\n", len(rf), r.Calls)
		p("| | n | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|---|\n")
		p("| revoke answered → first refusal of the old token | %d | %s | %s | %s | %s |\n", len(rf), ms(rf.p(50)), ms(rf.p(90)), ms(rf.p(99)), ms(rf.max()))
		p("| (revoke sent → first refusal) | %d | %s | %s | %s | %s |\n", len(rs), ms(rs.p(50)), ms(rs.p(90)), ms(rs.p(99)), ms(rs.max()))
		p("| revoke answered → open stream ended | %d | %s | %s | %s | %s |\n", len(st), ms(st.p(50)), ms(st.p(90)), ms(st.p(99)), ms(st.max()))
		rc := newDist(r.Call)
		p("| (the RevokeWorkspaceDataPlane call: sent → answered) | %d | %s | %s | %s | %s |\n\n", len(rc), ms(rc.p(50)), ms(rc.p(90)), ms(rc.p(99)), ms(rc.max()))
		var codes []string
		for k, v := range r.StreamCodes {
			codes = append(codes, fmt.Sprintf("%s: %d", k, v))
		}
		slices.Sort(codes)
		p("Streams ended with: %s. Old-token calls sent after the revocation was answered and still served: %d. A negative time means the refusal arrived before the revocation's own answer.\n\n", strings.Join(codes, ", "), r.LateOK)
		if len(r.Errors) > 0 {
			p("%d rounds failed; first: `%s`\n\n", len(r.Errors), r.Errors[0])
		}
	}
	if r := b.conc; r != nil {
		p("## 5. Concurrency\n\n")
		p("%d new workspaces (one `true` each first); then %d exec streams released at once, stream i in workspace i mod %d, each `sh -c 'head -c %d /dev/zero; echo done'` read to its `exited` event over the one data-plane connection. ", r.Workspaces, r.Streams, r.Workspaces, r.BytesEach)
		p("VmRSS of kibotos-ctrl (API, reconciler and the embedded node agent: one process) and of the workspaces' guests (the PID 1 of each workspace: the live process in the workspace's cgroup whose innermost NSpid is 1), read from /proc 2 s before, every 10 ms during (%d samples; peak), and 2 s after.\n\n", r.Samples)
		l := newDist(r.Latencies)
		p("- Completed: %d/%d (output `done`, exit 0); wall time %.2f s; per stream p50 %s ms, p99 %s ms\n", r.Completed, r.Streams, r.Wall.Seconds(), ms(l.p(50)), ms(l.p(99)))
		p("- Delivered %.0f MiB (%.0f MiB/s aggregate); dropped %.1f MiB\n", float64(r.Output)/(1<<20), float64(r.Output)/(1<<20)/r.Wall.Seconds(), float64(r.Dropped)/(1<<20))
		p("- CPU during the streams: client %.1f s, kibotos-ctrl %.1f s; machine busy %.0f %%\n", r.CPU.Self.Seconds(), r.CPU.Ctrl.Seconds(), r.CPU.Busy*100)
		p("\n| VmRSS, MiB | before | peak | after | (peak − before) / stream |\n|---|---|---|---|---|\n")
		per := func(peak, before uint64) string {
			if r.Streams == 0 || peak < before {
				return "—"
			}
			return fmt.Sprintf("%.0f KiB", float64(peak-before)/float64(r.Streams))
		}
		p("| kibotos-ctrl (with the node) | %.1f | %.1f | %.1f | %s |\n", kib(r.Before.Ctrl), kib(r.Peak.Ctrl), kib(r.After.Ctrl), per(r.Peak.Ctrl, r.Before.Ctrl))
		p("| guests (%d PID 1s, sum) | %.1f | %.1f | %.1f | %s |\n\n", r.Before.GuestsFound, kib(r.Before.Guests), kib(r.Peak.Guests), kib(r.After.Guests), per(r.Peak.Guests, r.Before.Guests))
		if len(r.Errors) > 0 {
			p("%d streams failed; first: `%s`\n\n", len(r.Errors), r.Errors[0])
		}
	}
	if b.files != nil {
		b.reportFiles(p)
	}
	if len(b.notes) > 0 {
		p("## Notes\n\n")
		for _, n := range b.notes {
			p("- %s\n", n)
		}
		p("\n")
	}
	return sb.String()
}

func pick[T any](s []T, f func(T) time.Duration) []time.Duration {
	out := make([]time.Duration, len(s))
	for i, v := range s {
		out[i] = f(v)
	}
	return out
}

func pct(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f %%", a/b*100)
}

func kib(v uint64) float64 { return float64(v) / 1024 }

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
