// Package ctrl wires the control plane: the store, the command engine, the
// API handlers, authentication, observability and the HTTPS listener.
package ctrl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/api"
	"github.com/kibotos/kibotos/internal/apierr"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/caller"
	"github.com/kibotos/kibotos/internal/catalog"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/dataplane"
	"github.com/kibotos/kibotos/internal/enrollment"
	"github.com/kibotos/kibotos/internal/expiration"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/lease"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/nodepeer"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/reconciler"
	"github.com/kibotos/kibotos/internal/retention"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/tunnel"
	"github.com/kibotos/kibotos/internal/volume"
	"github.com/kibotos/kibotos/internal/workspace"
)

// dataMessageBytes bounds a message of the data plane between ctrl and a
// guest, both ways (the guest's own bound).
const dataMessageBytes = 512 << 10

// MaxRequestBytes bounds every request body; larger bodies are refused
// before they are parsed.
const MaxRequestBytes = 4 << 20

// CompressMinBytes is the smallest response that is gzip-compressed for a
// client that accepts it. Compressing every answer cost a sixth of the
// server's CPU on lists of 100 objects (a page of about 30 KB takes ~0.15 ms
// to deflate); below this size the bytes saved are not worth it on the
// networks a control plane runs on. Pages of up to 1000 objects and other
// large answers are still compressed.
const CompressMinBytes = 64 << 10

// Config configures a Server.
type Config struct {
	// Store is the opened store.
	Store store.Store
	// Checker applies the endpoint checks (its Allow list is the operator's).
	Checker *netguard.Checker
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// SourceRevision is reported by GetServerInfo.
	SourceRevision string
	// Registry receives the server's metrics; nil uses a private registry.
	Registry *prometheus.Registry
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// WaitBound bounds how long StopWorkspace and DeleteWorkspace wait; zero
	// is one minute.
	WaitBound time.Duration
	// NodeGrace is how long a node may stay silent before its Workspaces
	// turn UNKNOWN; zero is 15 seconds.
	NodeGrace time.Duration
	// Issuer signs node certificates at enrollment; nil disables
	// EnrollmentService (nodes then need certificates issued by hand).
	Issuer *pki.Issuer
	// NodeCertValidity is the validity of node certificates issued at
	// enrollment and renewal; zero is pki.DefaultNodeCertValidity.
	NodeCertValidity time.Duration
	// DataPlaneURL is the public data plane's URL, returned with every
	// data-plane session (kibotos-ctrl --data-plane-url).
	DataPlaneURL string
	// DataPlaneForTests advertises workspace.exec and workspace.filesystem
	// although nothing serves them yet, so that tests can issue data-plane
	// sessions through the API. Tests only: no flag sets it.
	DataPlaneForTests bool
	// CommandRetention is how long a completed command record is kept,
	// DeletedRetention how long a Workspace or Volume whose deletion
	// completed is (internal/retention); zero is 7 days, less than 24 hours
	// is refused.
	CommandRetention, DeletedRetention time.Duration
}

// Server is a configured control plane.
type Server struct {
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	health  *grpchealth.StaticChecker
	served  []string // the services health reports on
	metrics *metrics
	recon   *reconciler.Reconciler
	expire  *expiration.Engine
	retain  *retention.Pruner
	// fleet is this replica's claim on the fleet lease: the fleet-wide
	// work (internal/lease) runs only while it holds it.
	fleet  *lease.Keeper
	enroll *enrollment.Service
	dplane *dataplane.Service
	// tunnels are the nodes' data connections to this ctrl.
	tunnels *tunnel.Registry
	// verifications counts client chain verifications (tests check that
	// there is one per connection).
	verifications atomic.Int64
}

// pageSecret names the page-token key in the store.
const pageSecret = "page-token-hmac"

// New builds a Server.
func New(ctx context.Context, cfg Config) (*Server, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Checker == nil {
		cfg.Checker = &netguard.Checker{}
	}
	retain := &retention.Pruner{Store: cfg.Store, Commands: cfg.CommandRetention, Deleted: cfg.DeletedRetention,
		KeepMethods: reconciler.RetainedMethods(), DeletedKinds: []store.ResourceKind{volume.KindDeleted}, Now: cfg.Now, Log: log}
	if err := retain.Validate(); err != nil {
		return nil, err
	}
	key, err := cfg.Store.Secret(ctx, pageSecret, randomKey)
	if err != nil {
		return nil, fmt.Errorf("load page token key: %w", err)
	}
	pages := paging.NewCodec(key)
	engine := &command.Engine{Store: cfg.Store, Now: cfg.Now}

	s := &Server{cfg: cfg, log: log, metrics: newMetrics(cfg.Registry), tunnels: &tunnel.Registry{Log: log}, retain: retain}
	registerStore(cfg.Registry, cfg.Store)
	adviseStore(ctx, log, cfg.Store)
	s.fleet = lease.New(lease.Config{Store: cfg.Store, Name: lease.Fleet, Log: log,
		OnAcquire: func(int64) { s.recon.Kick() }}) // the work it gates starts at once
	retain.Leader = s.fleet.IsHeld
	retain.Fence = func(ctx context.Context, tx store.Tx) error { return s.fleet.Check(ctx, tx) } // in each batch's transaction
	s.enroll = &enrollment.Service{Engine: engine, Store: cfg.Store, Pages: pages, Now: cfg.Now,
		Issuer: cfg.Issuer, CertValidity: cfg.NodeCertValidity}
	if cfg.Issuer != nil {
		if s.enroll.Key, err = cfg.Store.Secret(ctx, enrollment.SecretName, randomKey); err != nil {
			return nil, fmt.Errorf("load enrollment token key: %w", err)
		}
	}
	seed, err := cfg.Store.Secret(ctx, dataplane.SecretName, randomKey) // an Ed25519 seed
	if err != nil {
		return nil, fmt.Errorf("load data-plane token key: %w", err)
	}
	dpKey, err := dataplane.KeyFromSeed(seed)
	if err != nil {
		return nil, err
	}
	s.dplane = &dataplane.Service{Engine: engine, Store: cfg.Store, Key: dpKey, Endpoint: cfg.DataPlaneURL, Now: cfg.Now}
	info := &api.ServerInfo{SourceRevision: cfg.SourceRevision,
		HasNodes: func() bool { return s.recon.MaxCapacity().MemoryMiB > 0 }, Enrollment: s.enroll.Available(),
		DataPlaneForTests: cfg.DataPlaneForTests, Network: func() bool { return s.recon.ServesNetwork() },
		Volumes: func() bool { return s.recon.ServesVolumes() }}
	opts := connect.WithHandlerOptions(append(codecs(),
		connect.WithInterceptors(s.metrics.interceptor(log), apierr.NewInterceptor(log), decodeInterceptor(),
			api.RefuseUnservedFields(info.Capabilities)),
		connect.WithReadMaxBytes(MaxRequestBytes),
		connect.WithCompressMinBytes(CompressMinBytes),
	)...)

	mux := http.NewServeMux()
	// ArtifactService: Templates and Platforms; nodes fetch their bytes
	// through NodeService.FetchArtifact, and hear of new Platform defaults
	// and of reclamations through the reconciler.
	artifacts := &artifact.Service{Engine: engine, Store: cfg.Store, Now: cfg.Now}
	s.recon = reconciler.New(reconciler.Config{Store: cfg.Store, Log: log, Now: cfg.Now, NodeGrace: cfg.NodeGrace, Leader: s.fleet.IsHeld,
		Fence:         func(ctx context.Context, tx store.Tx) error { return s.fleet.Check(ctx, tx) },
		OnDenyNodeKey: s.endTunnelKey, OnEndDataPlane: s.endTunnelNode, FetchArtifact: artifacts.Fetch})
	// Every replica checks its tunnels again when another denies a key or
	// isolates a node (the hooks above notify), and every minute.
	s.tunnels.Check, s.tunnels.Notifier = s.checkTunnel, cfg.Store
	artifacts.OnPlatformDefault, artifacts.OnReclaimed = s.recon.PlatformChanged, s.recon.ArtifactReclaimed
	// An upload carries up to 4 MiB of bytes besides its command ID.
	mux.Handle(ctrlv1connect.NewArtifactServiceHandler(api.NewArtifacts(artifacts), opts,
		connect.WithReadMaxBytes(artifact.MaxUploadRequestBytes)))
	mux.Handle(ctrlv1connect.NewServerInfoServiceHandler(info, opts))
	// Updates of Egresses and Resolvers reach the running Workspaces that
	// use them through the reconciler; deleted Egresses reach every node.
	egresses := api.NewEgresses(&catalog.Service[*ctrlv1.EgressSpec]{
		Type: api.EgressType(cfg.Checker), Engine: engine, Store: cfg.Store, Pages: pages, Now: cfg.Now,
	})
	egresses.OnUpdate, egresses.OnDelete = s.recon.KickAll, s.recon.EgressDeleted
	mux.Handle(ctrlv1connect.NewEgressServiceHandler(egresses, opts))
	resolvers := api.NewResolvers(&catalog.Service[*ctrlv1.ResolverSpec]{
		Type: api.ResolverType(cfg.Checker), Engine: engine, Store: cfg.Store, Pages: pages, Now: cfg.Now,
	})
	resolvers.OnUpdate = s.recon.KickAll
	mux.Handle(ctrlv1connect.NewResolverServiceHandler(resolvers, opts))
	workspaces := &workspace.Service{
		Engine: engine, Store: cfg.Store, Pages: pages, Now: cfg.Now,
		Templates: s.recon.Template,
		ResolveTemplate: func(ctx context.Context, tx store.Tx, id, version string) (string, error) {
			return artifact.ResolveTemplate(ctx, tx, id, version, s.recon.Template)
		},
		MaxCapacity: s.recon.MaxCapacity, Kick: s.recon.KickAll, Admitted: s.recon.Admitted, WaitBound: cfg.WaitBound,
		PoolFree: volume.PoolFree,
	}
	// The expiration engine runs on every replica, not under the fleet
	// lease: a firing is fenced by its deterministic command ID already,
	// and a takeover (up to 4 s) would make the deadlines due meanwhile
	// that late (docs/operations.md).
	s.expire = &expiration.Engine{Store: cfg.Store, Fire: workspaces.FireExpiration, Log: log}
	wsHandler := api.NewWorkspaces(workspaces)
	wsHandler.Served = info.Capabilities
	mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(wsHandler, opts))
	// NodeService streams carry a node's Hello and full desired state, larger
	// than any other request, and no more: every message is bounded.
	mux.Handle(nodev1connect.NewNodeServiceHandler(s.recon, connect.WithInterceptors(apierr.NewInterceptor(log)),
		connect.WithReadMaxBytes(reconciler.MaxNodeMessageBytes), connect.WithSendMaxBytes(reconciler.MaxNodeMessageBytes)))
	mux.Handle(tunnel.Path, http.HandlerFunc(s.acceptTunnel))
	// The public data plane: Bearer tokens, forwarded over the nodes' data
	// tunnels.
	tunnelHTTP := &http.Client{Transport: s.tunnels}
	// The data plane is not compressed, on any hop: its bytes are a
	// process's output, files and forwarded connections, and gzip cost more
	// CPU than everything else on the path (docs/api.md).
	dataOpts := connect.WithHandlerOptions(opts, connect.WithCompression("gzip", nil, nil))
	toNode := connect.WithClientOptions(connect.WithGRPC(), connect.WithAcceptCompression("gzip", nil, nil),
		connect.WithReadMaxBytes(dataMessageBytes), connect.WithSendMaxBytes(dataMessageBytes))
	mux.Handle(ctrlv1connect.NewProcessServiceHandler(&api.Processes{Verifier: s.dplane.Verifier(), Store: cfg.Store,
		Guest: func(node, ws string) guestv1connect.ProcessServiceClient {
			return guestv1connect.NewProcessServiceClient(tunnelHTTP, tunnel.NodeURL(node)+agent.DataPath(ws), toNode)
		}}, dataOpts))
	// Forwarded bytes are mostly compressed or encrypted already: no gzip.
	mux.Handle(ctrlv1connect.NewPortForwardServiceHandler(&api.PortForwards{Verifier: s.dplane.Verifier(), Store: cfg.Store,
		Guest: func(node, ws string) guestv1connect.PortServiceClient {
			return guestv1connect.NewPortServiceClient(tunnelHTTP, tunnel.NodeURL(node)+agent.DataPath(ws), toNode)
		}}, dataOpts))
	mux.Handle(ctrlv1connect.NewFileServiceHandler(&api.Files{Verifier: s.dplane.Verifier(), Store: cfg.Store,
		Guest: func(node, ws string) guestv1connect.FileServiceClient {
			return guestv1connect.NewFileServiceClient(tunnelHTTP, tunnel.NodeURL(node)+agent.DataPath(ws), toNode)
		}}, dataOpts))
	mux.Handle(ctrlv1connect.NewWorkspaceLogServiceHandler(&api.WorkspaceLogs{Verifier: s.dplane.Verifier(), Store: cfg.Store,
		Node: func(node, ws string) nodev1connect.WorkspaceLogServiceClient {
			return nodev1connect.NewWorkspaceLogServiceClient(tunnelHTTP, tunnel.NodeURL(node)+agent.DataPath(ws), toNode)
		}}, dataOpts))
	mux.Handle(ctrlv1connect.NewVolumeServiceHandler(api.NewVolumes(&volume.Service{
		Engine: engine, Store: cfg.Store, Pages: pages, Now: cfg.Now,
		Connected: s.recon.VolumeNodes, Kick: s.recon.KickAll, WaitBound: cfg.WaitBound,
	}, info.Capabilities), opts))
	mux.Handle(ctrlv1connect.NewSessionServiceHandler(api.NewSessions(s.dplane), opts))
	enrollments := api.NewEnrollments(s.enroll)
	mux.Handle(ctrlv1connect.NewEnrollmentServiceHandler(enrollments, opts))
	mux.Handle(nodev1connect.NewBootstrapServiceHandler(enrollments, opts))
	mux.Handle(nodev1connect.NewCertificateServiceHandler(enrollments, opts))
	// NodeService (Operator API): its writes reach placement and the
	// nodes' streams through the reconciler.
	mux.Handle(ctrlv1connect.NewNodeServiceHandler(api.NewNodes(&fleet.Service{
		Engine: engine, Store: cfg.Store, Pages: pages, Now: cfg.Now,
		Connected:      s.recon.Connected,
		StopWorkspaces: workspaces.StopForDrain,
		EndKey:         s.recon.EndKey, EndDataPlane: s.recon.EndDataPlane, Changed: s.recon.FleetChanged,
	}), opts))

	services := []string{
		ctrlv1connect.ServerInfoServiceName, ctrlv1connect.WorkspaceServiceName,
		ctrlv1connect.EgressServiceName, ctrlv1connect.ResolverServiceName, ctrlv1connect.VolumeServiceName,
		ctrlv1connect.EnrollmentServiceName, ctrlv1connect.NodeServiceName, ctrlv1connect.SessionServiceName, ctrlv1connect.ProcessServiceName, ctrlv1connect.PortForwardServiceName, ctrlv1connect.WorkspaceLogServiceName,
		ctrlv1connect.FileServiceName,
		ctrlv1connect.ArtifactServiceName,
	}
	s.health = grpchealth.NewStaticChecker(services...)
	s.served = services
	reflector := grpcreflect.NewStaticReflector(services...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	health := http.NewServeMux()
	health.Handle(grpchealth.NewHandler(s.health))

	s.handler = s.authenticate(mux, health)
	return s, nil
}

// DataPlaneVerifier returns a Verifier of the data-plane tokens this server
// issues.
func (s *Server) DataPlaneVerifier() *dataplane.Verifier { return s.dplane.Verifier() }

// HasNodes reports whether a node has registered, so that workspaces can
// run.
func (s *Server) HasNodes() bool { return s.recon.MaxCapacity().MemoryMiB > 0 }

// Handler returns the HTTP handler of the API, for a TLS listener whose
// config came from TLSConfig.
func (s *Server) Handler() http.Handler { return s.handler }

// TLSConfig adapts a server tls.Config built by pki.ServerConfig: the
// handshake asks for a client certificate but verification happens in the
// handler, so a missing or foreign certificate is answered with a proper
// unauthenticated error instead of a broken handshake.
func TLSConfig(base *tls.Config) *tls.Config {
	c := base.Clone()
	c.ClientAuth = tls.RequestClientCert
	return c
}

// authenticate checks the client certificate of every API call: verified
// against the client CA (else unauthenticated), then its role, its only OU,
// against the one the path needs, exactly (else permission_denied):
// NodeService, CertificateService and the data tunnel need OU "node", every other API OU
// "operator"; a certificate with another OU, several or none calls nothing. A
// node's identity goes into the request's context as a nodepeer.Peer, an
// operator's certificate subject as its caller (internal/caller). gRPC
// health is served without a certificate, for load balancers and probes,
// and so is BootstrapService, whose enrollment token is the credential of a
// node that has no certificate yet, and the data plane's ProcessService,
// PortForwardService, FileService and WorkspaceLogService, whose
// credential is a data-plane token (api.Processes, api.PortForwards,
// api.Files and api.WorkspaceLogs check it).
func (s *Server) authenticate(api, health http.Handler) http.Handler {
	errw := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/"+grpchealth.HealthV1ServiceName+"/Check" {
			health.ServeHTTP(w, r)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/"+nodev1connect.BootstrapServiceName+"/") ||
			strings.HasPrefix(r.URL.Path, "/"+ctrlv1connect.ProcessServiceName+"/") ||
			strings.HasPrefix(r.URL.Path, "/"+ctrlv1connect.PortForwardServiceName+"/") ||
			strings.HasPrefix(r.URL.Path, "/"+ctrlv1connect.WorkspaceLogServiceName+"/") ||
			strings.HasPrefix(r.URL.Path, "/"+ctrlv1connect.FileServiceName+"/") {
			api.ServeHTTP(w, r) // bodies are bounded by connect.WithReadMaxBytes
			return
		}
		role := pki.RoleOperator
		if strings.HasPrefix(r.URL.Path, "/"+nodev1connect.NodeServiceName+"/") ||
			strings.HasPrefix(r.URL.Path, "/"+nodev1connect.CertificateServiceName+"/") || r.URL.Path == tunnel.Path {
			role = pki.RoleNode
		}
		auth, err := s.verifyPeer(r)
		if err != nil {
			s.metrics.rejected.Inc()
			s.log.WarnContext(r.Context(), "rejected client", "remote", r.RemoteAddr, "path", r.URL.Path, "reason", err.Error())
			_ = errw.Write(w, r, apierr.FromDetail(connect.CodeUnauthenticated, &ctrlv1.ErrorDetail{
				Reason:  ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED,
				Message: "this API needs a client certificate issued by this deployment's CA, with OU " + strconv.Quote(role),
			}))
			return
		}
		if auth.id.Role != role {
			s.metrics.denied.Inc()
			s.log.WarnContext(r.Context(), "refused client role", "remote", r.RemoteAddr, "path", r.URL.Path,
				"common_name", auth.id.CommonName, "serial", auth.id.Serial, "ou", auth.id.OUs, "required_ou", role)
			_ = errw.Write(w, r, apierr.FromDetail(connect.CodePermissionDenied, &ctrlv1.ErrorDetail{
				Reason:  ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED,
				Message: "this API needs a certificate with OU " + strconv.Quote(role) + "; this one has " + describeOUs(auth.id.OUs),
			}))
			return
		}
		if role == pki.RoleNode {
			r = r.WithContext(nodepeer.With(r.Context(), nodepeer.Peer{NodeID: auth.id.CommonName, KeyHash: auth.keyHash}))
		} else {
			r = r.WithContext(caller.With(r.Context(), auth.subject))
		}
		if r.ContentLength > maxRequestBytes(r.URL.Path) {
			_ = errw.Write(w, r, apierr.FromDetail(connect.CodeResourceExhausted, &ctrlv1.ErrorDetail{
				Reason:  ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT,
				Message: fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, maxRequestBytes(r.URL.Path)),
			}))
			return
		}
		api.ServeHTTP(w, r)
	})
}

// maxRequestBytes is the largest request body of path: MaxRequestBytes,
// and artifact.MaxUploadRequestBytes for UploadArtifactContent.
func maxRequestBytes(path string) int64 {
	if path == ctrlv1connect.ArtifactServiceUploadArtifactContentProcedure {
		return artifact.MaxUploadRequestBytes
	}
	return MaxRequestBytes
}

// describeOUs names a certificate's OUs for an error message: quoted, each
// cut to 64 bytes (they are the caller's text), or "no OU".
func describeOUs(ous []string) string {
	if len(ous) == 0 {
		return "no OU"
	}
	q := make([]string, len(ous))
	for i, ou := range ous {
		if len(ou) > 64 {
			ou = strings.ToValidUTF8(ou[:64], "") + "…"
		}
		q[i] = strconv.Quote(ou)
	}
	if len(q) == 1 {
		return "OU " + q[0]
	}
	return "OUs " + strings.Join(q, ", ") + " (a role is one OU)"
}

// verifyPeer returns what the connection's client certificate is, verified
// against the client CA: its chain is verified once per connection (see
// connAuth), its expiry on every request, since a connection may outlive
// its certificate.
func (s *Server) verifyPeer(r *http.Request) (*connAuth, error) {
	if r.TLS == nil {
		return nil, errors.New("not a TLS connection")
	}
	if len(r.TLS.PeerCertificates) == 0 {
		return nil, errors.New("no client certificate")
	}
	auth, _ := r.Context().Value(connAuthKey{}).(*connAuth)
	if auth == nil {
		auth = &connAuth{} // not served by Serve: verified for this request only
	}
	auth.once.Do(func() { auth.verify(r, &s.verifications) })
	if auth.err != nil {
		return nil, auth.err
	}
	if time.Now().After(auth.notAfter) {
		return nil, errors.New("client certificate expired")
	}
	return auth, nil
}

// connAuth is the verification of one connection's client certificate,
// made at its first request and kept for the connection's life: a TLS
// connection's certificates cannot change while it lasts (ctrl's TLS stack
// has no renegotiation and no post-handshake authentication). Serve puts a
// fresh one in every connection's context (http.Server.ConnContext), so
// the chain is verified once per connection, not once per request: a node's
// stream and an operator's HTTP/2 connection carry many requests.
type connAuth struct {
	once     sync.Once
	err      error // the chain does not verify
	id       pki.Identity
	notAfter time.Time
	keyHash  []byte // of the certificate's public key (pki.PublicKeyHash)
	subject  string // the certificate's subject (caller.Subject)
}

// verify verifies the chain of r's connection against the client CA in r's
// context and records who it names; count counts verifications.
func (a *connAuth) verify(r *http.Request, count *atomic.Int64) {
	count.Add(1)
	pool, _ := r.Context().Value(clientCAsKey{}).(*x509.CertPool)
	if pool == nil {
		a.err = errors.New("no client CA configured")
		return
	}
	chain := r.TLS.PeerCertificates
	if a.err = pki.VerifyClientChain(chain, pool); a.err != nil {
		return
	}
	h, err := pki.PublicKeyHash(chain[0].PublicKey)
	if err != nil {
		a.err = err
		return
	}
	a.id, a.notAfter, a.keyHash = pki.IdentityOf(chain[0]), chain[0].NotAfter, h[:]
	a.subject = caller.Subject(chain[0].Subject)
}

type connAuthKey struct{}

type clientCAsKey struct{}

// Serve serves the API on ln with TLS config tlsc (as built by
// pki.ServerConfig) until ctx is done, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener, tlsc *tls.Config) error {
	pool := tlsc.ClientCAs
	// requests is every request's base context: a shutdown lets unary
	// calls finish for shutdownGrace, then cancels what still runs (the
	// long-lived streams: process events, watches, logs), so that a
	// SIGTERM ends the process in seconds.
	requests, cancelRequests := context.WithCancel(context.Background())
	defer cancelRequests()
	srv := &http.Server{
		Handler:           s.handler,
		TLSConfig:         TLSConfig(tlsc),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext: func(net.Listener) context.Context {
			return context.WithValue(requests, clientCAsKey{}, pool)
		},
		// One verification of the client certificate per connection.
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, connAuthKey{}, &connAuth{})
		},
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	reconCtx, stopRecon := context.WithCancel(context.Background())
	// One attempt before the loops start, so that a single ctrl leads from
	// its first pass.
	if err := s.fleet.Try(ctx); err != nil {
		s.log.Warn("lease: first attempt", "lease", lease.Fleet, "error", err.Error())
	}
	// The node records before the first request: what needs a node is
	// served at once by a replica that just (re)started.
	if err := s.recon.LoadNodes(ctx); err != nil {
		s.log.Warn("load node records", "error", err.Error())
	}
	leaseDone := make(chan struct{})
	go func() { defer close(leaseDone); _ = s.fleet.Run(reconCtx) }()
	defer func() { stopRecon(); <-leaseDone }()
	reconDone := make(chan struct{})
	go func() {
		defer close(reconDone)
		if err := s.recon.Run(reconCtx); err != nil {
			s.log.Error("reconciler stopped", "error", err.Error())
		}
	}()
	defer func() { stopRecon(); <-reconDone }()
	expireDone := make(chan struct{})
	go func() { defer close(expireDone); _ = s.expire.Run(reconCtx) }()
	defer func() { stopRecon(); <-expireDone }()
	retainDone := make(chan struct{})
	go func() { defer close(retainDone); _ = s.retain.Run(reconCtx) }()
	defer func() { stopRecon(); <-retainDone }()
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); s.storeWatch(reconCtx) }()
	defer func() { stopRecon(); <-watchDone }()
	defer s.tunnels.Close() // Shutdown does not close hijacked connections
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.setHealth(grpchealth.StatusNotServing)
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Node streams end at once (the nodes reconnect, to another replica
	// when they know one); other requests get shutdownGrace to finish.
	srv.RegisterOnShutdown(s.recon.EndStreams)
	grace := time.AfterFunc(shutdownGrace, cancelRequests)
	defer grace.Stop()
	err := srv.Shutdown(shutdown)
	<-errc
	return err
}

// shutdownGrace is how long a shutdown lets requests in flight finish
// before it cancels them.
const shutdownGrace = 3 * time.Second

// MetricsHandler serves the Prometheus metrics, for a separate listener.
func (s *Server) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{})
}

// EnrollmentToken creates an enrollment token bound to nodeID, for a node
// that ctrl starts itself (the embedded node of --dev). commandID makes the
// call idempotent.
func (s *Server) EnrollmentToken(ctx context.Context, commandID, nodeID string) (string, error) {
	res, err := s.enroll.Create(ctx, &ctrlv1.CreateEnrollmentRequest{CommandId: commandID, NodeId: nodeID})
	if err != nil {
		return "", err
	}
	return res.GetToken(), nil
}

// endTunnelKey closes this replica's data tunnels opened with keyHash, a
// key just denied, and tells the other replicas (tunnel.KeyTopic).
func (s *Server) endTunnelKey(keyHash []byte) {
	s.tunnels.CloseKey(keyHash)
	s.cfg.Store.Notify(tunnel.KeyTopic(keyHash))
}

// endTunnelNode closes this replica's data tunnels of node, just
// isolated, and tells the other replicas (tunnel.NodeTopic).
func (s *Server) endTunnelNode(node string) {
	s.tunnels.CloseNode(node)
	s.cfg.Store.Notify(tunnel.NodeTopic(node))
}

// checkTunnel decides again whether an open data tunnel may stay
// (tunnel.Registry.Check): not when its key is denied or superseded
// (nodepeer.Admit, as at its opening), nor, when another replica's
// notification asked, when its node is isolated — the data plane ended
// there ends here too; the node's next tunnels are admitted and carry
// nothing while it stays isolated. A store that cannot be read keeps the
// tunnel: the data plane refuses calls then anyway.
func (s *Server) checkTunnel(ctx context.Context, node string, keyHash []byte, notified bool) error {
	var refused error
	err := s.cfg.Store.View(ctx, func(tx store.Tx) error {
		refused = nil
		n, err := tx.GetNode(ctx, node)
		if errors.Is(err, store.ErrNotFound) {
			n, err = nil, nil
		}
		if err != nil {
			return err
		}
		if err := (nodepeer.Peer{NodeID: node, KeyHash: keyHash}).Admit(ctx, tx, n); err != nil {
			if f, ok := fault.As(err); !ok || f.Kind != fault.KindPermissionDenied {
				return err
			}
			refused = err
			return nil
		}
		if !notified {
			return nil
		}
		_, rec, err := fleet.GetRecord(ctx, tx, node)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil
		case err != nil:
			return err
		}
		if rec.State == fleet.StateIsolated {
			refused = errors.New("node " + node + " is isolated")
		}
		return nil
	})
	if err != nil && ctx.Err() == nil { // at shutdown every check ends so: nothing to say
		s.log.Warn("data tunnel check: store unreadable; the tunnel stays", "node_id", node, "error", err.Error())
	}
	return refused
}

// acceptTunnel opens a node's data tunnel (internal/tunnel) after the same
// admission as its NodeService stream: a node certificate (authenticate),
// whose key is not denied and is its node's latest enrollment's
// (nodepeer.Admit).
func (s *Server) acceptTunnel(w http.ResponseWriter, r *http.Request) {
	errw := connect.NewErrorWriter()
	peer, ok := nodepeer.From(r.Context())
	if !ok {
		_ = errw.Write(w, r, apierr.FromDetail(connect.CodePermissionDenied, &ctrlv1.ErrorDetail{
			Reason: ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, Message: "a data tunnel needs a node certificate"}))
		return
	}
	err := s.cfg.Store.View(r.Context(), func(tx store.Tx) error {
		n, err := tx.GetNode(r.Context(), peer.NodeID)
		if errors.Is(err, store.ErrNotFound) {
			n, err = nil, nil
		}
		if err != nil {
			return err
		}
		return peer.Admit(r.Context(), tx, n)
	})
	if err != nil {
		s.log.WarnContext(r.Context(), "refused data tunnel", "node_id", peer.NodeID, "remote", r.RemoteAddr, "error", err.Error())
		_ = errw.Write(w, r, apierr.Convert(r.Context(), s.log, tunnel.Path, err))
		return
	}
	if err := s.tunnels.Accept(w, r, peer.NodeID, peer.KeyHash); err != nil {
		s.log.WarnContext(r.Context(), "data tunnel failed", "node_id", peer.NodeID, "error", err.Error())
	}
}
