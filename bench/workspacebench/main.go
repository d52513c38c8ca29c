//go:build linux

// Command workspacebench measures Kibotos workspaces end to end, as real
// sandboxes: it builds kibotos-ctrl and kibotos-guest, starts
// `kibotos-ctrl --dev` (whose embedded node agent runs the executions) and
// drives the WorkspaceService over HTTP/2 with mutual TLS.
//
// In one run it measures, side by side:
//
//  1. CreateWorkspace → AVAILABLE, one after another (each stopped and
//     deleted after) and N at once;
//  2. the same template rootfs, writable layer and kibotos-guest started by
//     Debian's crun from an OCI bundle (the reference), interleaved with 1;
//  3. a normal StopWorkspace of an idle workspace;
//  4. M idle workspaces at once: do they all become AVAILABLE, the memory
//     of the node agent and of the host per workspace, and no leftovers
//     after deleting them;
//  5. how soon a client sees a create complete: polling GetWorkspaceCommand
//     at the SDK's former schedule, or one GetWorkspaceCommand with
//     wait_timeout.
//
// It prints a markdown report and writes it to bench/results; see
// bench/README.md. Needs root, busybox-static, e2fsprogs and crun (installed
// with apt-get when missing).
//
//	go run ./bench/workspacebench [-seq 100] [-conc 50] [-idle 200] [-out FILE]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	"github.com/kibotos/kibotos/bench/internal/crunref"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

type config struct {
	seq, conc, idle int
	wake            int
	warmup          int
	ref             bool
	installCrun     bool
	poll            time.Duration
	batchPoll       time.Duration
	settle          time.Duration
	out             string
	keep            bool
	src             string
	timeout         time.Duration
	args            []string
}

// The workspaces of the issue.
var (
	createSpec = wsSpec{MemoryMiB: 128, CPUMillis: 500, LayerBytes: 64 << 20}
	idleSpec   = wsSpec{MemoryMiB: 64, CPUMillis: 100, LayerBytes: 32 << 20}
)

func main() {
	os.Exit(run())
}

func run() int {
	var cfg config
	flag.IntVar(&cfg.seq, "seq", 100, "workspaces created one after another (each: create, wait AVAILABLE, normal stop, delete); 0 skips phases 1-3 sequential parts")
	flag.IntVar(&cfg.conc, "conc", 50, "workspaces created at once (then deleted); 0 skips")
	flag.IntVar(&cfg.idle, "idle", 200, "idle workspaces kept running at once for the memory measurement (then deleted); 0 skips")
	flag.IntVar(&cfg.wake, "wake", 20, "rounds of one create seen by polling GetWorkspaceCommand (the SDK's former 250 ms ×1.5 schedule) and one seen by GetWorkspaceCommand with wait_timeout; 0 skips")
	flag.IntVar(&cfg.warmup, "warmup", 3, "unrecorded create/stop/delete rounds (and reference starts) before measuring")
	flag.BoolVar(&cfg.ref, "ref", true, "measure the crun reference, interleaved with the sequential creates")
	flag.BoolVar(&cfg.installCrun, "install-crun", true, "apt-get install crun when it is missing")
	flag.DurationVar(&cfg.poll, "poll", 2*time.Millisecond, "pause between GetWorkspaceCommand polls of a sequential create")
	flag.DurationVar(&cfg.batchPoll, "batch-poll", 5*time.Millisecond, "pause between ListWorkspaces(states=CREATING) polls while workspaces are created at once")
	flag.DurationVar(&cfg.settle, "settle", 5*time.Second, "idle time before each memory reading of the idle phase")
	flag.StringVar(&cfg.out, "out", "auto", "also write the report to this file; auto: bench/results/workspaces-<UTC date>.md in the module; empty: stdout only")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temporary directory (binaries, data directory, server log)")
	flag.DurationVar(&cfg.timeout, "timeout", 15*time.Minute, "abort (and clean up) after this long")
	flag.StringVar(&cfg.src, "src", "", "build kibotos-ctrl and kibotos-guest from this source tree (a module root, e.g. `git archive REV | tar -x -C DIR`) instead of this module")
	flag.Parse()
	cfg.args = os.Args[1:]
	if cfg.seq < 0 || cfg.conc < 0 || cfg.idle < 0 || cfg.wake < 0 || cfg.warmup < 0 || cfg.poll < 0 || cfg.batchPoll <= 0 {
		fmt.Fprintln(os.Stderr, "workspacebench: negative counts or durations")
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "workspacebench: workspaces are real sandboxes (namespaces, cgroups, loop devices): run as root")
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()

	b, err := newBench(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "workspacebench: %v\n", err)
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
		fmt.Fprintf(os.Stderr, "workspacebench: %v\n", err)
		if !b.measuredAnything() {
			return 1
		}
		b.notes = append(b.notes, "the run did not complete: "+err.Error())
	}
	report := b.report()
	fmt.Print(report)
	if out := b.outPath(); out != "" {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err == nil {
			err = os.WriteFile(out, []byte(report), 0o644)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "workspacebench: %v\n", err)
			return 1
		}
		logf("report written to %s", out)
	}
	if err != nil {
		return 1
	}
	return 0
}

// bench holds the state and results of a run.
type bench struct {
	cfg       config
	modRoot   string
	tmp       string
	dataDir   string
	nodeRoot  string
	runID     string
	started   time.Time
	loadStart string
	loadEnd   string
	loadSeq   string // after the sequential phase (before our own bulk phases)
	tmpFS     string
	busyStart string
	guest     string
	ctrlBin   string
	ctrlMB    float64 // size of the kibotos-ctrl binary
	guestMB   float64 // size of the kibotos-guest binary
	srcDir    string  // the tree the binaries are built from
	srcRev    string  // its git revision (and whether it is dirty)
	dirty     []string
	rootfs    string
	crunVer   string
	srv       *server
	api       *api
	ref       *crunref.Env
	crunPath  string // crun, when the reference is measured
	tracer    *fsTracer
	notes     []string

	// Phase 1-3: sequential creates (with stop and delete) and the
	// interleaved reference.
	seq       []createSample
	seqStop   []time.Duration
	seqStopWS []string
	seqDelete []time.Duration
	seqErrs   []string
	refs      []crunref.Sample
	refErrs   []string
	cpuSeq    cpuUse

	// Phase 1b: N at once.
	conc           []createSample
	concMakespan   time.Duration
	concDelete     []time.Duration
	concDeleteSpan time.Duration
	concErrs       []string
	cpuConc        cpuUse

	idle *idleResult

	// Phase 5: completion seen by polling and by waiting.
	wakePoll, wakeWait []createSample
	wakeErrs           []string

	rssStart  map[string]uint64
	slog      *serverLog
	leaks     []string // after the last delete, before the server stopped
	refLeaks  []string
	finalLeak []string // after cleanup
}

func newBench(ctx context.Context, cfg config) (*bench, error) {
	b := &bench{cfg: cfg, started: time.Now(), loadStart: benchkit.LoadAvg(), runID: fmt.Sprintf("%06x", rand.Uint32()>>8)}
	logf("load average: %s", b.loadStart)
	b.busyStart = otherBusyProcesses(os.Getpid(), 0)
	gomod, err := benchkit.Output(ctx, "", "go", "env", "GOMOD")
	if err != nil || gomod == "" || gomod == os.DevNull {
		return nil, fmt.Errorf("not inside the kibotos module (go env GOMOD: %q, %v)", gomod, err)
	}
	b.modRoot = filepath.Dir(gomod)
	// Preflight: the default template needs a static busybox, layers need
	// mkfs.ext4.
	if _, err := os.Stat("/bin/busybox"); err != nil {
		if _, err2 := os.Stat("/usr/bin/busybox"); err2 != nil {
			return nil, errors.New("no /bin/busybox: the default template needs Debian's busybox-static (apt-get install -y busybox-static)")
		}
	}
	if _, err := findSbin("mkfs.ext4"); err != nil {
		return nil, errors.New("mkfs.ext4 not found: apt-get install -y e2fsprogs")
	}
	if cfg.ref && cfg.seq > 0 {
		crunref.Logf = logf
		p, v, err := crunref.EnsureCrun(ctx, cfg.installCrun)
		if err != nil {
			return nil, err
		}
		b.crunVer = v
		logf("reference runtime: %s (%s)", p, v)
		b.crunPath = p
	}
	b.tmp, err = os.MkdirTemp("", "wsbench-")
	if err != nil {
		return nil, err
	}
	if strings.ContainsAny(b.tmp, ",:\n") {
		os.RemoveAll(b.tmp)
		return nil, fmt.Errorf("temporary directory %q contains ',' or ':' (overlayfs options): set TMPDIR", b.tmp)
	}
	b.tmpFS = benchkit.FSType(b.tmp)
	if fs := b.tmpFS; fs == "tmpfs" || fs == "overlayfs" {
		logf("WARNING: %s is on %s: fsyncs are free or overlayfs upper dirs may not nest; set TMPDIR to a disk", b.tmp, fs)
	}
	b.dataDir = filepath.Join(b.tmp, "data")
	b.nodeRoot = filepath.Join(b.dataDir, "node")
	return b, nil
}

func findSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}

func (b *bench) measuredAnything() bool {
	return len(b.seq) > 0 || len(b.conc) > 0 || b.idle != nil || len(b.wakePoll) > 0 || len(b.wakeWait) > 0
}

func (b *bench) outPath() string {
	switch b.cfg.out {
	case "":
		return ""
	case "auto":
		return filepath.Join(b.modRoot, "bench", "results", "workspaces-"+b.started.UTC().Format("2006-01-02")+".md")
	}
	return b.cfg.out
}

func (b *bench) runAll(ctx context.Context) error {
	binDir := filepath.Join(b.tmp, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	logf("building kibotos-ctrl and kibotos-guest (CGO_ENABLED=0) into %s", binDir)
	var err error
	b.srcDir = b.modRoot
	if b.cfg.src != "" {
		if b.srcDir, err = filepath.Abs(b.cfg.src); err != nil {
			return err
		}
	}
	b.recordSource(ctx)
	b.ctrlBin, b.guest, err = buildBinaries(ctx, b.srcDir, binDir)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(b.ctrlBin); err == nil {
		b.ctrlMB = float64(fi.Size()) / 1e6
	}
	if fi, err := os.Stat(b.guest); err == nil {
		b.guestMB = float64(fi.Size()) / 1e6
	}
	logf("starting kibotos-ctrl --dev --data-dir %s", b.dataDir)
	b.srv, err = startServer(ctx, b.ctrlBin, b.guest, b.dataDir, filepath.Join(b.tmp, "server.log"))
	if err != nil {
		return err
	}
	b.rssStart = procStatus(b.srv.PID())
	if b.api, err = newAPI(b.srv, b.runID); err != nil {
		return err
	}
	if b.rootfs, err = waitTemplate(ctx, filepath.Join(b.nodeRoot, "templates"), 60*time.Second); err != nil {
		return fmt.Errorf("%w\n--- server log (tail) ---\n%s", err, benchkit.Tail(b.srv.LogPath, 3000))
	}
	logf("default template: %s", b.rootfs)
	if b.tracer, err = startTracer(b.nodeRoot); err != nil {
		logf("inotify tracer unavailable (%v): no breakdown inside the node's Start", err)
		b.tracer = nil
	}
	if b.crunPath != "" {
		if b.ref, err = crunref.New(filepath.Join(b.tmp, "ref"), b.crunPath, b.rootfs, b.guest, "wsbench", b.runID, crunref.Spec(createSpec)); err != nil {
			return err
		}
	}

	if err := b.warmUp(ctx); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if b.cfg.seq > 0 {
		if err := b.sequential(ctx); err != nil {
			return err
		}
	}
	if b.cfg.wake > 0 {
		if err := b.wake(ctx); err != nil {
			return err
		}
	}
	if b.cfg.conc > 0 {
		if err := b.concurrent(ctx); err != nil {
			return err
		}
	}
	if b.cfg.idle > 0 {
		if err := b.idlePhase(ctx); err != nil {
			return err
		}
	}
	// Everything was deleted through the API: nothing may be left.
	b.leaks = b.nodeLeaks()
	if b.ref != nil {
		b.refLeaks = b.ref.Leaks()
	}
	return nil
}

// recordSource notes the git revision of the tree the binaries are built
// from and the files changed outside bench/ at that moment.
func (b *bench) recordSource(ctx context.Context) {
	rev, err := benchkit.Output(ctx, b.srcDir, "git", "rev-parse", "HEAD")
	if err != nil {
		return
	}
	b.srcRev = rev
	cmd := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=all")
	cmd.Dir = b.srcDir
	st, err := cmd.Output() // not trimmed: the first column may be a space
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(st), "\n") {
		if len(l) < 4 {
			continue
		}
		path := strings.TrimSpace(l[3:])
		if strings.HasPrefix(path, "bench/") {
			continue
		}
		b.dirty = append(b.dirty, strings.TrimSpace(l[:2])+" "+path)
	}
	if len(b.dirty) > 0 {
		b.srcRev += " (with uncommitted changes)"
	}
}

// waitTemplate waits until the embedded node has built the default template
// and returns its rootfs.
func waitTemplate(ctx context.Context, dir string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		var m []string
		all, _ := filepath.Glob(filepath.Join(dir, "default", "*", "rootfs"))
		for _, p := range all {
			if !strings.HasPrefix(filepath.Base(filepath.Dir(p)), ".") { // .build-*: not renamed in yet
				m = append(m, p)
			}
		}
		if len(m) > 0 {
			sort.Strings(m)
			return m[len(m)-1], nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the embedded node built no default template in %s within %v", dir, timeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// warmUp runs unrecorded rounds: it waits for the node to connect (the
// first create is placed once it has), and warms caches (binaries, template,
// mkfs, crun).
func (b *bench) warmUp(ctx context.Context) error {
	for i := range b.cfg.warmup {
		s := b.api.createAndWait(ctx, createSpec, b.cfg.poll, 90*time.Second)
		if s.Err != nil {
			return s.Err
		}
		_, rev, err := b.api.stop(ctx, s.ID, s.ExpRev)
		if err != nil {
			return err
		}
		if _, err := b.api.remove(ctx, s.ID, rev); err != nil {
			return err
		}
		if b.ref != nil {
			if r := b.ref.RunOnce(ctx, "warm"+strconv.Itoa(i)); r.Err != nil {
				return fmt.Errorf("reference: %w", r.Err)
			}
		}
		logf("warm-up %d/%d: create→AVAILABLE %.1f ms", i+1, b.cfg.warmup, benchkit.MS(s.observed()))
	}
	return nil
}

// sequential creates workspaces one after another: create, wait AVAILABLE,
// normal stop, delete; interleaved with reference starts (alternating which
// goes first, so that both see the same background).
func (b *bench) sequential(ctx context.Context) error {
	logf("sequential: %d workspaces (%s), each stopped and deleted after; reference interleaved: %v", b.cfg.seq, createSpec, b.ref != nil)
	c0 := benchkit.SampleCPU(b.srv.PID())
	fails := 0
	for i := range b.cfg.seq {
		if err := ctx.Err(); err != nil {
			return err
		}
		refFirst := i%2 == 1
		if refFirst && b.ref != nil {
			b.refOnce(ctx, i)
		}
		s := b.api.createAndWait(ctx, createSpec, b.cfg.poll, 60*time.Second)
		if s.Err == nil {
			b.seq = append(b.seq, s)
			stopD, rev, err := b.api.stop(ctx, s.ID, s.ExpRev)
			if err == nil {
				b.seqStop = append(b.seqStop, stopD)
				b.seqStopWS = append(b.seqStopWS, s.ID)
				var delD time.Duration
				if delD, err = b.api.remove(ctx, s.ID, rev); err == nil {
					b.seqDelete = append(b.seqDelete, delD)
				}
			}
			if err != nil {
				s.Err = err
			}
		}
		if s.Err != nil {
			fails++
			b.seqErrs = append(b.seqErrs, s.Err.Error())
			logf("sequential %d: %v", i, s.Err)
			if s.ID != "" {
				b.forceRemove(ctx, s.ID)
			}
			if fails > 5 {
				return fmt.Errorf("sequential: too many failures, last: %w", s.Err)
			}
		}
		if !refFirst && b.ref != nil {
			b.refOnce(ctx, i)
		}
		if (i+1)%20 == 0 {
			logf("sequential: %d/%d done", i+1, b.cfg.seq)
		}
	}
	b.cpuSeq = cpuBetween(c0, benchkit.SampleCPU(b.srv.PID()))
	b.loadSeq = benchkit.LoadAvg()
	return nil
}

func (b *bench) refOnce(ctx context.Context, i int) {
	r := b.ref.RunOnce(ctx, strconv.Itoa(i))
	if r.Err != nil {
		b.refErrs = append(b.refErrs, r.Err.Error())
		logf("reference %d: %v", i, r.Err)
		return
	}
	b.refs = append(b.refs, r)
}

// forceRemove deletes a workspace whose measurement failed, whatever its
// state.
func (b *bench) forceRemove(ctx context.Context, id string) {
	live := b.api.liveWorkspaces()
	rev, ok := live[id]
	if !ok {
		return
	}
	if _, err := b.api.remove(ctx, id, rev); err != nil {
		logf("delete %s: %v", id, err)
	}
}

// concurrent creates N workspaces at once, waits for all, deletes them.
func (b *bench) concurrent(ctx context.Context) error {
	n := b.cfg.conc
	logf("at once: %d workspaces (%s)", n, createSpec)
	c0 := benchkit.SampleCPU(b.srv.PID())
	t0 := time.Now()
	samples, err := b.api.createBatch(ctx, n, createSpec, b.cfg.batchPoll, 3*time.Minute)
	b.concMakespan = time.Since(t0)
	b.cpuConc = cpuBetween(c0, benchkit.SampleCPU(b.srv.PID()))
	b.conc = samples
	for i := range samples {
		if samples[i].Err != nil {
			b.concErrs = append(b.concErrs, samples[i].Err.Error())
		}
	}
	if err != nil {
		return fmt.Errorf("at once: %w", err)
	}
	logf("at once: all left CREATING in %.0f ms (%d failed); deleting them at once", benchkit.MS(b.concMakespan), len(b.concErrs))
	lats, span, errs := b.api.removeAll(ctx, b.api.liveWorkspaces())
	b.concDelete, b.concDeleteSpan = lats, span
	for _, e := range errs {
		b.concErrs = append(b.concErrs, e.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("at once: %d deletes failed, first: %w", len(errs), errs[0])
	}
	return nil
}

// nodeLeaks lists what the node's runtime still holds (sandbox.Leaks), the
// writable layers left, and loop devices and mounts under the temporary
// directory.
func (b *bench) nodeLeaks() []string {
	var out []string
	l, err := sandbox.Leaks(b.nodeRoot)
	if err != nil {
		out = append(out, "sandbox.Leaks: "+err.Error())
	}
	out = append(out, l...)
	if ents, err := os.ReadDir(filepath.Join(b.nodeRoot, "layers")); err == nil {
		for _, e := range ents {
			out = append(out, "writable layer "+e.Name())
		}
	}
	for _, d := range crunref.LoopsUnder(b.tmp + "/") {
		out = append(out, "loop device "+d)
	}
	if bs, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, ln := range strings.Split(string(bs), "\n") {
			f := strings.Fields(ln)
			if len(f) > 4 && strings.HasPrefix(f[4], b.tmp+"/") {
				out = append(out, "mount "+f[4])
			}
		}
	}
	sort.Strings(out)
	return slicesCompact(out)
}

func slicesCompact(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// cleanup deletes what is left, stops the server, releases everything of
// the node's state directory and of the reference, reads the server log and
// removes the temporary directory.
func (b *bench) cleanup() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if b.srv != nil && b.srv.Alive() && b.api != nil {
		if live := b.api.liveWorkspaces(); len(live) > 0 {
			logf("cleanup: deleting %d workspaces left", len(live))
			if _, _, derrs := b.api.removeAll(ctx, live); len(derrs) > 0 {
				errs = append(errs, fmt.Errorf("cleanup: %d deletes failed, first: %w", len(derrs), derrs[0]))
			}
		}
	}
	if b.api != nil {
		b.api.close()
	}
	if b.tracer != nil {
		b.tracer.stop()
	}
	if b.srv != nil {
		if err := b.srv.Stop(); err != nil {
			errs = append(errs, err)
		}
		if l, err := readServerLog(b.srv.LogPath); err == nil {
			b.slog = l
		}
	}
	if b.nodeRoot != "" {
		if _, err := os.Stat(b.nodeRoot); err == nil {
			if l, _ := sandbox.Leaks(b.nodeRoot); len(l) > 0 {
				logf("cleanup: the node left %d things; sandbox.Cleanup", len(l))
			}
			// Also removes the runtime's (empty) cgroup base.
			if err := sandbox.Cleanup(b.nodeRoot); err != nil {
				errs = append(errs, fmt.Errorf("sandbox.Cleanup: %w", err))
			}
		}
	}
	if b.ref != nil {
		if err := b.ref.Cleanup(); err != nil {
			errs = append(errs, fmt.Errorf("reference cleanup: %w", err))
		}
	}
	if b.tmp != "" {
		b.finalLeak = nil
		if l, err := sandbox.Leaks(b.nodeRoot); err == nil {
			b.finalLeak = append(b.finalLeak, l...)
		}
		if b.ref != nil {
			b.finalLeak = append(b.finalLeak, b.ref.Leaks()...)
		}
		for _, d := range crunref.LoopsUnder(b.tmp + "/") {
			b.finalLeak = append(b.finalLeak, "loop device "+d)
		}
		mounted := false
		if bs, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
			mounted = strings.Contains(string(bs), " "+b.tmp+"/")
		}
		switch {
		case mounted:
			errs = append(errs, fmt.Errorf("something is still mounted under %s: not removing it", b.tmp))
		case b.cfg.keep:
			logf("kept %s", b.tmp)
		default:
			if err := os.RemoveAll(b.tmp); err != nil {
				errs = append(errs, err)
			}
		}
	}
	b.loadEnd = benchkit.LoadAvg()
	return errors.Join(errs...)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
