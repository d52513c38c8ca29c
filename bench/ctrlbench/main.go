// Command ctrlbench measures kibotos-ctrl end to end: it builds the real
// binary, starts it per store (SQLite and PostgreSQL in the same run), and
// drives the EgressService over HTTP/2 with mutual TLS using the operator
// certificate of the development PKI.
//
// It measures durable admission (CreateEgress with a fresh command ID each
// time), GetEgress of random seeded IDs, and ListEgresses with a label
// selector returning a page of 100, at a small and a large population
// (1k and 100k Egresses by default, seeded directly into the store while the
// server is stopped), each at concurrency 1, 16 and 64. It prints a markdown
// report; see bench/README.md.
//
//	go run ./bench/ctrlbench [-stores sqlite,postgres] [-postgres URL] [-duration 5s] [-out FILE.md]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

const (
	defaultPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	pageSize        = 100
)

// Operation names, as they appear in the report.
const (
	opCreate     = "CreateEgress"
	opCreateConn = "CreateEgress (connection per worker)"
	opGet        = "GetEgress"
	opListFirst  = "ListEgresses decile=3, first page"
	opListRandom = "ListEgresses decile=3, random page"
)

type config struct {
	stores         []string
	postgresURL    string
	duration       time.Duration
	warmup         time.Duration
	conc           []int
	small, large   int
	out            string
	compareClients bool
	keep           bool
	cpuprofile     string
	serverProfile  string
	ops            map[string]bool
	args           []string
}

func main() {
	os.Exit(run())
}

func run() int {
	var cfg config
	var stores, conc, ops string
	pgDefault := os.Getenv("KIBOTOS_TEST_POSTGRES_URL")
	if pgDefault == "" {
		pgDefault = defaultPostgres
	}
	flag.StringVar(&stores, "stores", "sqlite,postgres", "comma-separated stores to benchmark: sqlite, postgres")
	flag.StringVar(&cfg.postgresURL, "postgres", pgDefault, "PostgreSQL base URL; a fresh database kibotos_bench_<random> is created on its server and dropped afterwards (default $KIBOTOS_TEST_POSTGRES_URL, else "+defaultPostgres+")")
	flag.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured time of each (store, operation, population, concurrency)")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "unrecorded warm-up before each measurement")
	flag.StringVar(&conc, "conc", "1,16,64", "comma-separated concurrencies (client goroutines)")
	flag.IntVar(&cfg.small, "small", 1000, "small population of seeded Egresses")
	flag.IntVar(&cfg.large, "large", 100000, "large population of seeded Egresses")
	flag.StringVar(&cfg.out, "out", "", "also write the markdown report to this file (parent directories are created)")
	flag.BoolVar(&cfg.compareClients, "compare-clients", true, "also measure CreateEgress with one client (one HTTP/2 connection) per worker, at every concurrency above 1")
	flag.StringVar(&cfg.serverProfile, "server-cpuprofile", "", "build the server from bench/ctrlprof (ctrl.Main with a CPU profile) and write PREFIX-<store>-<population>.prof for each server run")
	flag.StringVar(&ops, "ops", "get,list,create", "comma-separated operations to measure: get, list, create (the seeding and the checks always run)")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temporary directory (binary, data directories, server logs)")
	flag.StringVar(&cfg.cpuprofile, "cpuprofile", "", "write a CPU profile of the benchmark client (this process, not the server) to this file")
	flag.Parse()
	cfg.args = os.Args[1:]

	for _, s := range strings.Split(stores, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "sqlite", "postgres":
			cfg.stores = append(cfg.stores, s)
		case "":
		default:
			fmt.Fprintf(os.Stderr, "ctrlbench: -stores: unknown store %q (want sqlite, postgres)\n", s)
			return 2
		}
	}
	cfg.ops = map[string]bool{}
	for _, s := range strings.Split(ops, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "get", "list", "create":
			cfg.ops[s] = true
		case "":
		default:
			fmt.Fprintf(os.Stderr, "ctrlbench: -ops: unknown operation %q (want get, list, create)\n", s)
			return 2
		}
	}
	for _, s := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "ctrlbench: -conc: bad concurrency %q\n", s)
			return 2
		}
		cfg.conc = append(cfg.conc, n)
	}
	if len(cfg.stores) == 0 || cfg.small < pageSize || cfg.large < cfg.small || cfg.duration <= 0 {
		fmt.Fprintln(os.Stderr, "ctrlbench: need at least one store, -small >= 100, -large >= -small and a positive -duration")
		return 2
	}
	// A full page of 100 needs 100 Egresses with decile=3.
	if cfg.small < 10*pageSize {
		fmt.Fprintf(os.Stderr, "ctrlbench: -small must be at least %d for a full page of decile=3\n", 10*pageSize)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if cfg.cpuprofile != "" {
		f, err := os.Create(cfg.cpuprofile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "ctrlbench: %v\n", err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "ctrlbench: %v\n", err)
			return 1
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}

	b, err := newBench(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ctrlbench: %v\n", err)
		return 1
	}
	defer b.cleanup()
	for _, st := range cfg.stores {
		if err := b.runStore(ctx, st); err != nil {
			fmt.Fprintf(os.Stderr, "ctrlbench: %s: %v\n", st, err)
			return 1
		}
	}
	report := b.report()
	fmt.Print(report)
	if cfg.out != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.out), 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "ctrlbench: %v\n", err)
			return 1
		}
		if err := os.WriteFile(cfg.out, []byte(report), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "ctrlbench: %v\n", err)
			return 1
		}
		logf("report written to %s", cfg.out)
	}
	return 0
}

// bench holds the state of a whole run.
type bench struct {
	cfg     config
	modRoot string
	tmp     string
	bin     string
	runID   string
	started time.Time
	// loadStart is the load average when the run began: other work on the
	// machine skews every number.
	loadStart string

	results  []result
	seeding  []string // one line per seeding step, for the report
	revision string   // reported by the server
	pgInfo   string
	seq      atomic.Uint64 // command ID sequence
}

func newBench(ctx context.Context, cfg config) (*bench, error) {
	b := &bench{cfg: cfg, started: time.Now(), loadStart: benchkit.LoadAvg()}
	logf("load average: %s", b.loadStart)
	b.runID = fmt.Sprintf("%08x", rand.Uint32())
	gomod, err := benchkit.Output(ctx, "", "go", "env", "GOMOD")
	if err != nil || gomod == "" || gomod == os.DevNull {
		return nil, fmt.Errorf("not inside the kibotos module (go env GOMOD: %q, %v)", gomod, err)
	}
	b.modRoot = filepath.Dir(gomod)
	b.tmp, err = os.MkdirTemp("", "ctrlbench-*")
	if err != nil {
		return nil, err
	}
	if fs := benchkit.FSType(b.tmp); fs == "tmpfs" {
		logf("WARNING: %s is on tmpfs: fsync is free there, SQLite results will be optimistic (set TMPDIR to a disk)", b.tmp)
	}
	logf("building kibotos-ctrl into %s", b.tmp)
	b.bin, err = buildServer(ctx, b.modRoot, b.tmp, cfg.serverProfile != "")
	if err != nil {
		b.cleanup()
		return nil, err
	}
	return b, nil
}

func (b *bench) cleanup() {
	if b.cfg.keep {
		logf("kept %s", b.tmp)
		return
	}
	_ = os.RemoveAll(b.tmp)
}

// runStore benchmarks one store: seed the small population, measure reads;
// seed up to the large population, measure reads, then measure creates.
func (b *bench) runStore(ctx context.Context, name string) (err error) {
	dataDir := filepath.Join(b.tmp, name)
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	var storeSpec, serverStore string
	switch name {
	case "sqlite":
		// The --dev default, DIR/ctrl.db; seeded at the same path.
		storeSpec = filepath.Join(dataDir, "ctrl.db")
	case "postgres":
		dbURL, drop, err := createPGDatabase(ctx, b.cfg.postgresURL)
		if err != nil {
			return err
		}
		defer func() {
			if derr := drop(); derr != nil {
				err = errors.Join(err, derr)
			}
		}()
		logf("postgres: created database %s", redact(dbURL))
		b.pgInfo = postgresVersion(ctx, dbURL)
		storeSpec, serverStore = dbURL, dbURL
	}
	sd, err := newSeeder()
	if err != nil {
		return err
	}
	pops := []int{b.cfg.small, b.cfg.large}
	if b.cfg.large == b.cfg.small {
		pops = pops[:1]
	}
	for i, pop := range pops {
		if err := ctx.Err(); err != nil {
			return err
		}
		t0 := time.Now()
		before := len(sd.IDs)
		if err := sd.growTo(ctx, storeSpec, pop); err != nil {
			return err
		}
		d := time.Since(t0)
		line := fmt.Sprintf("%s: seeded %d Egresses (%d → %d) in %.1fs (%.0f rows/s, batches of %d)",
			name, pop-before, before, pop, d.Seconds(), float64(pop-before)/d.Seconds(), seedBatch)
		logf("%s", line)
		b.seeding = append(b.seeding, line)

		profile := ""
		if b.cfg.serverProfile != "" {
			profile, err = filepath.Abs(fmt.Sprintf("%s-%s-%s.prof", b.cfg.serverProfile, name, popLabel(pop)))
			if err != nil {
				return err
			}
		}
		// The control plane alone: no embedded node (as root, ctrl --dev
		// would otherwise start one and need a guest binary beside it).
		o := benchkit.DevOptions{Bin: b.bin, DataDir: dataDir, LogPath: filepath.Join(dataDir, fmt.Sprintf("server-%d.log", i)),
			Args: []string{"--dev-no-node"}}
		if serverStore != "" {
			o.Args = append(o.Args, "--store", serverStore)
		}
		if profile != "" {
			o.Env = []string{"CTRLBENCH_CPUPROFILE=" + profile}
		}
		srv, err := benchkit.StartDev(ctx, o)
		if err != nil {
			return err
		}
		b.revision = srv.Revision
		logf("%s: kibotos-ctrl serving on %s (population %s)", name, srv.URL, popLabel(pop))
		err = b.readBenchmarks(ctx, name, srv, sd, pop)
		if err == nil && i == len(pops)-1 && b.cfg.ops["create"] {
			err = b.createBenchmarks(ctx, name, srv, pop)
		}
		if serr := srv.Stop(); serr != nil {
			err = errors.Join(err, serr)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) maxConc() int { return slices.Max(b.cfg.conc) }

func (b *bench) record(ctx context.Context, srv *benchkit.DevServer, store, op, pop string, conc int, fn opFunc) {
	logf("%s: %s, population %s, concurrency %d ...", store, op, pop, conc)
	pid := srv.PID()
	r := measure(ctx, conc, b.cfg.warmup, b.cfg.duration, fn, func() benchkit.CPUSample { return benchkit.SampleCPU(pid) })
	r.Store, r.Op, r.Population = store, op, pop
	msg := fmt.Sprintf("    %.0f ops/s, p50 %.2f ms, p99 %.2f ms, n=%d", r.OpsPerS, benchkit.MS(r.P50), benchkit.MS(r.P99), r.N)
	if r.CPUOK {
		msg += fmt.Sprintf("; CPU/op client %dµs server %dµs other %dµs; machine %.0f%% busy",
			r.ClientCPU.Microseconds(), r.ServerCPU.Microseconds(), r.OtherCPU.Microseconds(), 100*r.MachineBusy)
	}
	if r.Errors > 0 {
		msg += fmt.Sprintf(", %d ERRORS (first: %s)", r.Errors, r.FirstErr)
	}
	logf("%s", msg)
	b.results = append(b.results, r)
}

// readBenchmarks checks the seeded data through the API, then measures
// GetEgress and ListEgresses at every concurrency.
func (b *bench) readBenchmarks(ctx context.Context, name string, srv *benchkit.DevServer, sd *seeder, pop int) error {
	ec, err := newEgressClients(srv, b.maxConc(), false)
	if err != nil {
		return err
	}
	defer ec.close()
	cl := ec.get(0)
	if err := checkSeeded(ctx, cl, sd); err != nil {
		return fmt.Errorf("seeded data check failed: %w", err)
	}
	ids := slices.Clone(sd.IDs)
	pl := popLabel(pop)

	for _, c := range b.cfg.conc {
		if !b.cfg.ops["get"] {
			break
		}
		b.record(ctx, srv, name, opGet, pl, c, func(ctx context.Context, w int) error {
			id := ids[rand.IntN(len(ids))]
			resp, err := ec.get(w).GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: id}))
			if err != nil {
				return err
			}
			if got := resp.Msg.GetEgress().GetEgressId(); got != id {
				return fmt.Errorf("GetEgress(%s) returned %q", id, got)
			}
			return nil
		})
	}
	if !b.cfg.ops["list"] {
		return nil
	}
	for _, c := range b.cfg.conc {
		b.record(ctx, srv, name, opListFirst, pl, c, func(ctx context.Context, w int) error {
			return listPage(ctx, ec.get(w), "")
		})
	}
	if pop == b.cfg.small {
		return nil
	}
	// Random pages: positions spread over the whole selection, reached by
	// page tokens collected beforehand.
	tokens, err := collectTokens(ctx, cl)
	if err != nil {
		return err
	}
	logf("%s: collected %d page tokens for decile=3", name, len(tokens))
	for _, c := range b.cfg.conc {
		b.record(ctx, srv, name, opListRandom, pl, c, func(ctx context.Context, w int) error {
			return listPage(ctx, ec.get(w), tokens[rand.IntN(len(tokens))])
		})
	}
	return nil
}

var selector = map[string]string{"decile": "3"}

// listPage lists one page of decile=3 and checks that it is full.
func listPage(ctx context.Context, cl interface {
	ListEgresses(context.Context, *connect.Request[ctrlv1.ListEgressesRequest]) (*connect.Response[ctrlv1.ListEgressesResponse], error)
}, token string) error {
	resp, err := cl.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{
		PageSize: pageSize, PageToken: token, LabelSelector: selector,
	}))
	if err != nil {
		return err
	}
	if n := len(resp.Msg.GetEgresses()); n != pageSize {
		return fmt.Errorf("ListEgresses returned %d Egresses, want a full page of %d", n, pageSize)
	}
	return nil
}

// createBenchmarks measures CreateEgress with a fresh command ID per call,
// first with one shared client, then (with -compare-clients) with one client
// and connection per worker.
func (b *bench) createBenchmarks(ctx context.Context, name string, srv *benchkit.DevServer, pop int) error {
	pl := popLabel(pop) + "+"
	variants := []struct {
		op        string
		perWorker bool
	}{{opCreate, false}}
	if b.cfg.compareClients {
		variants = append(variants, struct {
			op        string
			perWorker bool
		}{opCreateConn, true})
	}
	for vi, v := range variants {
		for _, c := range b.cfg.conc {
			if v.perWorker && c == 1 {
				continue // the same as the shared client
			}
			ec, err := newEgressClients(srv, c, v.perWorker)
			if err != nil {
				return err
			}
			b.record(ctx, srv, name, v.op, pl, c, func(ctx context.Context, w int) error {
				id := fmt.Sprintf("bench-%s-v%d-c%d-%d", b.runID, vi, c, b.seq.Add(1))
				resp, err := ec.get(w).CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{
					Metadata: &ctrlv1.CommandMetadata{CommandId: id},
					Spec:     egressSpec(),
				}))
				if err != nil {
					return err
				}
				if resp.Msg.GetEgress().GetEgressId() == "" || resp.Msg.GetEgress().GetRevision() != 1 {
					return fmt.Errorf("CreateEgress(%s): unexpected answer %v", id, resp.Msg)
				}
				return nil
			})
			ec.close()
		}
	}
	return nil
}

func popLabel(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
