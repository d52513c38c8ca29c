//go:build linux

package main

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
)

// Targets of the issue.
const (
	directMinGbps      = 1.0
	directMinPct       = 50.0 // of the kernel path
	egressMinPct       = 50.0 // of a host client through the same Dante
	connectAddedP50Max = 500 * time.Microsecond
	followP99Max       = 100 * time.Millisecond
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
	return benchkit.MS(d[max(0, min(i, len(d)-1))])
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func best(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return slices.Max(xs)
}

func num(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

func pct(a, b float64) string { return num(100*a/b, 1) + " %" }

func yes(ok bool, measured bool) string {
	switch {
	case !measured:
		return "—"
	case ok:
		return "yes"
	}
	return "**no**"
}

func (b *bench) path(name string) *pathResult {
	for _, p := range b.paths {
		if strings.HasPrefix(p.Name, name) {
			return p
		}
	}
	return &pathResult{}
}

func (b *bench) report() string {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	p("# Network data path, end to end (%s UTC)\n\n", b.started.UTC().Format("2006-01-02 15:04"))
	p("- Command: `%s` (as root)\n", strings.Join(append([]string{"go run ./bench/network"}, b.cfg.args...), " "))
	p("- Host: %s/%s, nproc %s (%s), %s\n", runtime.GOOS, runtime.GOARCH, benchkit.NProc(), benchkit.CPUModel(), runtime.Version())
	p("- Load average (1 5 15 min): start %s, end %s (the machine is shared: other engineers' builds and tests run on the same CPUs)\n", b.loadStart, b.loadEnd)
	if len(b.phaseLoad) > 0 {
		p("- Per measurement: %s\n", strings.Join(b.phaseLoad, "; "))
	}
	p("- Source: %s (the working tree)\n", b.srcRev)
	p("- Workspace: memory %d MiB, cpu %d millis, default template; netprobe (internal/nettest/netprobe, static Go) copied in with the FileService and run through the ProcessService\n", b.cfg.wsMemMiB, b.cfg.wsCPU)
	p("- Servers: internal/nettest Sink/Source/Hold in a network namespace joined to the host by a veth pair (10.231.N.0/24), with Debian's danted (no authentication) next to them as the Egress\n")
	if b.natNote != "" {
		p("- Kernel reference: %s\n", b.natNote)
	}
	p("\n## Summary\n\n")
	p("| measurement | ours | reference | ratio | target | met? |\n|---|---|---|---|---|---|\n")
	d, k, e, h := b.path("workspace, direct"), b.path("kernel"), b.path("workspace, through"), b.path("host client through")
	if len(b.paths) > 0 {
		for _, dir := range []struct {
			name   string
			get    func(*pathResult) []float64
			suffix string
		}{{"upload (workspace → server)", func(r *pathResult) []float64 { return r.Up }, "up"}, {"download (server → workspace)", func(r *pathResult) []float64 { return r.Down }, "down"}} {
			dm, km := median(dir.get(d)), median(dir.get(k))
			p("| direct TCP %s, Gbit/s (median) vs kernel veth + NAT | %s | %s | %s | ≥ %.0f Gbit/s and ≥ %.0f %% | %s |\n", dir.name, num(dm, 2), num(km, 2), pct(dm, km),
				directMinGbps, directMinPct, yes(dm >= directMinGbps && 100*dm/km >= directMinPct, !math.IsNaN(dm) && !math.IsNaN(km)))
			em, hm := median(dir.get(e)), median(dir.get(h))
			p("| through the Egress, %s, Gbit/s (median) vs a host client through the same Dante | %s | %s | %s | ≥ %.0f %% | %s |\n", dir.name, num(em, 2), num(hm, 2), pct(em, hm),
				egressMinPct, yes(100*em/hm >= egressMinPct, !math.IsNaN(em) && !math.IsNaN(hm)))
		}
		dc, kc := newDist(d.Connect).p(50), newDist(k.Connect).p(50)
		p("| connect p50, ms: direct vs kernel veth + NAT | %s | %s | +%s ms | ≤ +%.1f ms | %s |\n", num(dc, 3), num(kc, 3), num(dc-kc, 3),
			benchkit.MS(connectAddedP50Max), yes(dc-kc <= benchkit.MS(connectAddedP50Max), !math.IsNaN(dc) && !math.IsNaN(kc)))
		ec, hc := newDist(e.Connect).p(50), newDist(h.Connect).p(50)
		p("| connect p50, ms: through the Egress vs a host client's CONNECT through the same Dante | %s | %s | +%s ms | — | — |\n", num(ec, 3), num(hc, 3), num(ec-hc, 3))
	}
	if r := b.idle; r != nil {
		per := float64(r.RSSWith-r.RSSBefore) / float64(max(r.Opened, 1)) / 1024
		p("| %d idle connections through one workspace: opened; node RSS per connection | %d/%d; %s KiB | — | — | all open, memory reported | %s |\n",
			r.Want, r.Opened, r.Want, num(per, 1), yes(r.Opened == r.Want && r.Err == "", true))
	}
	if r := b.follow; r != nil {
		lag := newDist(r.Lag)
		p("| policy update → new flows follow it, p99 ms (%d updates) | %s | — | — | ≤ %.0f ms | %s |\n", r.Toggles, num(lag.p(99), 1),
			benchkit.MS(followP99Max), yes(lag.p(99) <= benchkit.MS(followP99Max) && r.Missed == 0 && r.Err == "", len(lag) > 0))
	}

	if len(b.paths) > 0 {
		p("\n## 1. Throughput and connect latency\n\n")
		p("Each path moves %d MiB up (netprobe writes to a nettest Sink, half-closes and waits for the Sink's byte count) and down (a nettest Source writes them; netprobe reads to the end), %d times per direction; the paths take turns (one transfer each, then the next round). The time is the client's, from its first byte to the last. Then %d connects one after another (each closed at once with SO_LINGER 0): connect() called → returned.\n\n",
			b.cfg.bytes>>20, b.cfg.repeats, b.cfg.connects)
		p("- *workspace, direct*: netprobe in the workspace → its eth0 (a TAP) → the node's gVisor stack, which decides the SYN and dials the server from the host before completing the handshake → the server.\n")
		p("- *kernel veth + NAT (reference)*: the same netprobe in a second network namespace (the \"fake workspace\") joined to the host by its own veth pair; the host forwards to the server's link and masquerades (nftables), so the server sees the host's address as from the node.\n")
		p("- *workspace, through the Egress*: as direct, but the policy routes these server ports through the Egress: the node speaks SOCKS5 CONNECT to danted, which connects to the server.\n")
		p("- *host client through the same Dante (reference)*: a client in the benchmark process on the host: SOCKS5 CONNECT (internal/socks5) to the same danted, then the same transfer.\n")
		p("- *host client, direct*: the benchmark process dialing the server from the host (the veth alone).\n\n")
		p("| path | up Gbit/s median | up best | down Gbit/s median | down best | connect p50 ms | p90 ms | p99 ms | connects failed | errors |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range b.paths {
			cd := newDist(r.Connect)
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %d | %d |\n", r.Name, num(median(r.Up), 2), num(best(r.Up), 2), num(median(r.Down), 2), num(best(r.Down), 2),
				num(cd.p(50), 3), num(cd.p(90), 3), num(cd.p(99), 3), r.ConnFailed, len(r.Errors))
		}
		p("\nkibotos-node's CPU time (user and system, all its threads, from /proc/PID/stat) per GiB moved, over each transfer of the workspace's paths (the netprobe's own process runs in the workspace, not in the node):\n\n")
		p("| path | up s/GiB median | down s/GiB median |\n|---|---|---|\n")
		for _, r := range b.paths {
			if len(r.NodeUp)+len(r.NodeDown) == 0 {
				continue
			}
			p("| %s | %s | %s |\n", r.Name, num(median(r.NodeUp), 2), num(median(r.NodeDown), 2))
		}
		p("\nEvery run, Gbit/s:\n\n")
		for _, r := range b.paths {
			p("- %s: up %s; down %s\n", r.Name, nums(r.Up), nums(r.Down))
			for _, e := range r.Errors {
				p("  - error: %s\n", e)
			}
		}
	}
	if r := b.idle; r != nil {
		p("\n## 2. Idle connections\n\n")
		p("`netprobe idle` in the workspace opens %d connections to a nettest Hold server (100 connects in flight at a time) and holds them; the node's VmRSS and RssAnon (/proc/PID/status of kibotos-node, which runs every workspace's stack) are read %s after the node is idle, %s after the last connect, and %s after they closed (the Go runtime keeps freed memory for reuse for a while: *after* is not a leak measure; the e2e test TestNetworkLeaks is).\n\n", r.Want, b.cfg.settle, b.cfg.settle, b.cfg.settle)
		p("| opened | failed | open at the server | node VmRSS before | with them | after | per connection | RssAnon per connection | node threads before → with |\n|---|---|---|---|---|---|---|---|---|\n")
		p("| %d | %d | %d | %s | %s | %s | %s KiB | %s KiB | %d → %d |\n", r.Opened, r.Failed, r.ServerOpen, mib(r.RSSBefore), mib(r.RSSWith), mib(r.RSSAfter),
			num(float64(r.RSSWith-r.RSSBefore)/float64(max(r.Opened, 1))/1024, 1), num(float64(r.AnonWith-r.AnonBefore)/float64(max(r.Opened, 1))/1024, 1), r.ThreadsBefore, r.ThreadsWith)
		if r.FirstErr != "" {
			p("\nFirst failure: %s\n", r.FirstErr)
		}
		if r.Err != "" {
			p("\nError: %s\n", r.Err)
		}
	}
	if r := b.follow; r != nil {
		p("\n## 3. Policy update → new flows follow it\n\n")
		p("`netprobe watch` in the workspace connects to a server port every millisecond (100 ms timeout) and prints the wall-clock time of each change of outcome (ok ↔ refused); the workspace shares the host's clock. The benchmark alternates %d `UpdateWorkspaceNetworkPolicy` calls (drain_seconds 0) that deny that destination and admit it again, 150-250 ms apart. Per call: the call sent → the start of the first connect attempt with the new outcome (the attempt that saw it started at most about 1 ms + one connect after the change took effect).\n\n", r.Toggles)
		lag, call := newDist(r.Lag), newDist(r.Call)
		p("| | n | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|---|\n")
		p("| sent → new flows follow | %d | %s | %s | %s | %s |\n", len(lag), num(lag.p(50), 1), num(lag.p(90), 1), num(lag.p(99), 1), num(lag.p(100), 1))
		p("| the call's round trip (it returns once the node applied the policy) | %d | %s | %s | %s | %s |\n", len(call), num(call.p(50), 1), num(call.p(90), 1), num(call.p(99), 1), num(call.p(100), 1))
		p("\nChanges the watcher printed: %d; updates whose change it did not see: %d.\n", r.WatchOut, r.Missed)
		if r.Err != "" {
			p("\nError: %s\n", r.Err)
		}
	}
	if len(b.notes) > 0 {
		p("\n## Notes\n\n")
		for _, n := range b.notes {
			p("- %s\n", n)
		}
	}
	return sb.String()
}

func nums(xs []float64) string {
	if len(xs) == 0 {
		return "—"
	}
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = num(x, 2)
	}
	return strings.Join(s, ", ")
}

func mib(b int64) string { return num(float64(b)/(1<<20), 1) + " MiB" }
