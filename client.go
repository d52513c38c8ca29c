package kibotos

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// Client is a connection to one ctrl endpoint. Its fields are the generated
// Connect clients of every service of kibotos.ctrl.v1; they are safe for
// concurrent use.
type Client struct {
	// ServerInfoService is ServerInfoService: capabilities and source revision.
	ServerInfoService ctrlv1connect.ServerInfoServiceClient
	// WorkspaceService is the generated WorkspaceService client; Workspaces
	// is the layer above it.
	WorkspaceService ctrlv1connect.WorkspaceServiceClient
	// EgressService is EgressService.
	EgressService ctrlv1connect.EgressServiceClient
	// ResolverService is ResolverService.
	ResolverService ctrlv1connect.ResolverServiceClient
	// VolumeService is VolumeService.
	VolumeService ctrlv1connect.VolumeServiceClient
	// EnrollmentService is EnrollmentService (Operator API): node enrollment
	// tokens.
	EnrollmentService ctrlv1connect.EnrollmentServiceClient
	// NodeService is NodeService (Operator API): the fleet, drains,
	// isolations, retirements, overcommit and storage pool capacities.
	NodeService ctrlv1connect.NodeServiceClient
	// ArtifactService is ArtifactService (Operator API): publications,
	// defaults, retention and reclamation of Templates and Platforms.
	ArtifactService ctrlv1connect.ArtifactServiceClient
	// SessionService is SessionService: data-plane credentials.
	SessionService ctrlv1connect.SessionServiceClient
	// ProcessService is the data plane's ProcessService: its requests need
	// an Authorization: Bearer data-plane token (scope EXEC), which
	// Workspace.ExecCommand creates and sends itself.
	ProcessService ctrlv1connect.ProcessServiceClient
	// FileService is the data plane's FileService: its requests need an
	// Authorization: Bearer data-plane token (scope FILESYSTEM), which
	// Workspace.Files creates and sends itself.
	FileService ctrlv1connect.FileServiceClient

	endpoint   string
	httpClient *http.Client
	wait       backoff
	serverWait time.Duration
	retry      RetryPolicy
	info       infoCache
}

// Option configures NewClient.
type Option func(*options) error

type options struct {
	caFile, certFile, keyFile string
	tlsFiles                  bool
	tlsConfig                 *tls.Config
	httpClient                *http.Client
	connectOpts               []connect.ClientOption
	wait                      backoff
	serverWait                time.Duration
	retry                     RetryPolicy
}

// WithTLSFiles authenticates the server with the CA certificates in caFile
// (PEM) and presents the client certificate chain in certFile with its
// private key in keyFile (PEM). An empty caFile uses the system roots; empty
// certFile and keyFile present no client certificate (the ctrl API then
// answers unauthenticated); exactly one of them empty is an error.
func WithTLSFiles(caFile, certFile, keyFile string) Option {
	return func(o *options) error {
		o.caFile, o.certFile, o.keyFile, o.tlsFiles = caFile, certFile, keyFile, true
		return nil
	}
}

// WithTLSConfig uses cfg for the TLS connections to the endpoint. It
// excludes WithTLSFiles. NextProtos is set to h2 and http/1.1 when empty.
func WithTLSConfig(cfg *tls.Config) Option {
	return func(o *options) error {
		if cfg == nil {
			return errors.New("kibotos: WithTLSConfig: nil config")
		}
		o.tlsConfig = cfg
		return nil
	}
}

// WithHTTPClient sends every request with hc. The client is used as it is:
// it excludes WithTLSFiles and WithTLSConfig, and its transport decides the
// HTTP version (the gRPC protocol needs HTTP/2).
func WithHTTPClient(hc *http.Client) Option {
	return func(o *options) error {
		if hc == nil {
			return errors.New("kibotos: WithHTTPClient: nil client")
		}
		o.httpClient = hc
		return nil
	}
}

// WithConnectOptions adds Connect client options to every service client,
// such as connect.WithGRPC(), connect.WithProtoJSON() or interceptors. The
// default is the Connect protocol with the binary codec.
func WithConnectOptions(opts ...connect.ClientOption) Option {
	return func(o *options) error {
		o.connectOpts = append(o.connectOpts, opts...)
		return nil
	}
}

// WithWaitBackoff sets the polling interval of WaitWorkspaceCommand: the
// first poll waits initial, each later one waits 1.5 times longer, up to max.
// The defaults are 250ms and 5s.
func WithWaitBackoff(initial, max time.Duration) Option {
	return func(o *options) error {
		if initial <= 0 || max < initial {
			return fmt.Errorf("kibotos: WithWaitBackoff(%v, %v): need 0 < initial <= max", initial, max)
		}
		o.wait = backoff{initial: initial, max: max}
		return nil
	}
}

// WithServerWaitTimeout sets how long each server-side wait of
// WaitWorkspaceCommand lasts (GetWorkspaceCommandRequest.wait_timeout, used
// when the server offers workspace.command.wait), from 1ms to 60s. The
// default is 20s, below the 30s timeouts common in HTTP clients and
// proxies; an HTTP client given with WithHTTPClient must allow it.
func WithServerWaitTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d < minServerWait || d > maxServerWait {
			return fmt.Errorf("kibotos: WithServerWaitTimeout(%v): want %v to %v", d, minServerWait, maxServerWait)
		}
		o.serverWait = d
		return nil
	}
}

// WithDefaultRetryPolicy sets the policy under which the workspace layer
// (Client.Workspaces) resends its requests; WithRetryPolicy overrides it
// for one call. The default is the zero RetryPolicy (5 attempts).
func WithDefaultRetryPolicy(p RetryPolicy) Option {
	return func(o *options) error {
		o.retry = p
		return nil
	}
}

// NewClient returns a Client for the ctrl endpoint: an https:// URL such as
// "https://ctrl.example:7443", or host:port alone ("ctrl.example:7443"),
// which means https. It reads the TLS files at once, so a missing or
// malformed file is reported here; it does not contact the server.
func NewClient(endpoint string, opts ...Option) (*Client, error) {
	raw := endpoint
	if !strings.Contains(raw, "://") {
		raw = "https://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("kibotos: endpoint %q: %w", endpoint, err)
	}
	if u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("kibotos: endpoint %q: want https://host:port or host:port", endpoint)
	}
	o := options{wait: defaultWaitBackoff, serverWait: defaultServerWait}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	hc := o.httpClient
	switch {
	case hc != nil && (o.tlsFiles || o.tlsConfig != nil):
		return nil, errors.New("kibotos: WithHTTPClient excludes WithTLSFiles and WithTLSConfig")
	case o.tlsFiles && o.tlsConfig != nil:
		return nil, errors.New("kibotos: WithTLSFiles excludes WithTLSConfig")
	case hc == nil:
		cfg := o.tlsConfig
		if cfg == nil {
			cfg, err = loadTLS(o.caFile, o.certFile, o.keyFile)
			if err != nil {
				return nil, err
			}
		} else {
			cfg = cfg.Clone()
		}
		if len(cfg.NextProtos) == 0 {
			cfg.NextProtos = []string{"h2", "http/1.1"}
		}
		hc = &http.Client{Transport: newTransport(cfg)}
	}
	base := strings.TrimSuffix(u.String(), "/")
	return &Client{
		ServerInfoService: ctrlv1connect.NewServerInfoServiceClient(hc, base, o.connectOpts...),
		WorkspaceService:  ctrlv1connect.NewWorkspaceServiceClient(hc, base, o.connectOpts...),
		EgressService:     ctrlv1connect.NewEgressServiceClient(hc, base, o.connectOpts...),
		ResolverService:   ctrlv1connect.NewResolverServiceClient(hc, base, o.connectOpts...),
		VolumeService:     ctrlv1connect.NewVolumeServiceClient(hc, base, o.connectOpts...),
		EnrollmentService: ctrlv1connect.NewEnrollmentServiceClient(hc, base, o.connectOpts...),
		NodeService:       ctrlv1connect.NewNodeServiceClient(hc, base, o.connectOpts...),
		ArtifactService:   ctrlv1connect.NewArtifactServiceClient(hc, base, o.connectOpts...),
		SessionService:    ctrlv1connect.NewSessionServiceClient(hc, base, o.connectOpts...),
		ProcessService:    ctrlv1connect.NewProcessServiceClient(hc, base, o.connectOpts...),
		FileService:       ctrlv1connect.NewFileServiceClient(hc, base, append([]connect.ClientOption{noGzip}, o.connectOpts...)...),
		endpoint:          base,
		httpClient:        hc,
		wait:              o.wait,
		serverWait:        o.serverWait,
		retry:             o.retry,
	}, nil
}

// noGzip stops a client from asking for gzipped answers (a
// WithConnectOptions option given to NewClient can ask again): the
// FileService's answers are mostly file bytes, often compressed already,
// which gzip on the server and gunzip here slow down without shrinking.
var noGzip = connect.WithAcceptCompression("gzip", nil, nil)

// Endpoint returns the endpoint the Client calls.
func (c *Client) Endpoint() string { return c.endpoint }

// HTTPClient returns the HTTP client the Client sends requests with.
func (c *Client) HTTPClient() *http.Client { return c.httpClient }

// Close closes the idle connections of the Client's HTTP client. The Client
// remains usable; it opens new connections when needed.
func (c *Client) Close() { c.httpClient.CloseIdleConnections() }

// newTransport is an HTTP transport that negotiates HTTP/2 over TLS (and
// falls back to HTTP/1.1 only when the server does not offer h2).
func newTransport(cfg *tls.Config) *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       cfg,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   15 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConns:          16,
		ExpectContinueTimeout: time.Second,
	}
}

// loadTLS builds the client TLS configuration of WithTLSFiles.
func loadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("kibotos: read CA certificates: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kibotos: %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case certFile == "" && keyFile == "":
	case certFile == "" || keyFile == "":
		return nil, errors.New("kibotos: a client certificate needs both a certificate file and a key file")
	default:
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("kibotos: load client certificate %s with key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
