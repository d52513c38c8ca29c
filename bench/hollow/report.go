package main

import (
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
)

// report is one configuration's figures.
type report struct {
	opts                                        options
	replicas                                    int
	store                                       string
	load                                        []string // load averages at the ends of the phases
	built                                       string   // the source ctrl was built from (builtFrom)
	base, idle0, idle1, created, held0, held1   usage
	restarted, end                              usage
	connect, listed                             time.Duration
	spread, moved, spreadAfter                  []int
	victims                                     int
	exited, ready, reconnect, resync, available time.Duration
	exitErr                                     error
	exitLog                                     string
	restartErr                                  []string
	create, stop, del                           phase
	split                                       split
	stopSplit, deleteSplit                      callSplit
	pgI, pg0, pg1, pg2                          pgStats
	sqliteBytes                                 int64
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func (r *report) title() string {
	return fmt.Sprintf("%d nodes, %d workspaces, %d replica(s), %s", r.opts.nodes, r.opts.workspaces, r.replicas, r.store)
}

func (r *report) markdown() string {
	o := r.opts
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("## Hollow nodes: %s\n\n", r.title())
	w("`go run ./bench/hollow -nodes %d -workspaces %d -measure %d -rate %g -duration %v -hold %v -replicas %d",
		o.nodes, o.workspaces, o.measure, o.rate, o.duration, o.hold, o.replicas)
	if o.inflight > 0 {
		w(" -inflight %d", o.inflight)
	}
	if o.reference {
		w(" -reference")
	}
	if o.postgres != "" {
		w(" -postgres URL")
	}
	w("`\n\nkibotos-ctrl built from %s. ", r.built)
	w("%s, %s CPUs (%s); GOMAXPROCS %d in the harness. The harness (all agents), ctrl and PostgreSQL share the machine with other work; load averages (1, 5, 15 min) at the end of each phase: %s.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), benchkit.NProc(), benchkit.CPUModel(), runtime.GOMAXPROCS(0), strings.Join(r.load, "; "))
	w("### Nodes\n\n| measure | value |\n|---|---|\n")
	w("| %d streams open (agent's \"ctrl stream open\", from the first agent started) | %v |\n", o.nodes, r.connect.Round(time.Millisecond))
	w("| nodes per replica | %v |\n", r.spread)
	w("| ListNodes reports all connected | %v |\n", r.listed.Round(time.Millisecond))
	idleCPU := r.idle1.cpu - r.idle0.cpu
	idleWall := r.idle1.at.Sub(r.idle0.at)
	w("| ctrl RSS before nodes / with nodes (all replicas) | %.1f / %.1f MiB |\n", mib(r.base.rss), mib(r.idle0.rss))
	w("| ctrl RSS per node | %.1f KiB |\n", float64(r.idle0.rss-r.base.rss)/1024/float64(o.nodes))
	w("| ctrl CPU idle with the nodes (heartbeats every 5 s) | %.3f cores (%.2f s over %v) |\n", idleCPU.Seconds()/idleWall.Seconds(), idleCPU.Seconds(), idleWall.Round(time.Second))
	w("| ctrl CPU per node idle | %.1f µs/s |\n", idleCPU.Seconds()/idleWall.Seconds()/float64(o.nodes)*1e6)
	if r.pgI.ok && r.pg0.ok {
		sec := idleWall.Seconds()
		w("| PostgreSQL idle with the nodes | %.1f commits/s, %.1f rows updated/s, %.1f KiB/s of WAL (server-wide); %d backends |\n",
			float64(r.pg0.commits-r.pgI.commits)/sec, float64(r.pg0.updated-r.pgI.updated)/sec, float64(r.pg0.walBytes-r.pgI.walBytes)/1024/sec, r.pg0.connections)
		w("| PostgreSQL settings | %s |\n", r.pg0.settings)
	}
	w("| harness (hollow nodes) RSS / CPU idle | %.1f MiB / %.3f cores |\n", mib(r.idle1.selfRSS), (r.idle1.self-r.idle0.self).Seconds()/idleWall.Seconds())
	w("\n### Commands (open loop, %g/s, spread over the replicas)\n\n| command | ok | errors | p50 ms | p99 ms | max ms | wall | pacer lag max |\n|---|---|---|---|---|---|---|---|\n", o.rate)
	for _, row := range []struct {
		name string
		p    phase
	}{{"create (answer → seen COMPLETED)", r.create}, {"stop (call)", r.stop}, {"delete (call)", r.del}} {
		w("| %s | %d | %d | %.1f | %.1f | %.1f | %v | %v |\n", row.name, len(row.p.lats), row.p.errs,
			benchkit.MS(row.p.pct(0.5)), benchkit.MS(row.p.pct(0.99)), benchkit.MS(row.p.pct(1)), row.p.wall.Round(time.Millisecond), row.p.maxLag.Round(time.Millisecond))
	}
	spans(w, "Where a create's time goes (the command's created_at and completed_at are ctrl's clock, the runtime's Start the hollow node's; one host)", []span{
		{"accepted (created_at) → Start on the node", r.split.toStart}, {"Start → completed_at", r.split.startToDone},
		{"completed_at → client sees COMPLETED", r.split.doneToSeen}, {"**created_at → completed_at** (acceptance to COMPLETED)", r.split.acceptToDone}})
	spans(w, "Where a stop's time goes (the runtime's Stop on the hollow node; the stops begin right after the restart)", []span{
		{"called → Stop on the node", r.stopSplit.toNode}, {"Stop on the node → answered", r.stopSplit.nodeToAnswer}})
	spans(w, "Where a delete's time goes (the runtime's Delete on the hollow node; the deletes follow the stops)", []span{
		{"called → Delete on the node", r.deleteSplit.toNode}, {"Delete on the node → answered", r.deleteSplit.nodeToAnswer}})
	for _, row := range []struct {
		name string
		p    phase
	}{{"create", r.create}, {"stop", r.stop}, {"delete", r.del}} {
		if row.p.first != nil {
			w("\nFirst %s error: `%v`\n", row.name, row.p.first)
		}
	}
	n := float64(max(1, o.workspaces))
	createCPU := r.created.cpu - r.idle1.cpu
	idleRate := idleCPU.Seconds() / idleWall.Seconds()
	w("\n### Per workspace\n\n| measure | value |\n|---|---|\n")
	w("| ctrl CPU per create (create phase's CPU / creates) | %.2f ms (%.2f ms net of the idle nodes' CPU) |\n", createCPU.Seconds()*1e3/n,
		(createCPU.Seconds()-idleRate*r.created.at.Sub(r.idle1.at).Seconds())*1e3/n)
	w("| harness CPU per create (client and hollow nodes) | %.2f ms |\n", (r.created.self-r.idle1.self).Seconds()*1e3/n)
	w("| ctrl RSS after creates | %.1f MiB (%.1f KiB per workspace over idle) |\n", mib(r.created.rss), float64(r.created.rss-r.idle1.rss)/1024/n)
	w("| harness RSS after creates | %.1f MiB (%.1f KiB per workspace over idle) |\n", mib(r.created.selfRSS), float64(r.created.selfRSS-r.idle1.selfRSS)/1024/n)
	if o.hold > 0 {
		hw := r.held1.at.Sub(r.held0.at).Seconds()
		hc := (r.held1.cpu - r.held0.cpu).Seconds() / hw
		w("| ctrl CPU idle with the workspaces (over %v) | %.3f cores; %.1f µs/s per workspace over the idle nodes' |\n", o.hold, hc, (hc-idleRate)/n*1e6)
		w("| ctrl RSS after the hold | %.1f MiB |\n", mib(r.held1.rss))
	}
	w("| ctrl RSS after the restart, %d AVAILABLE workspaces | %.1f MiB |\n", o.workspaces, mib(r.restarted.rss))
	sd := (r.end.cpu - r.restarted.cpu).Seconds()
	m := float64(max(1, o.measure))
	w("| ctrl CPU per stop + delete | %.2f ms (%.2f ms net of the idle nodes' CPU) |\n", sd*1e3/m,
		(sd-idleRate*r.end.at.Sub(r.restarted.at).Seconds())*1e3/m)
	if r.sqliteBytes > 0 {
		w("| SQLite files after creates | %.1f MiB (%.2f KiB per workspace) |\n", mib(r.sqliteBytes), float64(r.sqliteBytes)/1024/n)
	}
	if r.pg1.ok && r.pg0.ok {
		w("| PostgreSQL database after creates | %.1f MiB (%.2f KiB per workspace over before); largest: %s |\n", mib(r.pg1.size), float64(r.pg1.size-r.pg0.size)/1024/n, r.pg1.tables)
		w("| PostgreSQL rows after creates | %d workspaces, %d commands, %d nodes |\n", r.pg1.workspaces, r.pg1.commands, r.pg1.nodes)
		w("| PostgreSQL per create | %.2f commits, %.2f rows inserted, %.2f updated, %.1f KiB of WAL (server-wide) |\n",
			float64(r.pg1.commits-r.pg0.commits)/n, float64(r.pg1.inserted-r.pg0.inserted)/n, float64(r.pg1.updated-r.pg0.updated)/n, float64(r.pg1.walBytes-r.pg0.walBytes)/1024/n)
		w("| PostgreSQL backends of the replicas (after creates) | %d |\n", r.pg1.connections)
		if r.pg2.ok {
			w("| PostgreSQL per stop + delete | %.2f commits, %.2f rows updated, %.2f deleted, %.1f KiB of WAL (server-wide) |\n",
				float64(r.pg2.commits-r.pg1.commits)/m, float64(r.pg2.updated-r.pg1.updated)/m, float64(r.pg2.deleted-r.pg1.deleted)/m, float64(r.pg2.walBytes-r.pg1.walBytes)/1024/m)
		}
	}
	w("\n### Restart of replica 0 (SIGTERM, start again on the same address)\n\n| measure, from the SIGTERM | value |\n|---|---|\n")
	w("| nodes on replica 0 before | %d of %d |\n", r.victims, o.nodes)
	w("| old process exited | %v |\n", r.exited.Round(time.Millisecond))
	w("| new process answers GetServerInfo | %v |\n", r.ready.Round(time.Millisecond))
	w("| all %d of its nodes' streams open again | %v (on replicas %v) |\n", r.victims, r.reconnect.Round(time.Millisecond), r.moved)
	w("| ListNodes reports all %d connected | %v |\n", o.nodes, r.resync.Round(time.Millisecond))
	w("| all %d workspaces created listed AVAILABLE | %v |\n", len(r.create.lats), r.available.Round(time.Millisecond))
	w("| nodes per replica then | %v |\n", r.spreadAfter)
	for _, e := range r.restartErr {
		w("\nNot reached: `%s`\n", e)
	}
	if r.exitErr != nil {
		msg, _, _ := strings.Cut(r.exitErr.Error(), " (log:")
		w("\nThe old process's exit: `%s`", msg)
		if r.exitLog != "" {
			w("; its last error line: `%s`", r.exitLog)
		}
		w(".\n")
	}
	return b.String()
}

// ratios compares the replicas' configuration b with the single
// replica's a.
func ratios(a, b *report) string {
	var s strings.Builder
	fmt.Fprintf(&s, "## %d replicas against 1, same workload, same run\n\n| measure | 1 replica | %d replicas | ratio |\n|---|---|---|---|\n", b.replicas, b.replicas)
	row := func(name string, x, y time.Duration) {
		ratio := "—"
		if x > 0 {
			ratio = fmt.Sprintf("%.2f×", float64(y)/float64(x))
		}
		fmt.Fprintf(&s, "| %s | %.1f ms | %.1f ms | %s |\n", name, benchkit.MS(x), benchkit.MS(y), ratio)
	}
	row("create p99, acceptance (created_at) → COMPLETED (completed_at)", pctOf(a.split.acceptToDone, .99), pctOf(b.split.acceptToDone, .99))
	row("create p50, acceptance → COMPLETED", pctOf(a.split.acceptToDone, .5), pctOf(b.split.acceptToDone, .5))
	row("create p99, answer → seen COMPLETED", a.create.pct(.99), b.create.pct(.99))
	row("stop p99 (call)", a.stop.pct(.99), b.stop.pct(.99))
	row("delete p99 (call)", a.del.pct(.99), b.del.pct(.99))
	row("restart: the restarted replica's nodes all streaming again", a.reconnect, b.reconnect)
	s.WriteString("\nGoal (issue 15): p99 acceptance → COMPLETED with two replicas ≤ 1.25× one replica's at the same load.\n")
	return s.String()
}

// span is one row of a table of where a command's time goes: a sorted
// list of durations.
type span struct {
	name string
	l    []time.Duration
}

func spans(w func(string, ...any), title string, rows []span) {
	w("\n%s:\n\n| span | p50 ms | p99 ms | max ms |\n|---|---|---|---|\n", title)
	for _, row := range rows {
		w("| %s | %.1f | %.1f | %.1f |\n", row.name, benchkit.MS(pctOf(row.l, 0.5)), benchkit.MS(pctOf(row.l, 0.99)), benchkit.MS(pctOf(row.l, 1)))
	}
}
