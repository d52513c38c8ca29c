//go:build linux

// Command network measures a workspace's network data path end to end,
// through the real binaries: it builds kibotos-ctrl, kibotos-node,
// kibotos-guest and netprobe, starts `kibotos-ctrl --dev --dev-no-node`
// and a kibotos-node allow-listing internal/nettest's range, and creates
// one workspace (mode PUBLIC_INTERNET, some server ports routed through a
// SOCKS5 Egress) into which netprobe is copied with the FileService.
//
// The servers (nettest Sink, Source and Hold) and Debian's danted (the
// Egress, no authentication) run in one peer network namespace joined to
// the host by a veth pair. In one run it measures:
//
//  1. TCP throughput, both directions, and connect latency from inside the
//     workspace: directly (workspace → the node's user-space stack → the
//     node's socket → the server) and through the Egress; the references,
//     measured in the same run and interleaved: the same netprobe in a
//     second namespace joined to the host by a veth pair whose traffic the
//     host forwards and masquerades to the server (a kernel veth + NAT
//     path the benchmark sets up itself), a client in this process talking
//     to the same Dante, and one dialing the server directly from the host;
//  2. 5,000 concurrent idle connections through the workspace, and the
//     node's memory per connection;
//  3. policy update → new flows follow it: a deny of a destination toggled
//     with UpdateWorkspaceNetworkPolicy while netprobe in the workspace
//     connects to it every millisecond.
//
// It prints a markdown report and writes it to bench/results. Needs root,
// busybox-static, e2fsprogs, iproute2, dante-server and nf_nat.
//
//	go run ./bench/network [-bytes 536870912] [-repeats 3] [-idle 5000] [-toggles 100] [-out FILE]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/nettest"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

type config struct {
	bytes     int64
	repeats   int
	connects  int
	idle      int
	toggles   int
	settle    time.Duration
	wsCPU     uint32
	wsMemMiB  uint32
	out       string
	keep      bool
	timeout   time.Duration
	args      []string
	phaseList string
	phases    map[string]bool
}

func main() { os.Exit(run()) }

func run() int {
	var cfg config
	flag.Int64Var(&cfg.bytes, "bytes", 512<<20, "bytes of each transfer")
	flag.IntVar(&cfg.repeats, "repeats", 3, "transfers per path and direction (the median and the best are reported)")
	flag.IntVar(&cfg.connects, "connects", 1000, "connects one after another per path")
	flag.IntVar(&cfg.idle, "idle", 5000, "idle connections held at once through the workspace")
	flag.IntVar(&cfg.toggles, "toggles", 100, "policy updates of the follow measurement")
	flag.DurationVar(&cfg.settle, "settle", 3*time.Second, "pause before each memory reading")
	cpu := flag.Uint("ws-cpu", 1000, "the workspace's cpu_millis")
	mem := flag.Uint("ws-memory", 512, "the workspace's memory in MiB")
	flag.StringVar(&cfg.phaseList, "phases", "paths,idle,follow", "measurements to run, comma-separated")
	flag.StringVar(&cfg.out, "out", "auto", "also write the report to this file; auto: bench/results/<UTC date>-network.md in the module; empty: stdout only")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temporary directory (binaries, logs)")
	flag.DurationVar(&cfg.timeout, "timeout", 30*time.Minute, "abort (and clean up) after this long")
	flag.Parse()
	cfg.wsCPU, cfg.wsMemMiB = uint32(*cpu), uint32(*mem)
	cfg.args = os.Args[1:]
	cfg.phases = map[string]bool{}
	for p := range strings.SplitSeq(cfg.phaseList, ",") {
		switch p = strings.TrimSpace(p); p {
		case "paths", "idle", "follow":
			cfg.phases[p] = true
		case "":
		default:
			fmt.Fprintf(os.Stderr, "network: unknown phase %q (paths, idle, follow)\n", p)
			return 2
		}
	}
	if cfg.bytes <= 0 || cfg.repeats <= 0 || cfg.connects <= 0 || cfg.idle <= 0 || cfg.toggles <= 0 {
		fmt.Fprintln(os.Stderr, "network: counts must be positive")
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "network: needs root (workspaces are real sandboxes; the peers are network namespaces)")
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()

	b := &bench{cfg: cfg, started: time.Now(), loadStart: benchkit.LoadAvg(), runID: fmt.Sprintf("%06x", rand.Uint32()>>8)}
	err := b.runAll(ctx)
	if cerr := b.cleanup(); cerr != nil {
		logf("CLEANUP PROBLEM: %v", cerr)
		b.notes = append(b.notes, "cleanup problem: "+cerr.Error())
		if err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "network: %v\n", err)
		b.notes = append(b.notes, "the run did not complete: "+err.Error())
	}
	report := b.report()
	fmt.Print(report)
	if out := b.outPath(); out != "" {
		if werr := os.WriteFile(out, []byte(report), 0o644); werr != nil {
			fmt.Fprintf(os.Stderr, "network: %v\n", werr)
			return 1
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
	runID     string
	started   time.Time
	loadStart string
	loadEnd   string
	srcRev    string
	notes     []string
	phaseLoad []string

	bin     binaries
	srv     *benchkit.DevServer
	node    *nodeProc
	api     *api
	ws      *workspace
	peers   []*nettest.Peer
	unNAT   func() error
	dante   *nettest.Dante
	servers servers
	policy  *ctrlv1.NetworkPolicy
	natNote string

	paths  []*pathResult
	idle   *idleResult
	follow *followResult
}

func (b *bench) outPath() string {
	switch b.cfg.out {
	case "":
		return ""
	case "auto":
		return filepath.Join(b.modRoot, "bench", "results", b.started.UTC().Format("2006-01-02")+"-network.md")
	}
	return b.cfg.out
}

func (b *bench) runAll(ctx context.Context) error {
	gomod, err := benchkit.Output(ctx, "", "go", "env", "GOMOD")
	if err != nil || gomod == "" || gomod == os.DevNull {
		return fmt.Errorf("not inside the kibotos module (go env GOMOD: %q, %v)", gomod, err)
	}
	b.modRoot = filepath.Dir(gomod)
	if rev, err := benchkit.Output(ctx, b.modRoot, "git", "rev-parse", "HEAD"); err == nil {
		b.srcRev = rev
		// The results files are not the source (a rerun rewrites the day's).
		if st, err := benchkit.Output(ctx, b.modRoot, "git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results"); err == nil && st != "" {
			b.srcRev += " (with uncommitted changes)"
		}
	}
	if b.tmp, err = os.MkdirTemp("", "netbench-"); err != nil {
		return err
	}
	logf("building the binaries and netprobe (CGO_ENABLED=0) into %s", b.tmp)
	if b.bin, err = build(ctx, b.modRoot, filepath.Join(b.tmp, "bin")); err != nil {
		return err
	}

	// The peers: the servers and the Dante; the reference's namespace.
	srvPeer, err := b.peer()
	if err != nil {
		return err
	}
	refPeer, err := b.peer()
	if err != nil {
		return err
	}
	s := &b.servers
	for _, x := range []struct {
		p    **nettest.TCPServer
		mode nettest.Mode
	}{{&s.sink, nettest.Sink}, {&s.source, nettest.Source}, {&s.conn, nettest.Hold}, {&s.sinkE, nettest.Sink}, {&s.sourceE, nettest.Source}, {&s.connE, nettest.Hold}, {&s.hold, nettest.Hold}} {
		if *x.p, err = srvPeer.TCP(x.mode, 0); err != nil {
			return err
		}
	}
	if b.dante, err = srvPeer.Dante(nettest.DanteOptions{}); err != nil {
		return err
	}
	if b.unNAT, err = masquerade(refPeer.Prefix, srvPeer.HostLink); err != nil {
		b.natNote = "no NAT (" + err.Error() + "): the reference is routed only"
		logf("kernel reference: %s", b.natNote)
	}

	logf("starting kibotos-ctrl --dev --dev-no-node and kibotos-node")
	if b.srv, err = benchkit.StartDev(ctx, benchkit.DevOptions{Bin: b.bin.ctrl, DataDir: filepath.Join(b.tmp, "data"), LogPath: filepath.Join(b.tmp, "ctrl.log"),
		OwnGroup: true, Args: []string{"--dev-no-node", "--allow-endpoint-ranges", nettest.Range.String(), "--log-level", "warn"}}); err != nil {
		return err
	}
	if b.node, err = startNode(b.srv, b.bin, b.tmp); err != nil {
		return err
	}
	if b.api, err = newAPI(b.srv, b.runID); err != nil {
		return err
	}
	if err := b.api.waitCapabilities(ctx, 60*time.Second, "workspace.exec", "workspace.network_policy", "egress.socks5"); err != nil {
		return fmt.Errorf("%w\n--- node log (tail) ---\n%s", err, benchkit.Tail(b.node.log, 3000))
	}
	eg, err := b.api.eg.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: b.api.md("egress"),
		Spec: &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: b.dante.Addr.String()}}}}))
	if err != nil {
		return fmt.Errorf("CreateEgress: %w", err)
	}
	var viaEgress []*ctrlv1.Destination
	for _, x := range []*nettest.TCPServer{s.sinkE, s.sourceE, s.connE} {
		viaEgress = append(viaEgress, &ctrlv1.Destination{Cidr: netip.PrefixFrom(srvPeer.Addr, 32).String(), PortMin: uint32(x.Addr.Port()), PortMax: uint32(x.Addr.Port())})
	}
	b.policy = &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET,
		Egresses: []*ctrlv1.EgressRoute{{EgressId: eg.Msg.GetEgress().GetEgressId(), Destinations: viaEgress}}}
	if b.ws, err = b.api.createWorkspace(ctx, b.cfg.wsMemMiB, b.cfg.wsCPU, b.policy, b.bin.probe); err != nil {
		return err
	}
	logf("workspace %s ready", b.ws.id)

	phases := []struct {
		name string
		f    func(context.Context) error
	}{
		{"paths", func(ctx context.Context) error {
			paths := []path{
				workspacePath("workspace, direct", b.ws, b.node.pid(), s.sink.Addr, s.source.Addr, s.conn.Addr),
				peerPath("kernel veth + NAT (reference)", refPeer, b.bin.probe, s.sink.Addr, s.source.Addr, s.conn.Addr),
				workspacePath("workspace, through the Egress", b.ws, b.node.pid(), s.sinkE.Addr, s.sourceE.Addr, s.connE.Addr),
				hostPath("host client through the same Dante (reference)", dialVia(b.dante), s.sinkE.Addr, s.sourceE.Addr, s.connE.Addr),
				hostPath("host client, direct", dialDirect, s.sink.Addr, s.source.Addr, s.conn.Addr),
			}
			logf("paths: %d MiB each way, %d times, %d connects", b.cfg.bytes>>20, b.cfg.repeats, b.cfg.connects)
			b.paths = measurePaths(ctx, paths, b.cfg.bytes, b.cfg.repeats, b.cfg.connects)
			return nil
		}},
		{"idle", func(ctx context.Context) error {
			logf("idle: %d connections through the workspace", b.cfg.idle)
			b.idle = measureIdle(ctx, b.ws, s.hold, b.node.pid(), b.cfg.idle, b.cfg.settle)
			return nil
		}},
		{"follow", func(ctx context.Context) error {
			logf("follow: %d policy updates", b.cfg.toggles)
			b.follow = measureFollow(ctx, b.api, b.ws, b.policy, s.conn.Addr, b.cfg.toggles)
			return nil
		}},
	}
	for _, p := range phases {
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

// peer opens a nettest peer closed at cleanup.
func (b *bench) peer() (*nettest.Peer, error) {
	p, err := nettest.OpenPeer()
	if err != nil {
		return nil, err
	}
	b.peers = append(b.peers, p)
	return p, nil
}

// cleanup deletes the workspace, stops the node and ctrl, releases what the
// node would still hold, removes the peers and the NAT, and the temporary
// directory.
func (b *bench) cleanup() error {
	var errs []error
	if b.ws != nil && b.api != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if err := b.api.deleteWorkspace(ctx, b.ws.id); err != nil {
			errs = append(errs, fmt.Errorf("delete workspace: %w", err))
		}
		cancel()
	}
	if b.node != nil {
		if err := b.node.stop(); err != nil {
			errs = append(errs, err)
		}
		root := filepath.Join(b.tmp, "node")
		if l, _ := sandbox.Leaks(root); len(l) > 0 {
			logf("cleanup: the node left %d things; sandbox.Cleanup", len(l))
			if err := sandbox.Cleanup(root); err != nil {
				errs = append(errs, fmt.Errorf("sandbox.Cleanup: %w", err))
			}
		}
	}
	if b.srv != nil {
		if err := b.srv.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if b.unNAT != nil {
		if err := b.unNAT(); err != nil {
			errs = append(errs, fmt.Errorf("remove the NAT: %w", err))
		}
	}
	for _, p := range b.peers {
		if err := p.Close(); err != nil {
			errs = append(errs, err)
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
	return errors.Join(errs...)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
