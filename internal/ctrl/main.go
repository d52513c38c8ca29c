package ctrl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kibotos/kibotos/internal/buildinfo"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/node/daemon"
	"github.com/kibotos/kibotos/internal/node/enroll"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/retention"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/sqlite"
)

// Options are the command-line settings of kibotos-ctrl.
type Options struct {
	Dev           bool
	DataDir       string
	Listen        string
	MetricsListen string
	TLSCert       string
	TLSKey        string
	ClientCA      string
	Store         string
	AllowRanges   string
	LogLevel      string
	Hosts         string
	GuestBinary   string
	Busybox       string
	NoNode        bool
	CommandWait   time.Duration
	NodeGrace     time.Duration
	CAKey         string
	NodeCertValid time.Duration
	DataPlaneURL  string
	// CommandRetention and DeletedRetention: internal/retention.
	CommandRetention, DeletedRetention time.Duration
}

// Main runs kibotos-ctrl with args (without the program name) and returns
// the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "backup" {
		return backupMain(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("kibotos-ctrl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: kibotos-ctrl [flags]   (serve the API)\n       kibotos-ctrl backup -h     (an online copy of the SQLite store)\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var o Options
	fs.BoolVar(&o.Dev, "dev", false, "single-machine mode: SQLite under --data-dir and a development PKI in DIR/pki, created on first start")
	fs.StringVar(&o.DataDir, "data-dir", "", "directory for the SQLite database and the development PKI (required with --dev)")
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:7443", "address of the HTTPS API listener")
	fs.StringVar(&o.MetricsListen, "metrics-listen", "", "address of the Prometheus /metrics listener (plain HTTP); empty disables it")
	fs.StringVar(&o.TLSCert, "tls-cert", "", "server certificate (PEM); with --dev defaults to DIR/pki/server.pem")
	fs.StringVar(&o.TLSKey, "tls-key", "", "server private key (PEM); with --dev defaults to DIR/pki/server-key.pem")
	fs.StringVar(&o.ClientCA, "client-ca", "", "operator CA (PEM): only client certificates it issued may call the API; with --dev defaults to DIR/pki/ca.pem")
	fs.StringVar(&o.Store, "store", "", "a SQLite file path, or a postgres:// URL (its parameters: pool_max_conns, pool_acquire_timeout, connect_timeout, application_name, statement_timeout, ...; docs/operations.md, Production deployment); with --dev defaults to DIR/ctrl.db")
	fs.StringVar(&o.AllowRanges, "allow-endpoint-ranges", "", "comma-separated address ranges that Egress and Resolver endpoints may use although they are special-purpose (e.g. 127.0.0.0/8,::1); default none")
	fs.StringVar(&o.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.Hosts, "dev-hosts", "", "with --dev: extra comma-separated names and addresses for the server certificate")
	fs.StringVar(&o.GuestBinary, "guest-binary", "", "with --dev: the static kibotos-guest for the embedded node (default: kibotos-guest next to this binary)")
	fs.StringVar(&o.Busybox, "busybox", os.Getenv("KIBOTOS_BUSYBOX"), "with --dev: the static busybox the embedded node builds its default template from (default: $KIBOTOS_BUSYBOX, else /bin/busybox of Debian's busybox-static)")
	fs.BoolVar(&o.NoNode, "dev-no-node", false, "with --dev: do not run the embedded node agent")
	fs.DurationVar(&o.CommandWait, "command-wait", time.Minute, "how long StopWorkspace and DeleteWorkspace wait for completion before answering a retryable unavailable (TIMED_OUT)")
	fs.StringVar(&o.CAKey, "ca-key", "", "private key of --client-ca (PEM): lets ctrl sign node certificates at enrollment (EnrollmentService); with --dev defaults to DIR/pki/ca-key.pem")
	fs.DurationVar(&o.NodeCertValid, "node-cert-validity", pki.DefaultNodeCertValidity, "validity of node certificates issued at enrollment")
	fs.DurationVar(&o.NodeGrace, "node-grace", 15*time.Second, "how long a node may stay silent before its workspaces turn UNKNOWN")
	fs.StringVar(&o.DataPlaneURL, "data-plane-url", "", "public URL of the data plane, returned with every data-plane session (https://host[:port]); with --dev defaults to https://LISTEN")
	fs.DurationVar(&o.CommandRetention, "command-retention", retention.DefaultRetention, "how long a completed command record (what a resent command ID replays) is kept before it is pruned; at least 24h")
	fs.DurationVar(&o.DeletedRetention, "deleted-retention", retention.DefaultRetention, "how long a Workspace or Volume whose deletion completed stays readable before its row is pruned; at least 24h")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kibotos-ctrl: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	for flag, d := range map[string]time.Duration{"command-retention": o.CommandRetention, "deleted-retention": o.DeletedRetention} {
		if err := retention.Check(flag, d); err != nil {
			fmt.Fprintf(stderr, "kibotos-ctrl: %v\n", err)
			return 2
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.LogLevel)); err != nil {
		fmt.Fprintf(stderr, "kibotos-ctrl: --log-level: %v\n", err)
		return 2
	}
	if err := o.absPaths(); err != nil {
		fmt.Fprintf(stderr, "kibotos-ctrl: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log, stdout); err != nil {
		log.Error("kibotos-ctrl failed", "error", err.Error())
		return 1
	}
	return 0
}

// absPaths makes every path of o absolute once, at start-up, so that a
// relative --data-dir (scripts/dev.sh passes .data) means the same files
// wherever they are used: the embedded node puts its state directory into
// overlayfs options, and the printed export line must work from any
// directory. A SQLite "file:" URI is left as given.
func (o *Options) absPaths() error {
	paths := []*string{&o.DataDir, &o.TLSCert, &o.TLSKey, &o.ClientCA, &o.CAKey, &o.GuestBinary, &o.Busybox}
	if storeKind(o.Store) == "sqlite" && !strings.HasPrefix(o.Store, "file:") && o.Store != ":memory:" {
		paths = append(paths, &o.Store)
	}
	return daemon.AbsPaths(paths...)
}

func run(ctx context.Context, o Options, log *slog.Logger, stdout io.Writer) error {
	if o.Dev {
		if o.DataDir == "" {
			return errors.New("--dev needs --data-dir")
		}
		if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
			return err
		}
		var hosts []string
		if o.Hosts != "" {
			hosts = strings.Split(o.Hosts, ",")
		}
		if host, _, err := net.SplitHostPort(o.Listen); err == nil && host != "" && host != "0.0.0.0" && host != "::" {
			hosts = append(hosts, host)
		}
		p, err := pki.EnsureDev(o.DataDir, hosts)
		if err != nil {
			return fmt.Errorf("development PKI: %w", err)
		}
		o.TLSCert = orDefault(o.TLSCert, p.Server)
		o.TLSKey = orDefault(o.TLSKey, p.ServerKey)
		o.ClientCA = orDefault(o.ClientCA, p.CA)
		o.CAKey = orDefault(o.CAKey, p.CAKey)
		o.Store = orDefault(o.Store, filepath.Join(o.DataDir, "ctrl.db"))
	}
	var node daemon.Config
	if o.Dev && !o.NoNode {
		// The embedded node's machine checks run before serving: a ctrl
		// whose node cannot run workspaces would accept creates that
		// never complete.
		var err error
		if node, err = embeddedNodeConfig(o); err != nil {
			return err
		}
		if node, err = daemon.Preflight(node); err != nil {
			return fmt.Errorf("the embedded node cannot run workspaces on this machine (--dev-no-node serves the API without them): %w", err)
		}
	}
	if o.TLSCert == "" || o.TLSKey == "" || o.ClientCA == "" || o.Store == "" {
		return errors.New("--tls-cert, --tls-key, --client-ca and --store are required without --dev")
	}
	allow, err := netguard.ParseAllowList(o.AllowRanges)
	if err != nil {
		return fmt.Errorf("--allow-endpoint-ranges: %w", err)
	}
	tlsc, err := pki.ServerConfig(o.TLSCert, o.TLSKey, o.ClientCA)
	if err != nil {
		return err
	}
	var issuer *pki.Issuer
	if o.CAKey != "" {
		if issuer, err = pki.LoadIssuer(o.ClientCA, o.CAKey); err != nil {
			return fmt.Errorf("--ca-key: %w", err)
		}
	}
	dataPlaneURL := o.DataPlaneURL
	if dataPlaneURL == "" && o.Dev {
		dataPlaneURL = "https://" + o.Listen
	}
	if dataPlaneURL != "" {
		if u, err := url.Parse(dataPlaneURL); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return errors.New("--data-plane-url must be an https URL without credentials, query or fragment")
		}
	}
	st, err := OpenStore(ctx, o.Store)
	if err != nil {
		return err
	}
	defer st.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := New(ctx, Config{
		Store: st, Checker: &netguard.Checker{Allow: allow}, Logger: log,
		SourceRevision: buildinfo.Revision(), Registry: reg, WaitBound: o.CommandWait, NodeGrace: o.NodeGrace,
		Issuer: issuer, NodeCertValidity: o.NodeCertValid, DataPlaneURL: dataPlaneURL,
		CommandRetention: o.CommandRetention, DeletedRetention: o.DeletedRetention,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return err
	}
	if o.MetricsListen != "" {
		mln, err := net.Listen("tcp", o.MetricsListen)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", srv.MetricsHandler())
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = ms.Serve(mln) }()
		defer ms.Close()
	}
	log.Info("kibotos-ctrl serving", "listen", ln.Addr().String(), "store", storeKind(o.Store), "revision", buildinfo.Revision())
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln, tlsc) }()

	// The embedded node of --dev: ctrl prints its settings only once the
	// node has registered, so that the first command pasted after them
	// finds workspace.create; a node that stops with an error stops ctrl,
	// since workspaces could no longer run.
	nodeErr := make(chan error, 1)
	embedded := o.Dev && !o.NoNode
	if embedded {
		go func() {
			err := runEmbeddedNode(ctx, o, node, srv, ln.Addr().String(), log)
			if err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("the embedded node agent stopped; workspaces cannot run on this machine: %w", err))
			}
			nodeErr <- err
		}()
	} else {
		nodeErr <- nil
	}
	if o.Dev {
		if embedded && !waitReady(ctx, srv) {
			return finish(ctx, served, nodeErr, log)
		}
		p := pki.DevPathsIn(o.DataDir)
		fmt.Fprintf(stdout, "kibotos-ctrl is serving on https://%s\n", ln.Addr())
		fmt.Fprintf(stdout, "To call it (kibo, buf curl, curl):\n  export KIBO_ENDPOINT=https://%s KIBO_CA=%s KIBO_CERT=%s KIBO_KEY=%s%s\n",
			ln.Addr(), shellQuote(p.CA), shellQuote(p.Operator), shellQuote(p.OperatorKey), kiboPath())
	}
	return finish(ctx, served, nodeErr, log)
}

// waitReady waits until a node has registered with srv, and reports false
// when ctx ends first.
func waitReady(ctx context.Context, srv *Server) bool {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !srv.HasNodes() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// finish waits for the server and the embedded node to stop, and returns
// why ctrl stopped: the server's error, or the cause that cancelled ctx
// (the embedded node's failure), or nil on a requested stop.
func finish(ctx context.Context, served, nodeErr <-chan error, log *slog.Logger) error {
	err := <-served
	<-nodeErr
	if cause := context.Cause(ctx); err == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	log.Info("kibotos-ctrl stopped")
	return err
}

// runEmbeddedNode runs the node agent of --dev in this process, with the
// same code as kibotos-node: on first start it enrolls with a token bound to
// node "local" (certificate and key in DIR/node/pki), then talks to this ctrl
// over loopback mTLS with state under DIR/node.
func runEmbeddedNode(ctx context.Context, o Options, node daemon.Config, srv *Server, addr string, log *slog.Logger) error {
	p := pki.DevPathsIn(o.DataDir)
	host, port, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	endpoint := "https://" + net.JoinHostPort(host, port)
	dir := filepath.Join(node.StateDir, "pki")
	token := ""
	if cert, keyPath := enroll.Paths(dir); !fileExists(cert) {
		// The command ID follows the node's key: a restart before the
		// certificate was saved gets the same token back (and the same
		// certificate), a new key a new token.
		signer, err := pki.EnsureKey(keyPath)
		if err != nil {
			return err
		}
		h, err := pki.PublicKeyHash(signer.Public())
		if err != nil {
			return err
		}
		if token, err = srv.EnrollmentToken(ctx, fmt.Sprintf("kibotos-dev-node-%x", h[:8]), "local"); err != nil {
			return fmt.Errorf("enrollment token for the embedded node: %w", err)
		}
	}
	cert, key, err := enroll.Ensure(ctx, enroll.Options{Endpoint: endpoint, CA: p.CA, Dir: dir, Token: token, NodeID: "local", Log: log.With("component", "node")})
	if err != nil {
		return err
	}
	nlog := log.With("component", "node")
	hc, renewer, err := enroll.Client(endpoint, p.CA, cert, key, nlog)
	if err != nil {
		return err
	}
	go renewer.Run(ctx)
	node.NodeID, node.Endpoint, node.HTTP, node.Log = "local", endpoint, hc, nlog
	return daemon.Run(ctx, node)
}

// embeddedNodeConfig is the machine side of the embedded node's
// configuration: state under DIR/node, the guest next to this binary unless
// --guest-binary says otherwise, --busybox and --allow-endpoint-ranges.
func embeddedNodeConfig(o Options) (daemon.Config, error) {
	allow, err := netguard.ParseAllowList(o.AllowRanges)
	if err != nil {
		return daemon.Config{}, fmt.Errorf("--allow-endpoint-ranges: %w", err)
	}
	guest := o.GuestBinary
	if guest == "" {
		exe, err := os.Executable()
		if err != nil {
			return daemon.Config{}, err
		}
		guest = filepath.Join(filepath.Dir(exe), "kibotos-guest")
	}
	// The embedded node dials what ctrl lets Egresses and Resolvers name:
	// one --allow-endpoint-ranges governs both (and the node's backstop).
	return daemon.Config{StateDir: filepath.Join(o.DataDir, "node"), GuestBinary: guest, Busybox: o.Busybox,
		AllowEndpointRanges: allow}, nil
}

// kiboPath returns " PATH=DIR:$PATH" for the export line when kibo is next
// to this binary (bin/ of scripts/build.sh), so that the README's kibo
// commands work from any directory; otherwise "".
func kiboPath() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	dir := filepath.Dir(exe)
	if !fileExists(filepath.Join(dir, "kibo")) {
		return ""
	}
	return " PATH=" + shellQuote(dir) + ":$PATH"
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+,=@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// OpenStore opens a PostgreSQL store for a postgres:// or postgresql:// URL
// and a SQLite store for anything else (a file path).
func OpenStore(ctx context.Context, spec string) (store.Store, error) {
	if storeKind(spec) == "postgres" {
		return postgres.Open(ctx, spec)
	}
	return sqlite.Open(ctx, spec)
}

func storeKind(spec string) string {
	if strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://") {
		return "postgres"
	}
	return "sqlite"
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}
