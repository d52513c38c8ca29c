package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/node/ctrlset"
	"github.com/kibotos/kibotos/internal/node/enroll"
)

// Main runs kibotos-node with args (without the program name) and returns
// the exit code.
func Main(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("kibotos-node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg                Config
		ca, cert, key, lvl string
		token, tokenFile   string
		allow, resolver    string
		ctrls              ctrlset.Flag
	)
	fs.Var(&ctrls, "ctrl", "ctrl's URL, e.g. https://ctrl.example:7443 (required); several replicas: comma-separated or the flag repeated, and a host name resolving to several addresses counts as several; the node uses one at a time and moves to the next when it fails")
	fs.StringVar(&ca, "ca", "", "CA that signed ctrl's server certificate (PEM)")
	fs.StringVar(&cert, "cert", "", "this node's certificate (PEM, OU \"node\", issued by ctrl's CA); default: STATE-DIR/pki/node.pem, obtained with --enroll-token")
	fs.StringVar(&key, "key", "", "this node's private key (PEM); default: STATE-DIR/pki/node-key.pem")
	fs.StringVar(&token, "enroll-token", "", "enrollment token (kibo enrollment create), used once when STATE-DIR/pki holds no certificate yet; also $KIBOTOS_ENROLL_TOKEN")
	fs.StringVar(&tokenFile, "enroll-token-file", "", "file holding the enrollment token (keeps it out of the process list)")
	fs.StringVar(&cfg.NodeID, "node-id", "", "the node's ID; must equal the certificate's common name (default: the common name; at enrollment: the token's node ID or the host name)")
	fs.StringVar(&cfg.StateDir, "state-dir", "/var/lib/kibotos/node", "directory for writable layers, execution state and templates")
	fs.StringVar(&cfg.GuestBinary, "guest-binary", "", "the static kibotos-guest (default: kibotos-guest next to this binary)")
	fs.StringVar(&cfg.Busybox, "busybox", os.Getenv("KIBOTOS_BUSYBOX"), "the static busybox the default template is built from (default: $KIBOTOS_BUSYBOX, else /bin/busybox of Debian's busybox-static)")
	fs.Uint64Var(&cfg.MemoryMiB, "memory-mib", 0, "memory offered to workspaces (default: 80% of MemTotal)")
	fs.Uint64Var(&cfg.CPUMillis, "cpu-millis", 0, "CPU offered to workspaces (default: every CPU)")
	fs.Uint64Var(&cfg.MemoryBudgetMiB, "host-memory-budget-mib", 0, "host memory budget: what the workspaces together may really use; at 95% of it ctrl stops workspaces on this node (default: --memory-mib)")
	fs.Float64Var(&cfg.MemoryOvercommitRatio, "memory-overcommit-ratio", 0, "this node's memory overcommit ratio, from 1 to 4: placement may admit workspaces whose memory adds up to --memory-mib times it; a ratio set with kibo node overcommit wins (default: the fleet's default, kibo overcommit)")
	io := sandbox.DefaultIOLimits()
	cfg.IO = &io
	fs.Uint64Var(&io.ReadBytesPerSec, "workspace-io-read-bps", io.ReadBytesPerSec, "each workspace's cap on reads from its writable layer, bytes per second (0: none)")
	fs.Uint64Var(&io.WriteBytesPerSec, "workspace-io-write-bps", io.WriteBytesPerSec, "each workspace's cap on writes to its writable layer, bytes per second (0: none; buffered writes are not throttled on cgroup v1)")
	fs.Uint64Var(&io.ReadIOPS, "workspace-io-read-iops", io.ReadIOPS, "each workspace's cap on read operations per second on its writable layer (0: none)")
	fs.Uint64Var(&io.WriteIOPS, "workspace-io-write-iops", io.WriteIOPS, "each workspace's cap on write operations per second on its writable layer (0: none)")
	fs.StringVar(&allow, "allow-endpoint-ranges", "", "comma-separated CIDR prefixes (or addresses) of special-purpose ranges workspaces may reach directly and Egress/Resolver endpoints may be in, e.g. 10.20.0.0/16 for an internal proxy; the kernel backstop admits them too (loopback and this host's own addresses never)")
	fs.StringVar(&resolver, "resolver", "", "IP:port of the DNS server the node resolves Egress and Resolver host names with (default: the system's resolver)")
	fs.StringVar(&lvl, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(lvl)); err != nil {
		fmt.Fprintf(stderr, "kibotos-node: --log-level: %v\n", err)
		return 2
	}
	cfg.Log = slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := CheckOvercommitRatio(cfg.MemoryOvercommitRatio); err != nil {
		fmt.Fprintf(stderr, "kibotos-node: %v\n", err)
		return 2
	}
	var err error
	if cfg.AllowEndpointRanges, err = netguard.ParseAllowList(allow); err != nil {
		fmt.Fprintf(stderr, "kibotos-node: --allow-endpoint-ranges: %v\n", err)
		return 2
	}
	if cfg.Resolver, err = ParseResolver(resolver); err != nil {
		fmt.Fprintf(stderr, "kibotos-node: %v\n", err)
		return 2
	}
	if len(ctrls) == 0 || ca == "" {
		fmt.Fprintln(stderr, "kibotos-node: --ctrl and --ca are required")
		return 2
	}
	urls, err := ctrlset.Parse(ctrls)
	if err != nil {
		fmt.Fprintf(stderr, "kibotos-node: --ctrl: %v\n", err)
		return 2
	}
	if (cert == "") != (key == "") {
		fmt.Fprintln(stderr, "kibotos-node: --cert and --key go together")
		return 2
	}
	// Every path is made absolute once, here: the state directory ends up
	// in overlayfs mount options, which take no relative paths.
	if err := AbsPaths(&ca, &cert, &key, &tokenFile, &cfg.StateDir, &cfg.GuestBinary, &cfg.Busybox); err != nil {
		fmt.Fprintf(stderr, "kibotos-node: %v\n", err)
		return 2
	}
	if cfg.GuestBinary == "" {
		exe, err := os.Executable()
		if err != nil {
			cfg.Log.Error("find kibotos-guest", "error", err.Error())
			return 1
		}
		cfg.GuestBinary = filepath.Join(filepath.Dir(exe), "kibotos-guest")
	}
	// Refuse a machine that cannot run workspaces before enrolling it.
	if _, err := Preflight(cfg); err != nil {
		cfg.Log.Error("kibotos-node cannot run workspaces on this machine", "error", err.Error())
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cert == "" {
		if token == "" {
			token = os.Getenv("KIBOTOS_ENROLL_TOKEN")
		}
		if tokenFile != "" {
			b, err := os.ReadFile(tokenFile)
			if err != nil {
				fmt.Fprintf(stderr, "kibotos-node: --enroll-token-file: %v\n", err)
				return 2
			}
			token = strings.TrimSpace(string(b))
		}
		var err error
		cert, key, err = enroll.Ensure(ctx, enroll.Options{
			Endpoints: urls, CA: ca, Dir: filepath.Join(cfg.StateDir, "pki"), Token: token, NodeID: cfg.NodeID, Log: cfg.Log,
		})
		if err != nil {
			cfg.Log.Error("node certificate", "error", err.Error())
			return 1
		}
	}
	set, renewer, err := enroll.Clients(urls, nil, ca, cert, key, cfg.Log)
	if err != nil {
		cfg.Log.Error("load certificates", "error", err.Error())
		return 1
	}
	if cfg.NodeID == "" {
		cfg.NodeID = renewer.Holder.Current().Leaf.Subject.CommonName
	}
	cfg.Ctrl = set
	go renewer.Run(ctx)
	if err := Run(ctx, cfg); err != nil {
		cfg.Log.Error("kibotos-node failed", "error", err.Error())
		return 1
	}
	return 0
}
