// Command hollow is a hollow-node harness (as Kubernetes' kubemark): many
// node agents in one process, each the real agent (internal/node/agent)
// speaking the real node protocol over its own mutual-TLS HTTP/2
// connection to a real kibotos-ctrl, with the runtime double of
// internal/node/agent/agenttest, which records executions instead of
// running sandboxes. It is a benchmark tool only: no runtime the product
// ships.
//
// It starts -replicas `kibotos-ctrl --dev --dev-no-node` processes on one
// store (SQLite with one replica, or a fresh database on the -postgres
// server), issues each node a certificate from the dev CA (the path the
// test harnesses take; enrollment tokens are measured elsewhere), gives
// every node all replicas' URLs (internal/node/ctrlset: they spread over
// them) and measures: the time for -nodes nodes to connect; ctrl's CPU and
// RSS idle with them (per node); -workspaces creates at -rate per second,
// spread over the replicas, latency from CreateWorkspace's answer to the
// command COMPLETED and where that time goes; ctrl's CPU and RSS per
// workspace, idle over -hold with them; the time for the nodes of one
// replica to reconnect after it restarts (SIGTERM, start again on the same
// address: with several replicas they move to the others); then stops and
// deletes of -measure workspaces at -rate, latency of each call. With
// -reference and several replicas, the same workload runs first against
// one replica, and the report gives the ratios. The markdown report goes
// to stdout (and -out).
//
//	go run ./bench/hollow -nodes 1000 -workspaces 10000 -rate 50
//	go run ./bench/hollow -nodes 1000 -workspaces 10000 -rate 100 -replicas 2 -reference -postgres postgres://postgres@127.0.0.1:5432/test
package main

import (
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	kbuild "github.com/kibotos/kibotos/internal/buildinfo"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/node/ctrlset"
	"github.com/kibotos/kibotos/internal/pki"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hollow:", err)
		os.Exit(1)
	}
}

type options struct {
	nodes, workspaces, measure, replicas int
	inflight                             int
	rate                                 float64
	duration, hold                       time.Duration
	postgres, out                        string
	reference, keep                      bool
	logLevel, prof                       string
}

func run() error {
	var o options
	flag.IntVar(&o.nodes, "nodes", 100, "hollow nodes")
	flag.IntVar(&o.workspaces, "workspaces", 1000, "workspaces created")
	flag.IntVar(&o.measure, "measure", 0, "workspaces stopped and then deleted at -rate, the last ones created (0: all)")
	flag.Float64Var(&o.rate, "rate", 50, "commands per second of each phase (create, stop, delete)")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "idle window over which ctrl's CPU is measured with the nodes connected")
	flag.DurationVar(&o.hold, "hold", 0, "idle window after the creates, with every workspace AVAILABLE")
	flag.IntVar(&o.inflight, "inflight", 0, "at most this many commands in flight: the pacer waits (its lag shows it) instead of piling up more (0: no bound, a pure open loop)")
	flag.IntVar(&o.replicas, "replicas", 1, "kibotos-ctrl replicas on one store (more than one needs -postgres)")
	flag.BoolVar(&o.reference, "reference", false, "with -replicas > 1: run the same workload against one replica first, and report the ratios")
	flag.StringVar(&o.postgres, "postgres", "", "PostgreSQL server URL: each configuration gets a fresh database kibotos_hollow_<random> there, dropped at the end (default: SQLite)")
	flag.StringVar(&o.out, "out", "", "also write the report to this file")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory")
	flag.StringVar(&o.logLevel, "log-level", "warn", "ctrl's --log-level (logs are ctrl-<i>.log in the temporary directory, see -keep)")
	flag.StringVar(&o.prof, "ctrl-cpuprofile", "", "write a CPU profile of the first configuration's replicas: the first replica's first process to this file, its restarted process to this file plus .restart, replica i's to this file plus .i (builds bench/ctrlprof)")
	flag.Parse()
	if o.replicas < 1 || (o.replicas > 1 && o.postgres == "") {
		return errors.New("-replicas: more than one replica needs -postgres")
	}
	if o.measure <= 0 || o.measure > o.workspaces {
		o.measure = o.workspaces
	}

	tmp, err := os.MkdirTemp("", "hollow-")
	if err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(tmp)
	} else {
		logf("keeping %s", tmp)
	}
	ctx := context.Background()
	bin := filepath.Join(tmp, "kibotos-ctrl")
	logf("building kibotos-ctrl")
	pkg := "./cmd/kibotos-ctrl"
	if o.prof != "" {
		pkg = "./bench/ctrlprof"
	}
	if out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, pkg).CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	built := builtFrom(bin)
	logf("kibotos-ctrl: %s", built)
	var env []string
	if o.prof != "" {
		abs, err := filepath.Abs(o.prof)
		if err != nil {
			return err
		}
		env = []string{"CTRLBENCH_CPUPROFILE=" + abs}
	}
	configs := []int{o.replicas}
	if o.reference && o.replicas > 1 {
		configs = []int{1, o.replicas}
	}
	var reports []*report
	for i, k := range configs {
		dir := filepath.Join(tmp, fmt.Sprintf("r%d-%d", k, i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		r, err := runConfig(ctx, o, k, bin, dir, env)
		env = nil
		if err != nil {
			return fmt.Errorf("%d replica(s): %w", k, err)
		}
		r.built = built
		reports = append(reports, r)
		fmt.Fprint(os.Stderr, r.markdown())
	}
	var b strings.Builder
	for _, r := range reports {
		b.WriteString(r.markdown())
		b.WriteString("\n")
	}
	if len(reports) == 2 {
		b.WriteString(ratios(reports[0], reports[1]))
	}
	text := b.String()
	fmt.Print(text)
	if o.out != "" {
		return os.WriteFile(o.out, []byte(text), 0o644)
	}
	return nil
}

// runConfig runs the whole workload against k replicas on a fresh store.
func runConfig(ctx context.Context, o options, k int, bin, dir string, env []string) (*report, error) {
	r := &report{opts: o, replicas: k, store: "SQLite"}
	var db *pgDB
	storeURL := ""
	if o.postgres != "" {
		var err error
		if db, err = createPG(ctx, o.postgres); err != nil {
			return nil, err
		}
		defer func() {
			if err := db.drop(); err != nil {
				logf("drop database %s: %v", db.name, err)
			}
		}()
		storeURL, r.store = db.url, "PostgreSQL"
	}
	logf("%d replica(s) on %s", k, r.store)
	cl, err := startCluster(ctx, bin, dir, storeURL, o.logLevel, k, env)
	if err != nil {
		return nil, err
	}
	defer cl.stop()
	r.base = cl.sample()
	r.load = append(r.load, "start "+benchkit.LoadAvg())
	p := cl.procs[0].PKI

	// Nodes.
	rec := &recorder{opened: make([]atomic.Int64, o.nodes), on: make([]atomic.Int32, o.nodes), urls: cl.urls}
	var starts sync.Map  // workspace ID → time.Time of its first Start on a node
	var stops sync.Map   // workspace ID → time.Time of its first Stop on a node
	var deletes sync.Map // workspace ID → time.Time of its first Delete on a node
	certDir := filepath.Join(dir, "nodes")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	logf("issuing %d node certificates", o.nodes)
	ids := make([]string, o.nodes)
	for i := range ids {
		ids[i] = fmt.Sprintf("hollow-%05d", i)
		cert, key := filepath.Join(certDir, ids[i]+".pem"), filepath.Join(certDir, ids[i]+"-key.pem")
		if err := pki.IssueClient(p.CA, p.CAKey, ids[i], pki.RoleNode, 24*time.Hour, cert, key); err != nil {
			return nil, err
		}
	}
	urls, err := ctrlset.Parse(cl.urls)
	if err != nil {
		return nil, err
	}
	nctx, stopNodes := context.WithCancel(ctx)
	var nodesDone sync.WaitGroup
	defer func() { stopNodes(); nodesDone.Wait() }()
	logf("starting %d hollow nodes", o.nodes)
	t0 := time.Now()
	for i, id := range ids {
		tlsc, err := pki.ClientConfig(p.CA, filepath.Join(certDir, id+".pem"), filepath.Join(certDir, id+"-key.pem"))
		if err != nil {
			return nil, err
		}
		set, err := ctrlset.New(ctrlset.Config{URLs: urls, TLS: tlsc})
		if err != nil {
			return nil, err
		}
		a := agent.New(agent.Config{
			NodeID: id, Ctrl: set, Runtime: timedRuntime{agenttest.New(), &starts, &stops, &deletes},
			Capacity: &nodev1.Capacity{MemoryMib: 1 << 20, CpuMillis: 1 << 20, StorageBytes: 1 << 50, StoragePool: "default"},
			Log:      slog.New(&nodeLog{i: i, rec: rec}),
			Templates: func() []*nodev1.TemplateInfo {
				return []*nodev1.TemplateInfo{{TemplateId: "default", Version: "hollow-1"}}
			},
		})
		nodesDone.Add(1)
		go func() { defer nodesDone.Done(); _ = a.Run(nctx) }()
	}
	if r.connect, err = rec.waitAll(t0, nil, 5*time.Minute); err != nil {
		return nil, err
	}
	r.spread = rec.spread()
	logf("%d nodes connected in %v (per replica %v)", o.nodes, r.connect, r.spread)
	hc, _, err := benchkit.NewHTTPClient(p)
	if err != nil {
		return nil, err
	}
	c := &client{run: strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	for _, u := range cl.urls {
		c.ws = append(c.ws, ctrlv1connect.NewWorkspaceServiceClient(hc, u))
		c.nodes = append(c.nodes, ctrlv1connect.NewNodeServiceClient(hc, u))
	}
	if r.listed, err = c.waitConnected(ctx, o.nodes, t0, time.Minute); err != nil {
		return nil, err
	}
	logf("idle %v with the nodes connected", o.duration)
	r.pgI = db.stats(ctx)
	r.idle0 = cl.sample()
	time.Sleep(o.duration)
	r.idle1 = cl.sample()
	r.load = append(r.load, "idle "+benchkit.LoadAvg())
	r.pg0 = db.stats(ctx)

	// Creates.
	logf("creating %d workspaces at %.0f/s", o.workspaces, o.rate)
	ws := make([]wsState, o.workspaces)
	r.create = paced(o.workspaces, o.rate, o.inflight, func(i int) (time.Duration, error) { return c.create(ctx, i, &ws[i]) })
	r.created = cl.sample()
	r.load = append(r.load, "creates "+benchkit.LoadAvg())
	r.split = splitCreates(ws, &starts)
	r.pg1 = db.stats(ctx)
	if db == nil {
		r.sqliteBytes = sqliteSize(cl.opts[0].DataDir)
	}
	starts.Clear()
	logf("creates: %s", r.create.summary())
	logf("creates split p50/p99 ms: accepted→Start %.1f/%.1f, Start→completed_at %.1f/%.1f, completed_at→seen %.1f/%.1f",
		benchkit.MS(pctOf(r.split.toStart, .5)), benchkit.MS(pctOf(r.split.toStart, .99)),
		benchkit.MS(pctOf(r.split.startToDone, .5)), benchkit.MS(pctOf(r.split.startToDone, .99)),
		benchkit.MS(pctOf(r.split.doneToSeen, .5)), benchkit.MS(pctOf(r.split.doneToSeen, .99)))
	if o.keep {
		if err := writeTimeline(filepath.Join(dir, "creates.csv"), ws, r.split.starts); err != nil {
			return nil, err
		}
	}
	if o.hold > 0 {
		logf("holding %d workspaces for %v", o.workspaces, o.hold)
		r.held0 = cl.sample()
		time.Sleep(o.hold)
		r.held1 = cl.sample()
		r.load = append(r.load, "hold "+benchkit.LoadAvg())
	}

	// Restart of replica 0.
	logf("restarting replica 0 (SIGTERM)")
	victims := rec.onReplica(0)
	r.victims = len(victims)
	kill := time.Now()
	var exitErr error
	r.exited, r.ready, exitErr, err = cl.restart(ctx, 0, kill)
	if err != nil {
		return nil, err
	}
	if exitErr != nil {
		logf("replica 0 exit: %v", exitErr)
		r.exitErr = exitErr
		r.exitLog = lastError(cl.opts[0].LogPath)
	}
	// A restart that does not complete is a figure, not the end of the run.
	if r.reconnect, err = rec.waitAll(kill, victims, 3*time.Minute); err != nil {
		r.restartErr = append(r.restartErr, err.Error())
	}
	r.moved = rec.spreadOf(victims)
	if r.resync, err = c.waitConnected(ctx, o.nodes, kill, 2*time.Minute); err != nil {
		r.restartErr = append(r.restartErr, err.Error())
	}
	created := 0
	for i := range ws {
		if ws[i].ok {
			created++
		}
	}
	if r.available, err = c.waitAvailable(ctx, created, kill, 2*time.Minute); err != nil {
		r.restartErr = append(r.restartErr, err.Error())
	}
	r.spreadAfter = rec.spread()
	r.load = append(r.load, "restart "+benchkit.LoadAvg())
	logf("restart: exited %v, ready %v, its %d nodes' streams %v (now on %v), listed %v, workspaces AVAILABLE %v",
		r.exited, r.ready, r.victims, r.reconnect, r.moved, r.resync, r.available)
	r.restarted = cl.sample()

	sub := ws[o.workspaces-o.measure:]
	logf("stopping %d at %.0f/s", len(sub), o.rate)
	r.stop = paced(len(sub), o.rate, o.inflight, func(i int) (time.Duration, error) { return c.stop(ctx, i, &sub[i]) })
	stopAt := func(w *wsState) callMoments { return w.stopAt }
	r.stopSplit = splitCalls(sub, &stops, stopAt)
	logf("stops: %s", r.stop.summary())
	logf("stops split p50/p99 ms: %s", r.stopSplit.summary("Stop"))
	if o.keep {
		if err := writeCallTimeline(filepath.Join(dir, "stops.csv"), "stop", sub, r.stopSplit, kill, stopAt); err != nil {
			return nil, err
		}
	}
	logf("deleting %d at %.0f/s", len(sub), o.rate)
	r.del = paced(len(sub), o.rate, o.inflight, func(i int) (time.Duration, error) { return c.remove(ctx, i, &sub[i]) })
	deleteAt := func(w *wsState) callMoments { return w.deleteAt }
	r.deleteSplit = splitCalls(sub, &deletes, deleteAt)
	logf("deletes: %s", r.del.summary())
	logf("deletes split p50/p99 ms: %s", r.deleteSplit.summary("Delete"))
	if o.keep {
		if err := writeCallTimeline(filepath.Join(dir, "deletes.csv"), "delete", sub, r.deleteSplit, kill, deleteAt); err != nil {
			return nil, err
		}
	}
	r.end = cl.sample()
	r.load = append(r.load, "end "+benchkit.LoadAvg())
	r.pg2 = db.stats(ctx)
	return r, nil
}

// lastError returns the msg and error of the last ERROR line of ctrl's log.
func lastError(path string) string {
	var out string
	for _, line := range strings.Split(benchkit.Tail(path, 4000), "\n") {
		var rec struct{ Level, Msg, Error string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Level == "ERROR" {
			out = rec.Msg + ": " + rec.Error
		}
	}
	return out
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().UTC().Format("15:04:05 ")+format+"\n", args...)
}

// recorder records when each node's stream last opened, and to which
// replica.
type recorder struct {
	opened []atomic.Int64 // unix nanoseconds of the last "ctrl stream open"
	on     []atomic.Int32 // index in urls of that stream's replica
	urls   []string
}

// onReplica lists the nodes whose stream is on replica i.
func (r *recorder) onReplica(i int) []int {
	var out []int
	for n := range r.on {
		if int(r.on[n].Load()) == i {
			out = append(out, n)
		}
	}
	return out
}

// spread counts the nodes per replica.
func (r *recorder) spread() []int {
	all := make([]int, len(r.on))
	for i := range all {
		all[i] = i
	}
	return r.spreadOf(all)
}

func (r *recorder) spreadOf(nodes []int) []int {
	out := make([]int, len(r.urls))
	for _, n := range nodes {
		if i := int(r.on[n].Load()); i >= 0 && i < len(out) {
			out[i]++
		}
	}
	return out
}

// waitAll waits until the stream of every node of nodes (nil: all) opened
// after since; it returns the time from since to the last opening.
func (r *recorder) waitAll(since time.Time, nodes []int, bound time.Duration) (time.Duration, error) {
	if nodes == nil {
		nodes = make([]int, len(r.opened))
		for i := range nodes {
			nodes[i] = i
		}
	}
	deadline := time.Now().Add(bound)
	for {
		var last int64
		open := 0
		for _, i := range nodes {
			if t := r.opened[i].Load(); t >= since.UnixNano() {
				open++
				last = max(last, t)
			}
		}
		if open == len(nodes) {
			if len(nodes) == 0 {
				return 0, nil
			}
			return time.Unix(0, last).Sub(since), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d of %d nodes connected after %v", open, len(nodes), bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nodeLog is one node's agent log: it records "ctrl stream open" and
// drops everything else.
type nodeLog struct {
	i   int
	rec *recorder
}

func (l *nodeLog) Enabled(_ context.Context, lv slog.Level) bool { return lv == slog.LevelInfo }
func (l *nodeLog) WithAttrs([]slog.Attr) slog.Handler            { return l }
func (l *nodeLog) WithGroup(string) slog.Handler                 { return l }
func (l *nodeLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "ctrl stream open" {
		on := int32(-1)
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "url" {
				on = int32(slices.Index(l.rec.urls, strings.TrimSuffix(a.Value.String(), "/")))
				return false
			}
			return true
		})
		l.rec.on[l.i].Store(on)
		l.rec.opened[l.i].Store(time.Now().UnixNano())
	}
	return nil
}

// usage is ctrl's CPU time and resident memory (every replica's) at one
// moment, and the harness's own.
type usage struct {
	at           time.Time
	cpu, self    time.Duration
	rss, selfRSS int64 // bytes
}

func sample(pid int) usage {
	return usage{at: time.Now(), cpu: benchkit.SampleCPU(pid).Server, rss: rssOf(pid)}
}

func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

type wsState struct {
	id  string
	rev uint64
	ok  bool
	// The create's moments: its answer (client), its command's created_at
	// and completed_at (ctrl's clock, the same host's), seen COMPLETED
	// (client).
	answered, createdAt, completedAt, seen time.Time
	// The stop's and the delete's calls and answers (client).
	stopAt, deleteAt callMoments
}

// callMoments are when the client called a command and when the call
// answered.
type callMoments struct{ called, answered time.Time }

// timedRuntime records when each workspace first reaches its node's
// runtime (Start), and when its first Stop and Delete do.
type timedRuntime struct {
	*agenttest.Runtime
	starts, stops, deletes *sync.Map
}

func (t timedRuntime) Start(ctx context.Context, s agent.Spec) error {
	t.starts.LoadOrStore(s.WorkspaceID, time.Now())
	return t.Runtime.Start(ctx, s)
}

func (t timedRuntime) Stop(ctx context.Context, id string, force bool) error {
	t.stops.LoadOrStore(id, time.Now())
	return t.Runtime.Stop(ctx, id, force)
}

func (t timedRuntime) Delete(ctx context.Context, id string) error {
	t.deletes.LoadOrStore(id, time.Now())
	return t.Runtime.Delete(ctx, id)
}

// split is where a create's time goes, each a sorted list of durations.
type split struct {
	toStart, startToDone, doneToSeen, acceptToDone []time.Duration
	starts                                         []time.Time // by workspace index (zero: not seen)
}

func splitCreates(ws []wsState, starts *sync.Map) split {
	sp := split{starts: make([]time.Time, len(ws))}
	for i, w := range ws {
		if w.ok {
			sp.acceptToDone = append(sp.acceptToDone, w.completedAt.Sub(w.createdAt))
		}
		v, ok := starts.Load(w.id)
		if !ok || !w.ok {
			continue
		}
		st := v.(time.Time)
		sp.starts[i] = st
		sp.toStart = append(sp.toStart, st.Sub(w.createdAt))
		sp.startToDone = append(sp.startToDone, w.completedAt.Sub(st))
		sp.doneToSeen = append(sp.doneToSeen, w.seen.Sub(w.completedAt))
	}
	for _, l := range [][]time.Duration{sp.toStart, sp.startToDone, sp.doneToSeen, sp.acceptToDone} {
		slices.Sort(l)
	}
	return sp
}

// callSplit is where a call's time goes (a stop's, a delete's), each a
// sorted list of durations: the call to the runtime's method on the node,
// and from there to the call's answer.
type callSplit struct {
	toNode, nodeToAnswer []time.Duration
	atNode               []time.Time // by workspace index (zero: not seen)
}

// splitCalls splits the calls at(w) of ws by when they reached the node
// (atNode: workspace ID → time.Time).
func splitCalls(ws []wsState, atNode *sync.Map, at func(*wsState) callMoments) callSplit {
	sp := callSplit{atNode: make([]time.Time, len(ws))}
	for i := range ws {
		m := at(&ws[i])
		v, ok := atNode.Load(ws[i].id)
		if !ok || m.answered.IsZero() {
			continue
		}
		t := v.(time.Time)
		sp.atNode[i] = t
		sp.toNode = append(sp.toNode, t.Sub(m.called))
		sp.nodeToAnswer = append(sp.nodeToAnswer, m.answered.Sub(t))
	}
	slices.Sort(sp.toNode)
	slices.Sort(sp.nodeToAnswer)
	return sp
}

// summary is the split's p50/p99 for the log, method naming the runtime's.
func (sp callSplit) summary(method string) string {
	return fmt.Sprintf("called→%s %.1f/%.1f, %s→answered %.1f/%.1f", method,
		benchkit.MS(pctOf(sp.toNode, .5)), benchkit.MS(pctOf(sp.toNode, .99)), method,
		benchkit.MS(pctOf(sp.nodeToAnswer, .5)), benchkit.MS(pctOf(sp.nodeToAnswer, .99)))
}

// writeCallTimeline writes each call's moments, in ms from t0 (the
// restart's SIGTERM): called, on the node, answered.
func writeCallTimeline(path, what string, ws []wsState, sp callSplit, t0 time.Time, at func(*wsState) callMoments) error {
	var b strings.Builder
	fmt.Fprintf(&b, "i,called_ms,%s_ms,answered_ms\n", what)
	ms := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return benchkit.MS(t.Sub(t0))
	}
	for i := range ws {
		m := at(&ws[i])
		fmt.Fprintf(&b, "%d,%.1f,%.1f,%.1f\n", i, ms(m.called), ms(sp.atNode[i]), ms(m.answered))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// writeTimeline writes each create's moments, in ms from the first
// create's answer: answered, Start on the node, completed_at, seen.
func writeTimeline(path string, ws []wsState, starts []time.Time) error {
	var b strings.Builder
	b.WriteString("i,answered_ms,start_ms,completed_ms,seen_ms\n")
	t0 := ws[0].answered
	ms := func(t time.Time) float64 { return benchkit.MS(t.Sub(t0)) }
	for i, w := range ws {
		fmt.Fprintf(&b, "%d,%.1f,%.1f,%.1f,%.1f\n", i, ms(w.answered), ms(starts[i]), ms(w.completedAt), ms(w.seen))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func pctOf(l []time.Duration, q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	return l[min(len(l)-1, int(q*float64(len(l))))]
}

// client spreads commands over the replicas: command i goes to replica
// i mod k, and its wait too.
type client struct {
	ws    []ctrlv1connect.WorkspaceServiceClient
	nodes []ctrlv1connect.NodeServiceClient
	run   string
	seq   atomic.Int64
}

func (c *client) cmdID(kind string) string {
	return fmt.Sprintf("hollow-%s-%s-%d", c.run, kind, c.seq.Add(1))
}

// create returns the time from CreateWorkspace's answer to the command
// observed COMPLETED (GetWorkspaceCommand waiting on the server).
func (c *client) create(ctx context.Context, i int, w *wsState) (time.Duration, error) {
	ws := c.ws[i%len(c.ws)]
	cmd := c.cmdID("create")
	resp, err := retry(func() (*connect.Response[ctrlv1.CreateWorkspaceResponse], error) {
		return ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
			Metadata:  &ctrlv1.CommandMetadata{CommandId: cmd},
			Resources: &ctrlv1.Resources{MemoryMib: 16, CpuMillis: 10}, WritableLayerCapacityBytes: 64 << 20,
		}))
	})
	if err != nil {
		return 0, fmt.Errorf("CreateWorkspace: %w", err)
	}
	accepted := time.Now()
	w.answered = accepted
	w.createdAt = resp.Msg.GetCommand().GetCreatedAt().AsTime()
	w.id = resp.Msg.GetWorkspace().GetWorkspaceId()
	w.rev = resp.Msg.GetWorkspace().GetExpiration().GetRevision()
	deadline := accepted.Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		g, err := ws.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: cmd, WaitTimeout: durationpb.New(30 * time.Second)}))
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if g.Msg.GetCommand().GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
			d := time.Since(accepted)
			w.seen = time.Now()
			w.completedAt = g.Msg.GetCommand().GetCompletedAt().AsTime()
			if e := g.Msg.GetCommand().GetError(); e != nil {
				return d, fmt.Errorf("create failed: %v", e)
			}
			w.ok = true
			return d, nil
		}
	}
	return 0, fmt.Errorf("create %s not COMPLETED after 2m", cmd)
}

// retry resends a command (the same ID: a replay) while ctrl answers
// unavailable.
func retry[T any](call func() (T, error)) (T, error) {
	for i := 0; ; i++ {
		v, err := call()
		if err == nil || i >= 20 || connect.CodeOf(err) != connect.CodeUnavailable {
			return v, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *client) stop(ctx context.Context, i int, w *wsState) (time.Duration, error) {
	if !w.ok {
		return 0, fmt.Errorf("not created")
	}
	ws := c.ws[i%len(c.ws)]
	cmd := c.cmdID("stop")
	t0 := time.Now()
	w.stopAt.called = t0
	resp, err := retry(func() (*connect.Response[ctrlv1.StopWorkspaceResponse], error) {
		return ws.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: cmd}, WorkspaceId: w.id, ExpectedExpirationRevision: w.rev}))
	})
	d := time.Since(t0)
	w.stopAt.answered = t0.Add(d)
	if err != nil {
		w.ok = false
		return d, fmt.Errorf("StopWorkspace: %w", err)
	}
	if st := resp.Msg.GetWorkspace().GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		return d, fmt.Errorf("StopWorkspace: %s, want STOPPED", st)
	}
	w.rev = resp.Msg.GetWorkspace().GetExpiration().GetRevision()
	return d, nil
}

func (c *client) remove(ctx context.Context, i int, w *wsState) (time.Duration, error) {
	if !w.ok {
		return 0, fmt.Errorf("not stopped")
	}
	ws := c.ws[i%len(c.ws)]
	cmd := c.cmdID("delete")
	t0 := time.Now()
	w.deleteAt.called = t0
	resp, err := retry(func() (*connect.Response[ctrlv1.DeleteWorkspaceResponse], error) {
		return ws.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: cmd}, WorkspaceId: w.id, ExpectedExpirationRevision: w.rev}))
	})
	d := time.Since(t0)
	w.deleteAt.answered = t0.Add(d)
	if err != nil {
		return d, fmt.Errorf("DeleteWorkspace: %w", err)
	}
	if st := resp.Msg.GetWorkspace().GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		return d, fmt.Errorf("DeleteWorkspace: %s, want DELETED", st)
	}
	return d, nil
}

// waitConnected waits until the replicas' ListNodes together report n
// nodes connected (a replica reports connected only the nodes whose stream
// it holds; one that does not answer is skipped); it returns the time from
// since.
func (c *client) waitConnected(ctx context.Context, n int, since time.Time, bound time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(bound)
	last := 0
	for time.Now().Before(deadline) {
		connected := map[string]bool{}
		for _, nodes := range c.nodes {
			token := ""
			for {
				resp, err := nodes.ListNodes(ctx, connect.NewRequest(&ctrlv1.ListNodesRequest{PageSize: 1000, PageToken: token}))
				if err != nil {
					break
				}
				for _, nd := range resp.Msg.GetNodes() {
					if nd.GetConnected() {
						connected[nd.GetNodeId()] = true
					}
				}
				if token = resp.Msg.GetNextPageToken(); token == "" {
					break
				}
			}
		}
		if len(connected) >= n {
			return time.Since(since), nil
		}
		last = len(connected)
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("ListNodes: %d of %d connected after %v", last, n, bound)
}

// waitAvailable waits until n workspaces are listed AVAILABLE and returns
// the time from since.
func (c *client) waitAvailable(ctx context.Context, n int, since time.Time, bound time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(bound)
	last := 0
	pause := 200 * time.Millisecond
	if n > 10000 {
		pause = time.Second
	}
	for k := 0; time.Now().Before(deadline); k++ {
		ws := c.ws[k%len(c.ws)]
		avail, token := 0, ""
		for {
			resp, err := ws.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{PageSize: 1000, PageToken: token,
				States: []ctrlv1.WorkspaceState{ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE}}))
			if err != nil {
				avail = -1
				break
			}
			avail += len(resp.Msg.GetWorkspaces())
			if token = resp.Msg.GetNextPageToken(); token == "" {
				break
			}
		}
		if avail >= n {
			return time.Since(since), nil
		}
		last = avail
		time.Sleep(pause)
	}
	return 0, fmt.Errorf("%d of %d workspaces AVAILABLE after %v", last, n, bound)
}

// phase is one paced phase's latencies and errors.
type phase struct {
	lats   []time.Duration
	errs   int
	first  error
	wall   time.Duration
	maxLag time.Duration // how far the pacer fell behind its schedule
}

// paced calls f(i) for i in [0, n), one start every 1/rate seconds, each
// in its own goroutine (an open loop: a slow answer does not slow the
// arrivals), at most inflight at once when inflight > 0.
func paced(n int, rate float64, inflight int, f func(i int) (time.Duration, error)) phase {
	var (
		p   phase
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem chan struct{}
	)
	if inflight > 0 {
		sem = make(chan struct{}, inflight)
	}
	interval := time.Duration(float64(time.Second) / rate)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		due := t0.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		if sem != nil {
			sem <- struct{}{}
		}
		if d := -time.Until(due); d > p.maxLag {
			p.maxLag = d
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sem != nil {
				defer func() { <-sem }()
			}
			d, err := f(i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				p.errs++
				if p.first == nil {
					p.first = err
				}
				return
			}
			p.lats = append(p.lats, d)
		}()
	}
	wg.Wait()
	p.wall = time.Since(t0)
	sort.Slice(p.lats, func(i, j int) bool { return p.lats[i] < p.lats[j] })
	return p
}

func (p phase) pct(q float64) time.Duration { return pctOf(p.lats, q) }

func (p phase) summary() string {
	return fmt.Sprintf("%d ok, %d errors, p50 %.1f ms, p99 %.1f ms, max %.1f ms, %v", len(p.lats), p.errs,
		benchkit.MS(p.pct(0.5)), benchkit.MS(p.pct(0.99)), benchkit.MS(p.pct(1)), p.wall.Round(time.Millisecond))
}

// builtFrom says which source the kibotos-ctrl at bin was built from, by
// the version control stamp go build puts into it ("-dirty": with
// uncommitted changes; -buildvcs=auto, since GOFLAGS may turn it off):
// the harness builds ctrl from the working directory, so a report of a
// modified tree must say so.
func builtFrom(bin string) string {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "unknown source (" + err.Error() + ")"
	}
	return "commit " + kbuild.Of(info)
}
