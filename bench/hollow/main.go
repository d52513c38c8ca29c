// Command hollow is a hollow-node harness (as Kubernetes' kubemark): many
// node agents in one process, each the real agent (internal/node/agent)
// speaking the real node protocol over its own mutual-TLS HTTP/2
// connection to a real kibotos-ctrl, with the runtime double of
// internal/node/agent/agenttest, which records executions instead of
// running sandboxes. It is a benchmark tool only: no runtime the product
// ships.
//
// It starts `kibotos-ctrl --dev --dev-no-node` (SQLite, or -postgres URL),
// issues each node a certificate from the dev CA (the path the test
// harnesses take; enrollment tokens are measured elsewhere), and measures:
// the time for -nodes nodes to connect; ctrl's CPU and RSS idle with them
// (per node); -workspaces creates at -rate per second, latency from
// CreateWorkspace's answer to the command COMPLETED; ctrl's CPU and RSS per
// workspace; the time for every node to reconnect after a ctrl restart
// (SIGTERM, start again on the same data directory and address); then
// stops and deletes at -rate, latency of each call. The markdown report
// goes to stdout (and -out).
//
//	go run ./bench/hollow -nodes 1000 -workspaces 10000 -rate 50
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/pki"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hollow:", err)
		os.Exit(1)
	}
}

type options struct {
	nodes, workspaces int
	rate              float64
	duration          time.Duration
	postgres, out     string
	keep              bool
}

func run() error {
	var o options
	flag.IntVar(&o.nodes, "nodes", 100, "hollow nodes")
	flag.IntVar(&o.workspaces, "workspaces", 1000, "workspaces created (then stopped and deleted)")
	flag.Float64Var(&o.rate, "rate", 50, "commands per second of each phase (create, stop, delete)")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "idle window over which ctrl's CPU is measured with the nodes connected")
	flag.StringVar(&o.postgres, "postgres", "", "PostgreSQL URL of an empty database for ctrl's --store (default: SQLite)")
	flag.StringVar(&o.out, "out", "", "also write the report to this file")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory")
	flag.Parse()

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
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/kibotos-ctrl").CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	port, err := benchkit.FreePort()
	if err != nil {
		return err
	}
	dopts := benchkit.DevOptions{Bin: bin, DataDir: filepath.Join(tmp, "data"), LogPath: filepath.Join(tmp, "ctrl.log"),
		Args: []string{"--dev-no-node", "--log-level", "warn"}, OwnGroup: true, Listen: "127.0.0.1:" + strconv.Itoa(port)}
	if o.postgres != "" {
		dopts.Args = append(dopts.Args, "--store", o.postgres)
	}
	srv, err := benchkit.StartDev(ctx, dopts)
	if err != nil {
		return err
	}
	defer func() { _ = srv.Stop() }()
	r := &report{opts: o, store: "SQLite"}
	if o.postgres != "" {
		r.store = "PostgreSQL"
	}
	r.base = sample(srv.PID())

	// Nodes.
	rec := &recorder{opened: make([]atomic.Int64, o.nodes)}
	certDir := filepath.Join(tmp, "nodes")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	logf("issuing %d node certificates", o.nodes)
	ids := make([]string, o.nodes)
	for i := range ids {
		ids[i] = fmt.Sprintf("hollow-%05d", i)
		cert, key := filepath.Join(certDir, ids[i]+".pem"), filepath.Join(certDir, ids[i]+"-key.pem")
		if err := pki.IssueClient(srv.PKI.CA, srv.PKI.CAKey, ids[i], pki.RoleNode, 24*time.Hour, cert, key); err != nil {
			return err
		}
	}
	nctx, stopNodes := context.WithCancel(ctx)
	var nodesDone sync.WaitGroup
	defer func() { stopNodes(); nodesDone.Wait() }()
	logf("starting %d hollow nodes", o.nodes)
	t0 := time.Now()
	for i, id := range ids {
		tlsc, err := pki.ClientConfig(srv.PKI.CA, filepath.Join(certDir, id+".pem"), filepath.Join(certDir, id+"-key.pem"))
		if err != nil {
			return err
		}
		hc := &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}}
		a := agent.New(agent.Config{
			NodeID: id, Endpoint: srv.URL, HTTP: hc, Runtime: agenttest.New(),
			Capacity: &nodev1.Capacity{MemoryMib: 1 << 20, CpuMillis: 1 << 20, StorageBytes: 1 << 50, StoragePool: "default"},
			Log:      slog.New(&nodeLog{i: i, rec: rec}),
			Templates: func() []*nodev1.TemplateInfo {
				return []*nodev1.TemplateInfo{{TemplateId: "default", Version: "hollow-1"}}
			},
		})
		nodesDone.Add(1)
		go func() { defer nodesDone.Done(); _ = a.Run(nctx) }()
	}
	if r.connect, err = rec.waitAll(t0, 5*time.Minute); err != nil {
		return err
	}
	logf("%d nodes connected in %v", o.nodes, r.connect)
	hc, _, err := benchkit.NewHTTPClient(srv.PKI)
	if err != nil {
		return err
	}
	c := &client{ws: ctrlv1connect.NewWorkspaceServiceClient(hc, srv.URL), nodes: ctrlv1connect.NewNodeServiceClient(hc, srv.URL),
		run: strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	if r.listed, err = c.waitConnected(ctx, o.nodes, t0, time.Minute); err != nil {
		return err
	}
	logf("idle %v with the nodes connected", o.duration)
	r.idle0 = sample(srv.PID())
	time.Sleep(o.duration)
	r.idle1 = sample(srv.PID())

	// Creates.
	logf("creating %d workspaces at %.0f/s", o.workspaces, o.rate)
	ws := make([]wsState, o.workspaces)
	r.create = paced(o.workspaces, o.rate, func(i int) (time.Duration, error) { return c.create(ctx, &ws[i]) })
	r.created = sample(srv.PID())
	logf("creates: %s", r.create.summary())

	// Restart.
	logf("restarting ctrl (SIGTERM)")
	kill := time.Now()
	rec.reset()
	if err := srv.Stop(); err != nil {
		logf("ctrl exit: %v", err)
		r.exitErr = err
		r.exitLog = lastError(dopts.LogPath)
	}
	r.exited = time.Since(kill)
	srv, err = benchkit.StartDev(ctx, dopts)
	if err != nil {
		return err
	}
	r.ready = time.Since(kill)
	if r.reconnect, err = rec.waitAll(kill, 5*time.Minute); err != nil {
		return err
	}
	if r.resync, err = c.waitConnected(ctx, o.nodes, kill, 5*time.Minute); err != nil {
		return err
	}
	r.available, err = c.waitAvailable(ctx, o.workspaces, kill, 5*time.Minute)
	if err != nil {
		return err
	}
	logf("restart: ready %v, streams %v, listed %v, workspaces AVAILABLE %v", r.ready, r.reconnect, r.resync, r.available)
	r.restarted = sample(srv.PID())

	logf("stopping at %.0f/s", o.rate)
	r.stop = paced(o.workspaces, o.rate, func(i int) (time.Duration, error) { return c.stop(ctx, &ws[i]) })
	logf("stops: %s", r.stop.summary())
	logf("deleting at %.0f/s", o.rate)
	r.del = paced(o.workspaces, o.rate, func(i int) (time.Duration, error) { return c.remove(ctx, &ws[i]) })
	logf("deletes: %s", r.del.summary())
	r.end = sample(srv.PID())

	text := r.markdown()
	fmt.Print(text)
	if o.out != "" {
		return os.WriteFile(o.out, []byte(text), 0o644)
	}
	return nil
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

// recorder records when each node's stream last opened.
type recorder struct {
	opened []atomic.Int64 // unix nanoseconds of the last "ctrl stream open"
}

func (r *recorder) reset() {
	for i := range r.opened {
		r.opened[i].Store(0)
	}
}

// waitAll waits until every node's stream opened after since; it returns
// the time from since to the last opening.
func (r *recorder) waitAll(since time.Time, bound time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(bound)
	for {
		var last int64
		open := 0
		for i := range r.opened {
			if t := r.opened[i].Load(); t >= since.UnixNano() {
				open++
				last = max(last, t)
			}
		}
		if open == len(r.opened) {
			return time.Unix(0, last).Sub(since), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d of %d nodes connected after %v", open, len(r.opened), bound)
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
		l.rec.opened[l.i].Store(time.Now().UnixNano())
	}
	return nil
}

// usage is ctrl's CPU time and resident memory at one moment.
type usage struct {
	at  time.Time
	cpu time.Duration
	rss int64 // bytes
}

func sample(pid int) usage {
	u := usage{at: time.Now(), cpu: benchkit.SampleCPU(pid).Server}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				u.rss = kb << 10
			}
		}
	}
	return u
}

type wsState struct {
	id  string
	rev uint64
	ok  bool
}

type client struct {
	ws    ctrlv1connect.WorkspaceServiceClient
	nodes ctrlv1connect.NodeServiceClient
	run   string
	seq   atomic.Int64
}

func (c *client) cmdID(kind string) string {
	return fmt.Sprintf("hollow-%s-%s-%d", c.run, kind, c.seq.Add(1))
}

// create returns the time from CreateWorkspace's answer to the command
// observed COMPLETED (GetWorkspaceCommand waiting on the server).
func (c *client) create(ctx context.Context, w *wsState) (time.Duration, error) {
	cmd := c.cmdID("create")
	resp, err := c.ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata:  &ctrlv1.CommandMetadata{CommandId: cmd},
		Resources: &ctrlv1.Resources{MemoryMib: 16, CpuMillis: 10}, WritableLayerCapacityBytes: 64 << 20,
	}))
	if err != nil {
		return 0, fmt.Errorf("CreateWorkspace: %w", err)
	}
	accepted := time.Now()
	w.id = resp.Msg.GetWorkspace().GetWorkspaceId()
	w.rev = resp.Msg.GetWorkspace().GetExpiration().GetRevision()
	deadline := accepted.Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		g, err := c.ws.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: cmd, WaitTimeout: durationpb.New(30 * time.Second)}))
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if g.Msg.GetCommand().GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
			d := time.Since(accepted)
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

func (c *client) stop(ctx context.Context, w *wsState) (time.Duration, error) {
	if !w.ok {
		return 0, fmt.Errorf("not created")
	}
	cmd := c.cmdID("stop")
	t0 := time.Now()
	resp, err := retry(func() (*connect.Response[ctrlv1.StopWorkspaceResponse], error) {
		return c.ws.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: cmd}, WorkspaceId: w.id, ExpectedExpirationRevision: w.rev}))
	})
	d := time.Since(t0)
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

func (c *client) remove(ctx context.Context, w *wsState) (time.Duration, error) {
	if !w.ok {
		return 0, fmt.Errorf("not stopped")
	}
	cmd := c.cmdID("delete")
	t0 := time.Now()
	resp, err := retry(func() (*connect.Response[ctrlv1.DeleteWorkspaceResponse], error) {
		return c.ws.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: cmd}, WorkspaceId: w.id, ExpectedExpirationRevision: w.rev}))
	})
	d := time.Since(t0)
	if err != nil {
		return d, fmt.Errorf("DeleteWorkspace: %w", err)
	}
	if st := resp.Msg.GetWorkspace().GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		return d, fmt.Errorf("DeleteWorkspace: %s, want DELETED", st)
	}
	return d, nil
}

// waitConnected waits until ListNodes reports n nodes connected; it returns
// the time from since.
func (c *client) waitConnected(ctx context.Context, n int, since time.Time, bound time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(bound)
	last := 0
	for time.Now().Before(deadline) {
		connected, token := 0, ""
		for {
			resp, err := c.nodes.ListNodes(ctx, connect.NewRequest(&ctrlv1.ListNodesRequest{PageSize: 1000, PageToken: token}))
			if err != nil {
				connected = -1
				break
			}
			for _, nd := range resp.Msg.GetNodes() {
				if nd.GetConnected() {
					connected++
				}
			}
			if token = resp.Msg.GetNextPageToken(); token == "" {
				break
			}
		}
		if connected >= n {
			return time.Since(since), nil
		}
		last = connected
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("ListNodes: %d of %d connected after %v", last, n, bound)
}

// waitAvailable waits until no workspace is in another state than
// AVAILABLE (n of them) and returns the time from since.
func (c *client) waitAvailable(ctx context.Context, n int, since time.Time, bound time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(bound)
	last := 0
	for time.Now().Before(deadline) {
		avail, token := 0, ""
		for {
			resp, err := c.ws.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{PageSize: 1000, PageToken: token,
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
		time.Sleep(200 * time.Millisecond)
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
// arrivals).
func paced(n int, rate float64, f func(i int) (time.Duration, error)) phase {
	var (
		p  phase
		mu sync.Mutex
		wg sync.WaitGroup
	)
	interval := time.Duration(float64(time.Second) / rate)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		due := t0.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		} else if -d > p.maxLag {
			p.maxLag = -d
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
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

func (p phase) pct(q float64) time.Duration {
	if len(p.lats) == 0 {
		return 0
	}
	return p.lats[min(len(p.lats)-1, int(q*float64(len(p.lats))))]
}

func (p phase) summary() string {
	return fmt.Sprintf("%d ok, %d errors, p50 %.1f ms, p99 %.1f ms, max %.1f ms, %v", len(p.lats), p.errs,
		benchkit.MS(p.pct(0.5)), benchkit.MS(p.pct(0.99)), benchkit.MS(p.pct(1)), p.wall.Round(time.Millisecond))
}

type report struct {
	opts                                        options
	store                                       string
	base, idle0, idle1, created, restarted, end usage
	connect, listed                             time.Duration
	exited, ready, reconnect, resync, available time.Duration
	exitErr                                     error
	exitLog                                     string
	create, stop, del                           phase
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func (r *report) markdown() string {
	o := r.opts
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Hollow nodes: %d nodes, %d workspaces, %s\n\n", o.nodes, o.workspaces, r.store)
	w("`go run ./bench/hollow -nodes %d -workspaces %d -rate %g -duration %v`", o.nodes, o.workspaces, o.rate, o.duration)
	if o.postgres != "" {
		w(" `-postgres URL`")
	}
	w("\n\n%s, %s CPUs (%s), load %s; GOMAXPROCS %d in the harness. The harness (all agents) and ctrl share the machine.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), benchkit.NProc(), benchkit.CPUModel(), benchkit.LoadAvg(), runtime.GOMAXPROCS(0))
	w("## Nodes\n\n| measure | value |\n|---|---|\n")
	w("| %d streams open (agent's \"ctrl stream open\", from the first agent started) | %v |\n", o.nodes, r.connect.Round(time.Millisecond))
	w("| ListNodes reports all connected | %v |\n", r.listed.Round(time.Millisecond))
	idleCPU := r.idle1.cpu - r.idle0.cpu
	idleWall := r.idle1.at.Sub(r.idle0.at)
	w("| ctrl RSS before nodes / with nodes | %.1f / %.1f MiB |\n", mib(r.base.rss), mib(r.idle0.rss))
	w("| ctrl RSS per node | %.1f KiB |\n", float64(r.idle0.rss-r.base.rss)/1024/float64(o.nodes))
	w("| ctrl CPU idle with the nodes (heartbeats every 5 s) | %.3f cores (%.2f s over %v) |\n", idleCPU.Seconds()/idleWall.Seconds(), idleCPU.Seconds(), idleWall.Round(time.Second))
	w("| ctrl CPU per node idle | %.1f µs/s |\n", idleCPU.Seconds()/idleWall.Seconds()/float64(o.nodes)*1e6)
	w("\n## Commands (open loop, %g/s)\n\n| command | ok | errors | p50 ms | p99 ms | max ms | wall | pacer lag max |\n|---|---|---|---|---|---|---|---|\n", o.rate)
	for _, row := range []struct {
		name string
		p    phase
	}{{"create (answer → COMPLETED)", r.create}, {"stop (call)", r.stop}, {"delete (call)", r.del}} {
		w("| %s | %d | %d | %.1f | %.1f | %.1f | %v | %v |\n", row.name, len(row.p.lats), row.p.errs,
			benchkit.MS(row.p.pct(0.5)), benchkit.MS(row.p.pct(0.99)), benchkit.MS(row.p.pct(1)), row.p.wall.Round(time.Millisecond), row.p.maxLag.Round(time.Millisecond))
	}
	for _, row := range []struct {
		name string
		p    phase
	}{{"create", r.create}, {"stop", r.stop}, {"delete", r.del}} {
		if row.p.first != nil {
			w("\nFirst %s error: `%v`\n", row.name, row.p.first)
		}
	}
	createCPU := r.created.cpu - r.idle1.cpu
	w("\n## Per workspace\n\n| measure | value |\n|---|---|\n")
	idleRate := idleCPU.Seconds() / idleWall.Seconds()
	w("| ctrl CPU per create (create phase's CPU / creates) | %.2f ms (%.2f ms net of the idle nodes' CPU) |\n", createCPU.Seconds()*1e3/float64(max(1, o.workspaces)),
		(createCPU.Seconds()-idleRate*r.created.at.Sub(r.idle1.at).Seconds())*1e3/float64(max(1, o.workspaces)))
	w("| ctrl RSS after creates | %.1f MiB (%.1f KiB per workspace over idle) |\n", mib(r.created.rss), float64(r.created.rss-r.idle1.rss)/1024/float64(max(1, o.workspaces)))
	w("| ctrl RSS after restart, %d AVAILABLE workspaces | %.1f MiB |\n", o.workspaces, mib(r.restarted.rss))
	sd := (r.end.cpu - r.restarted.cpu).Seconds()
	w("| ctrl CPU per stop + delete | %.2f ms (%.2f ms net of the idle nodes' CPU) |\n", sd*1e3/float64(max(1, o.workspaces)),
		(sd-idleRate*r.end.at.Sub(r.restarted.at).Seconds())*1e3/float64(max(1, o.workspaces)))
	w("\n## Restart (SIGTERM, start on the same data directory and address)\n\n| measure, from the SIGTERM | value |\n|---|---|\n")
	w("| old ctrl exited | %v |\n", r.exited.Round(time.Millisecond))
	w("| new ctrl answers GetServerInfo | %v |\n", r.ready.Round(time.Millisecond))
	w("| all %d nodes' streams open again | %v |\n", o.nodes, r.reconnect.Round(time.Millisecond))
	w("| ListNodes reports all connected | %v |\n", r.resync.Round(time.Millisecond))
	w("| all %d workspaces listed AVAILABLE | %v |\n", o.workspaces, r.available.Round(time.Millisecond))
	if r.exitErr != nil {
		msg, _, _ := strings.Cut(r.exitErr.Error(), " (log:")
		w("\nThe old ctrl's exit: `%s`", msg)
		if r.exitLog != "" {
			w("; its last error line: `%s`", r.exitLog)
		}
		w(".\n")
	}
	w("\nThe restart figures include the old ctrl's shutdown: the reconnect after the new one started is their difference to \"old ctrl exited\".\n")
	return b.String()
}
