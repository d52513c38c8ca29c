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
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/api"
	"github.com/kibotos/kibotos/internal/apierr"
	"github.com/kibotos/kibotos/internal/catalog"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/enrollment"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/nodepeer"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/reconciler"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

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
	// enrollment; zero is one year.
	NodeCertValidity time.Duration
}

// Server is a configured control plane.
type Server struct {
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	health  *grpchealth.StaticChecker
	metrics *metrics
	recon   *reconciler.Reconciler
	enroll  *enrollment.Service
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
	key, err := cfg.Store.Secret(ctx, pageSecret, randomKey)
	if err != nil {
		return nil, fmt.Errorf("load page token key: %w", err)
	}
	pages := paging.NewCodec(key)
	engine := &command.Engine{Store: cfg.Store, Now: cfg.Now}

	s := &Server{cfg: cfg, log: log, metrics: newMetrics(cfg.Registry)}
	s.enroll = &enrollment.Service{Engine: engine, Store: cfg.Store, Pages: pages, Now: cfg.Now,
		Issuer: cfg.Issuer, CertValidity: cfg.NodeCertValidity}
	if cfg.Issuer != nil {
		if s.enroll.Key, err = cfg.Store.Secret(ctx, enrollment.SecretName, randomKey); err != nil {
			return nil, fmt.Errorf("load enrollment token key: %w", err)
		}
	}
	info := &api.ServerInfo{SourceRevision: cfg.SourceRevision,
		HasNodes: func() bool { return s.recon.MaxCapacity().MemoryMiB > 0 }, Enrollment: s.enroll.Available()}
	opts := connect.WithHandlerOptions(append(codecs(),
		connect.WithInterceptors(s.metrics.interceptor(log), apierr.NewInterceptor(log), decodeInterceptor(),
			api.RefuseUnservedFields(info.Capabilities)),
		connect.WithReadMaxBytes(MaxRequestBytes),
		connect.WithCompressMinBytes(CompressMinBytes),
	)...)

	mux := http.NewServeMux()
	s.recon = reconciler.New(reconciler.Config{Store: cfg.Store, Log: log, Now: cfg.Now, NodeGrace: cfg.NodeGrace})
	mux.Handle(ctrlv1connect.NewServerInfoServiceHandler(info, opts))
	mux.Handle(ctrlv1connect.NewEgressServiceHandler(api.NewEgresses(&catalog.Service[*ctrlv1.EgressSpec]{
		Type: api.EgressType(cfg.Checker), Engine: engine, Store: cfg.Store, Pages: pages, Now: cfg.Now,
	}), opts))
	mux.Handle(ctrlv1connect.NewResolverServiceHandler(api.NewResolvers(&catalog.Service[*ctrlv1.ResolverSpec]{
		Type: api.ResolverType(cfg.Checker), Engine: engine, Store: cfg.Store, Pages: pages, Now: cfg.Now,
	}), opts))
	mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(api.NewWorkspaces(&workspace.Service{
		Engine: engine, Store: cfg.Store, Pages: pages, Now: cfg.Now,
		Templates:   s.recon.Template,
		MaxCapacity: s.recon.MaxCapacity, Kick: s.recon.Kick, WaitBound: cfg.WaitBound,
	}), opts))
	mux.Handle(nodev1connect.NewNodeServiceHandler(s.recon, connect.WithInterceptors(apierr.NewInterceptor(log))))
	mux.Handle(ctrlv1connect.NewVolumeServiceHandler(&api.Volumes{}, opts))
	enrollments := api.NewEnrollments(s.enroll)
	mux.Handle(ctrlv1connect.NewEnrollmentServiceHandler(enrollments, opts))
	mux.Handle(nodev1connect.NewBootstrapServiceHandler(enrollments, opts))
	mux.Handle(nodev1connect.NewCertificateServiceHandler(enrollments, opts))

	services := []string{
		ctrlv1connect.ServerInfoServiceName, ctrlv1connect.WorkspaceServiceName,
		ctrlv1connect.EgressServiceName, ctrlv1connect.ResolverServiceName, ctrlv1connect.VolumeServiceName,
		ctrlv1connect.EnrollmentServiceName,
	}
	s.health = grpchealth.NewStaticChecker(services...)
	reflector := grpcreflect.NewStaticReflector(services...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	health := http.NewServeMux()
	health.Handle(grpchealth.NewHandler(s.health))

	s.handler = s.authenticate(mux, health)
	return s, nil
}

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

// authenticate verifies the Operator certificate of every API call against
// the client CA. gRPC health is served without a certificate, for load
// balancers and probes, and so is BootstrapService, whose enrollment token is
// the credential of a node that has no certificate yet.
func (s *Server) authenticate(api, health http.Handler) http.Handler {
	errw := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/"+grpchealth.HealthV1ServiceName+"/Check" {
			health.ServeHTTP(w, r)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/"+nodev1connect.BootstrapServiceName+"/") {
			api.ServeHTTP(w, r) // bodies are bounded by connect.WithReadMaxBytes
			return
		}
		role := pki.RoleOperator
		if strings.HasPrefix(r.URL.Path, "/"+nodev1connect.NodeServiceName+"/") ||
			strings.HasPrefix(r.URL.Path, "/"+nodev1connect.CertificateServiceName+"/") {
			role = pki.RoleNode
		}
		id, err := s.verifyPeer(r, role)
		if err == nil && role == pki.RoleNode {
			var h [32]byte
			if h, err = pki.PublicKeyHash(r.TLS.PeerCertificates[0].PublicKey); err == nil {
				r = r.WithContext(nodepeer.With(r.Context(), nodepeer.Peer{NodeID: id, KeyHash: h[:]}))
			}
		}
		if err != nil {
			s.metrics.rejected.Inc()
			s.log.WarnContext(r.Context(), "rejected client", "remote", r.RemoteAddr, "path", r.URL.Path, "reason", err.Error())
			ce := apierr.FromDetail(connect.CodeUnauthenticated, &ctrlv1.ErrorDetail{
				Reason:  ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED,
				Message: "a " + role + " certificate issued by this deployment's CA is required",
			})
			_ = errw.Write(w, r, ce)
			return
		}
		if r.ContentLength > MaxRequestBytes {
			_ = errw.Write(w, r, apierr.FromDetail(connect.CodeResourceExhausted, &ctrlv1.ErrorDetail{
				Reason:  ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT,
				Message: fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, MaxRequestBytes),
			}))
			return
		}
		api.ServeHTTP(w, r)
	})
}

// verifyPeer checks the client certificate against the client CA and the
// role the path needs: node certificates (OU "node") may only use
// NodeService, and NodeService needs one. It returns the certificate's
// common name.
func (s *Server) verifyPeer(r *http.Request, role string) (string, error) {
	if r.TLS == nil {
		return "", errors.New("not a TLS connection")
	}
	if len(r.TLS.PeerCertificates) == 0 {
		return "", errors.New("no client certificate")
	}
	pool, _ := r.Context().Value(clientCAsKey{}).(*x509.CertPool)
	if pool == nil {
		return "", errors.New("no client CA configured")
	}
	leaf := r.TLS.PeerCertificates[0]
	id := pki.IdentityOf(leaf)
	if (id.Role == pki.RoleNode) != (role == pki.RoleNode) {
		return "", errors.New("certificate role does not match the API")
	}
	if time.Now().After(leaf.NotAfter) {
		return "", errors.New("client certificate expired")
	}
	// The chain is verified once per connection: its certificates cannot
	// change while it lasts.
	ca, _ := r.Context().Value(connAuthKey{}).(*connAuth)
	if ca == nil {
		ca = &connAuth{}
	}
	ca.once.Do(func() { ca.err = pki.VerifyClientChain(r.TLS.PeerCertificates, pool) })
	return id.CommonName, ca.err
}

// connAuth caches the verification of a connection's client chain.
type connAuth struct {
	once sync.Once
	err  error
}

type connAuthKey struct{}

type clientCAsKey struct{}

// Serve serves the API on ln with TLS config tlsc (as built by
// pki.ServerConfig) until ctx is done, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener, tlsc *tls.Config) error {
	pool := tlsc.ClientCAs
	srv := &http.Server{
		Handler:           s.handler,
		TLSConfig:         TLSConfig(tlsc),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext: func(net.Listener) context.Context {
			return context.WithValue(context.Background(), clientCAsKey{}, pool)
		},
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	reconCtx, stopRecon := context.WithCancel(context.Background())
	reconDone := make(chan struct{})
	go func() {
		defer close(reconDone)
		if err := s.recon.Run(reconCtx); err != nil {
			s.log.Error("reconciler stopped", "error", err.Error())
		}
	}()
	defer func() { stopRecon(); <-reconDone }()
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.health.SetStatus("", grpchealth.StatusNotServing)
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdown)
	<-errc
	return err
}

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
