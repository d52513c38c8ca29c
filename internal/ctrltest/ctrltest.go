// Package ctrltest starts a real ctrl server in-process, over TLS with the
// development PKI, for tests: the generated Connect clients talk to it over
// the network with the Connect, gRPC or gRPC-Web protocol.
package ctrltest

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/ctrl"
	"github.com/kibotos/kibotos/internal/dataplane"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/store/sqlite"
)

// PostgresEnv names the environment variable with the PostgreSQL URL tests
// use.
const PostgresEnv = "KIBOTOS_TEST_POSTGRES_URL"

// Env is a running server and what a test needs to call it.
type Env struct {
	URL   string
	PKI   pki.DevPaths
	Store store.Store
	// Log holds every log line the server wrote.
	Log *SyncBuffer
	// HTTP is an HTTP client presenting the operator certificate.
	HTTP *http.Client
	// Verifier verifies the data-plane tokens the server issues.
	Verifier *dataplane.Verifier
}

// Options tune New.
type Options struct {
	// Postgres selects the PostgreSQL store (the test is skipped, or fails in
	// CI, without KIBOTOS_TEST_POSTGRES_URL).
	Postgres bool
	// Allow is the endpoint allow-list; nil allows loopback.
	Allow []netip.Prefix
	// Resolver replaces the system resolver for endpoint checks.
	Resolver netguard.Resolver
	// Runtime, when set, runs a node agent with this runtime, connected to
	// the server over mTLS with a node certificate.
	Runtime agent.Runtime
	// NodeMemoryMiB and NodeCPUMillis are the node's capacity (defaults 8192
	// and 4000).
	NodeMemoryMiB, NodeCPUMillis uint64
	// NodeStorageBytes is the node's storage pool (default 100 GiB).
	NodeStorageBytes uint64
	// NodeFeatures are the features the node's Hello lists
	// (nodewire.Feature*); none by default.
	NodeFeatures []string
	// WaitBound bounds stop and delete waits (default one minute).
	WaitBound time.Duration
	// NodeGrace is how long a node may be silent (default 15s).
	NodeGrace time.Duration
	// Enrollment gives ctrl the development CA's key, so that
	// EnrollmentService and node enrollment are served.
	Enrollment bool
	// DataPlane advertises workspace.exec and workspace.filesystem, so that
	// data-plane sessions can be issued (ctrl.Config.DataPlaneForTests).
	DataPlane bool
}

// DataPlaneURL is the data-plane URL of every test server.
const DataPlaneURL = "https://data-plane.test:7443"

// OpenStore opens a fresh SQLite or PostgreSQL store for t.
func OpenStore(t testing.TB, pg bool) store.Store {
	t.Helper()
	if pg {
		url := os.Getenv(PostgresEnv)
		if url == "" {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not set; CI must run the PostgreSQL tests", PostgresEnv)
			}
			t.Skipf("%s is not set: skipping PostgreSQL test", PostgresEnv)
		}
		st, cleanup, err := pgtest.Open(context.Background(), url, postgres.Open)
		if err != nil {
			t.Fatalf("open postgres: %v", err)
		}
		t.Cleanup(func() {
			if err := cleanup(); err != nil {
				t.Errorf("drop test schema: %v", err)
			}
		})
		return st
	}
	st, err := sqlite.Open(context.Background(), t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// New starts a server for t; it stops when t ends.
func New(t testing.TB, o Options) *Env {
	t.Helper()
	dir := t.TempDir()
	p, err := pki.EnsureDev(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := OpenStore(t, o.Postgres)
	allow := o.Allow
	if allow == nil {
		allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	}
	logs := &SyncBuffer{}
	var issuer *pki.Issuer
	if o.Enrollment {
		if issuer, err = pki.LoadIssuer(p.CA, p.CAKey); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := ctrl.New(context.Background(), ctrl.Config{
		Issuer: issuer,
		Store:  st, Checker: &netguard.Checker{Allow: allow, Resolver: o.Resolver},
		Logger:         slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		SourceRevision: "test-revision", WaitBound: o.WaitBound, NodeGrace: o.NodeGrace,
		DataPlaneURL: DataPlaneURL, DataPlaneForTests: o.DataPlane,
	})
	if err != nil {
		t.Fatal(err)
	}
	tlsc, err := pki.ServerConfig(p.Server, p.ServerKey, p.CA)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ctx, ln, tlsc)
	}()
	t.Cleanup(func() { cancel(); <-done })
	e := &Env{URL: "https://" + ln.Addr().String(), PKI: p, Store: st, Log: logs, Verifier: srv.DataPlaneVerifier()}
	t.Cleanup(e.Verifier.Close)
	e.HTTP = e.Client(t, p.Operator, p.OperatorKey)
	if o.Runtime != nil {
		e.StartNode(t, "node-1", o)
	}
	return e
}

// StartNode runs a node agent with o.Runtime until t ends; it returns a
// function that stops it early.
func (e *Env) StartNode(t testing.TB, id string, o Options) (stop func()) {
	t.Helper()
	dir := t.TempDir()
	cert, key := dir+"/node.pem", dir+"/node-key.pem"
	if err := pki.IssueClient(e.PKI.CA, e.PKI.CAKey, id, pki.RoleNode, time.Hour, cert, key); err != nil {
		t.Fatal(err)
	}
	return e.StartNodeWith(t, id, cert, key, o)
}

// StartNodeWith runs a node agent with o.Runtime and the given node
// certificate until t ends; it returns a function that stops it early.
func (e *Env) StartNodeWith(t testing.TB, id, cert, key string, o Options) (stop func()) {
	t.Helper()
	mem, cpu := o.NodeMemoryMiB, o.NodeCPUMillis
	if mem == 0 {
		mem = 8192
	}
	if cpu == 0 {
		cpu = 4000
	}
	storage := o.NodeStorageBytes
	if storage == 0 {
		storage = 100 << 30
	}
	hc := e.Client(t, cert, key)
	hc.Timeout = 0 // the stream lives as long as the agent
	a := agent.New(agent.Config{
		NodeID: id, Endpoint: e.URL, HTTP: hc, Runtime: o.Runtime,
		Capacity: &nodev1.Capacity{MemoryMib: mem, CpuMillis: cpu, StorageBytes: storage, StoragePool: "default"},
		Features: o.NodeFeatures,
		Log:      slog.New(slog.NewJSONHandler(e.Log, nil)), Heartbeat: 200 * time.Millisecond,
		Templates: func() []*nodev1.TemplateInfo {
			return []*nodev1.TemplateInfo{{TemplateId: "default", Version: "test-1"}}
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// Client returns an HTTP/2 client that trusts the server and presents the
// given client certificate (none when certFile is "").
func (e *Env) Client(t testing.TB, certFile, keyFile string) *http.Client {
	t.Helper()
	tlsc, err := pki.ClientConfig(e.PKI.CA, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}, Timeout: 30 * time.Second}
}

// HTTP1Client is like Client over HTTP/1.1, as curl and browsers use Connect.
func (e *Env) HTTP1Client(t testing.TB, certFile, keyFile string) *http.Client {
	t.Helper()
	tlsc, err := pki.ClientConfig(e.PKI.CA, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	tlsc.NextProtos = []string{"http/1.1"}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tlsc, ForceAttemptHTTP2: false, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}}
}

// Protocols are the client options of each wire protocol and codec tests
// run their cases with.
var Protocols = map[string][]connect.ClientOption{
	"connect+proto": nil,
	"connect+json":  {connect.WithProtoJSON()},
	"grpc":          {connect.WithGRPC()},
	"grpc-web+json": {connect.WithGRPCWeb(), connect.WithProtoJSON()},
}

// Clients are the typed API clients.
type Clients struct {
	ServerInfo ctrlv1connect.ServerInfoServiceClient
	Egress     ctrlv1connect.EgressServiceClient
	Resolver   ctrlv1connect.ResolverServiceClient
	Workspace  ctrlv1connect.WorkspaceServiceClient
	Volume     ctrlv1connect.VolumeServiceClient
	Enrollment ctrlv1connect.EnrollmentServiceClient
	Session    ctrlv1connect.SessionServiceClient
}

// Clients returns typed clients over hc with opts.
func (e *Env) Clients(hc *http.Client, opts ...connect.ClientOption) Clients {
	return Clients{
		ServerInfo: ctrlv1connect.NewServerInfoServiceClient(hc, e.URL, opts...),
		Egress:     ctrlv1connect.NewEgressServiceClient(hc, e.URL, opts...),
		Resolver:   ctrlv1connect.NewResolverServiceClient(hc, e.URL, opts...),
		Workspace:  ctrlv1connect.NewWorkspaceServiceClient(hc, e.URL, opts...),
		Volume:     ctrlv1connect.NewVolumeServiceClient(hc, e.URL, opts...),
		Enrollment: ctrlv1connect.NewEnrollmentServiceClient(hc, e.URL, opts...),
		Session:    ctrlv1connect.NewSessionServiceClient(hc, e.URL, opts...),
	}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
