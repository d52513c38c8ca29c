//go:build linux

// Command dataplane measures the public data plane of Kibotos end to end,
// through the real binaries: it builds kibotos-ctrl and kibotos-guest,
// starts `kibotos-ctrl --dev` (whose embedded node runs real sandboxes) on
// a temporary data directory, creates workspaces with the operator
// certificate and drives the public ProcessService over TLS with data-plane
// tokens only (no client certificate), as a client of the API does.
//
// In one run it measures, side by side with references:
//
//  1. the round trip of `true` (StartProcess → exited event) in an
//     AVAILABLE workspace, against `crun exec` of `true` in a crun
//     container of the same rootfs, layer and guest (bench/internal/crunref);
//  2. time to first command: CreateWorkspace sent → the output of `echo`
//     received (create, wait, session, exec), with its split;
//  3. streaming: the stdout of `head -c 1G /dev/zero` read by the client,
//     against 1 GiB sent by plain HTTP/2 handlers of this process over the
//     same kind of TLS connection;
//  4. revocation: RevokeWorkspaceDataPlane answered → the old token's first
//     refusal on a unary call, and → an open ProcessEvents stream closed;
//  5. concurrency: 100 exec streams over 10 workspaces at once, wall time
//     and the memory of kibotos-ctrl (with its node) and of the guests;
//  6. files: 1 GiB up with the public FileService's WriteFile and down with
//     ReadFile, against the same plain HTTP/2 references.
//
// It prints a markdown report and writes it to bench/results; see
// docs/development.md. Needs root, busybox-static, e2fsprogs and crun.
//
//	go run ./bench/dataplane [-n 300] [-ttfc 30] [-revoke 50] [-out FILE]
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
	"syscall"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	"github.com/kibotos/kibotos/bench/internal/crunref"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

type config struct {
	n, warmup     int
	ttfc          int
	streamBytes   int64
	revoke        int
	concWS        int
	concStreams   int
	concBytes     int64
	ref           bool
	installCrun   bool
	out           string
	keep          bool
	timeout       time.Duration
	phases        map[string]bool
	args          []string
	phaseList     string
	rev           string
	src           string
	fileBytes     int64
	fileRepeats   int
	streamRepeats int
}

func main() { os.Exit(run()) }

func run() int {
	var cfg config
	flag.IntVar(&cfg.n, "n", 300, "measured runs of `true` (and of the crun exec reference)")
	flag.IntVar(&cfg.warmup, "warmup", 20, "unrecorded runs of `true` (and of crun exec) before measuring")
	flag.IntVar(&cfg.ttfc, "ttfc", 30, "time-to-first-command runs (each: a new workspace, deleted after)")
	flag.Int64Var(&cfg.streamBytes, "stream-bytes", 1<<30, "bytes of the streaming measurement (head -c N /dev/zero, and the references)")
	flag.IntVar(&cfg.streamRepeats, "stream-repeats", 3, "repetitions of each streaming measurement (the best and the median are reported)")
	flag.Int64Var(&cfg.fileBytes, "file-bytes", 1<<30, "bytes of the files measurement (WriteFile up, ReadFile down)")
	flag.IntVar(&cfg.fileRepeats, "file-repeats", 2, "repetitions of each file transfer")
	flag.IntVar(&cfg.revoke, "revoke", 50, "revocations measured")
	flag.IntVar(&cfg.concWS, "conc-ws", 10, "workspaces of the concurrency measurement")
	flag.IntVar(&cfg.concStreams, "conc-streams", 100, "exec streams at once, spread over -conc-ws workspaces")
	flag.Int64Var(&cfg.concBytes, "conc-bytes", 10<<20, "bytes each concurrent stream writes before `echo done`")
	flag.BoolVar(&cfg.ref, "ref", true, "measure the crun exec reference")
	flag.BoolVar(&cfg.installCrun, "install-crun", true, "apt-get install crun when it is missing")
	flag.StringVar(&cfg.phaseList, "phases", "exec,ttfc,stream,revoke,conc,files", "measurements to run, comma-separated")
	flag.StringVar(&cfg.out, "out", "auto", "also write the report to this file; auto: bench/results/<UTC date>-dataplane.md in the module; empty: stdout only")
	flag.StringVar(&cfg.rev, "rev", "", "build the binaries from this git revision of the module (git archive REV into the temporary directory) instead of the working tree, e.g. HEAD while the tree is being edited")
	flag.StringVar(&cfg.src, "src", "", "build the binaries from this source tree (a module root, e.g. a patched `git archive` for an A/B comparison) instead of the working tree")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temporary directory (binaries, data directory, server log)")
	flag.DurationVar(&cfg.timeout, "timeout", 20*time.Minute, "abort (and clean up) after this long")
	flag.Parse()
	cfg.args = os.Args[1:]
	cfg.phases = map[string]bool{}
	for _, p := range splitComma(cfg.phaseList) {
		switch p {
		case "exec", "ttfc", "stream", "revoke", "conc", "files":
			cfg.phases[p] = true
		default:
			fmt.Fprintf(os.Stderr, "dataplane: unknown phase %q (exec, ttfc, stream, revoke, conc, files)\n", p)
			return 2
		}
	}
	if cfg.n <= 0 || cfg.warmup < 0 || cfg.ttfc < 0 || cfg.revoke < 0 || cfg.concWS <= 0 || cfg.concStreams < 0 || cfg.streamBytes <= 0 || cfg.concBytes < 0 || cfg.streamRepeats <= 0 || cfg.fileBytes <= 0 || cfg.fileRepeats <= 0 {
		fmt.Fprintln(os.Stderr, "dataplane: counts must be positive")
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "dataplane: workspaces are real sandboxes (namespaces, cgroups, loop devices): run as root")
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()

	b, err := newBench(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dataplane: %v\n", err)
		return 1
	}
	err = b.runAll(ctx)
	if cerr := b.cleanup(); cerr != nil {
		logf("CLEANUP PROBLEM: %v", cerr)
		b.notes = append(b.notes, "cleanup problem: "+cerr.Error())
		if err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "dataplane: %v\n", err)
		b.notes = append(b.notes, "the run did not complete: "+err.Error())
	}
	report := b.report()
	fmt.Print(report)
	if out := b.outPath(); out != "" {
		if werr := os.MkdirAll(filepath.Dir(out), 0o755); werr == nil {
			werr = os.WriteFile(out, []byte(report), 0o644)
			if werr != nil {
				fmt.Fprintf(os.Stderr, "dataplane: %v\n", werr)
				return 1
			}
		}
		logf("report written to %s", out)
	}
	if err != nil {
		return 1
	}
	return 0
}

// bench holds the state and the results of a run.
type bench struct {
	cfg       config
	modRoot   string
	tmp       string
	dataDir   string
	runID     string
	started   time.Time
	loadStart string
	loadEnd   string
	srcRev    string
	crunPath  string
	crunVer   string
	ctrlBin   string
	guestBin  string
	rootfs    string
	srv       *benchkit.DevServer
	api       *api
	ref       *crunref.Env
	notes     []string
	tmpFS     string   // the file system of the temporary directory
	mainID    string   // the workspace of measurements 1, 3 and 4
	phaseLoad []string // per measurement: its duration and the load average before and after

	exec   *execResult
	ttfc   *ttfcResult
	stream *streamResult
	revoke *revokeResult
	conc   *concResult
	files  *filesResult
}

func newBench(ctx context.Context, cfg config) (*bench, error) {
	b := &bench{cfg: cfg, started: time.Now(), loadStart: benchkit.LoadAvg(), runID: fmt.Sprintf("%06x", rand.Uint32()>>8)}
	logf("load average: %s", b.loadStart)
	gomod, err := benchkit.Output(ctx, "", "go", "env", "GOMOD")
	if err != nil || gomod == "" || gomod == os.DevNull {
		return nil, fmt.Errorf("not inside the kibotos module (go env GOMOD: %q, %v)", gomod, err)
	}
	b.modRoot = filepath.Dir(gomod)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		return nil, fmt.Errorf("no /bin/busybox: the default template needs Debian's busybox-static (apt-get install -y busybox-static)")
	}
	if cfg.ref && cfg.phases["exec"] {
		crunref.Logf = logf
		if b.crunPath, b.crunVer, err = crunref.EnsureCrun(ctx, cfg.installCrun); err != nil {
			return nil, err
		}
	}
	if b.tmp, err = os.MkdirTemp("", "dpbench-"); err != nil {
		return nil, err
	}
	b.dataDir = filepath.Join(b.tmp, "data")
	b.tmpFS = benchkit.FSType(b.tmp)
	return b, nil
}

func (b *bench) outPath() string {
	switch b.cfg.out {
	case "":
		return ""
	case "auto":
		return filepath.Join(b.modRoot, "bench", "results", b.started.UTC().Format("2006-01-02")+"-dataplane.md")
	}
	return b.cfg.out
}

func (b *bench) runAll(ctx context.Context) error {
	srcDir := b.modRoot
	if b.cfg.rev != "" && b.cfg.src != "" {
		return errors.New("-rev and -src exclude each other")
	}
	if b.cfg.src != "" {
		abs, err := filepath.Abs(b.cfg.src)
		if err != nil {
			return err
		}
		srcDir = abs
		b.srcRev = "the tree " + abs + " (-src)"
	} else if b.cfg.rev != "" {
		rev, err := benchkit.Output(ctx, b.modRoot, "git", "rev-parse", "--verify", b.cfg.rev+"^{commit}")
		if err != nil {
			return fmt.Errorf("git rev-parse %s: %w", b.cfg.rev, err)
		}
		b.srcRev = rev + " (git archive, not the working tree)"
		srcDir = filepath.Join(b.tmp, "src")
		if err := os.MkdirAll(srcDir, 0o755); err != nil {
			return err
		}
		tarball := filepath.Join(b.tmp, "src.tar")
		if _, err := benchkit.Output(ctx, b.modRoot, "git", "archive", "-o", tarball, rev); err != nil {
			return fmt.Errorf("git archive %s: %w", rev, err)
		}
		if _, err := benchkit.Output(ctx, srcDir, "tar", "-xf", tarball); err != nil {
			return fmt.Errorf("tar -xf %s: %w", tarball, err)
		}
	} else if rev, err := benchkit.Output(ctx, b.modRoot, "git", "rev-parse", "HEAD"); err == nil {
		b.srcRev = rev
		if st, err := benchkit.Output(ctx, b.modRoot, "git", "status", "--porcelain", "--untracked-files=no"); err == nil && st != "" {
			b.srcRev += " (with uncommitted changes)"
		}
	}
	binDir := filepath.Join(b.tmp, "bin")
	logf("building kibotos-ctrl and kibotos-guest (CGO_ENABLED=0) from %s into %s", srcDir, binDir)
	var err error
	if b.ctrlBin, b.guestBin, err = buildBinaries(ctx, srcDir, binDir); err != nil {
		return err
	}
	logf("starting kibotos-ctrl --dev --data-dir %s", b.dataDir)
	b.srv, err = benchkit.StartDev(ctx, benchkit.DevOptions{Bin: b.ctrlBin, DataDir: b.dataDir, LogPath: filepath.Join(b.tmp, "server.log"),
		OwnGroup: true, Args: []string{"--guest-binary", b.guestBin}})
	if err != nil {
		return err
	}
	if b.api, err = newAPI(b.srv, b.runID); err != nil {
		return err
	}
	if err := b.api.waitCapability(ctx, "workspace.exec", 60*time.Second); err != nil {
		return fmt.Errorf("%w\n--- server log (tail) ---\n%s", err, benchkit.Tail(b.srv.LogPath, 3000))
	}
	if b.crunPath != "" {
		if b.rootfs, err = waitTemplate(ctx, filepath.Join(b.dataDir, "node", "templates"), 60*time.Second); err != nil {
			return err
		}
		if b.ref, err = crunref.New(filepath.Join(b.tmp, "ref"), b.crunPath, b.rootfs, b.guestBin, "dpbench", b.runID, crunref.Spec(wsSpec)); err != nil {
			return fmt.Errorf("crun reference: %w", err)
		}
	}
	type phase struct {
		name string
		f    func(context.Context) error
	}
	for _, p := range []phase{{"exec", b.execPhase}, {"ttfc", b.ttfcPhase}, {"stream", b.streamPhase}, {"revoke", b.revokePhase}, {"conc", b.concPhase}, {"files", b.filesPhase}} {
		if !b.cfg.phases[p.name] {
			continue
		}
		before := benchkit.LoadAvg()
		t0 := time.Now()
		err := p.f(ctx)
		b.phaseLoad = append(b.phaseLoad, fmt.Sprintf("%s: %.0f s, load %s → %s", p.name, time.Since(t0).Seconds(), before, benchkit.LoadAvg()))
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// cleanup deletes every workspace of the run, stops the server and the
// reference, and removes the temporary directory.
func (b *bench) cleanup() error {
	var errs []error
	if b.api != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		for _, id := range b.api.liveWorkspaces() {
			if err := b.api.deleteWorkspace(ctx, id); err != nil {
				errs = append(errs, err)
			}
		}
		cancel()
	}
	if b.ref != nil {
		if err := b.ref.Cleanup(); err != nil {
			errs = append(errs, fmt.Errorf("reference cleanup: %w", err))
		}
		if l := b.ref.Leaks(); len(l) > 0 {
			errs = append(errs, fmt.Errorf("the reference left %v", l))
		}
	}
	if b.srv != nil {
		if err := b.srv.Stop(); err != nil {
			errs = append(errs, err)
		}
		// Executions outlive the server: release whatever a failed delete
		// left.
		root := filepath.Join(b.dataDir, "node")
		if l, _ := sandbox.Leaks(root); len(l) > 0 {
			logf("cleanup: the node left %d things; sandbox.Cleanup", len(l))
			if err := sandbox.Cleanup(root); err != nil {
				errs = append(errs, fmt.Errorf("sandbox.Cleanup: %w", err))
			}
		}
	}
	if b.tmp != "" {
		if b.cfg.keep || len(errs) > 0 {
			logf("kept %s", b.tmp)
		} else if err := os.RemoveAll(b.tmp); err != nil {
			errs = append(errs, err)
		}
	}
	b.loadEnd = benchkit.LoadAvg()
	return joinErrs(errs)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
