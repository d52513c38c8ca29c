package agent

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// The node's data service, served to ctrl on the node's data tunnels
// (internal/tunnel), never on the control stream: the data-plane services
// of each workspace's guest, at /w/WORKSPACE_ID/kibotos.guest.v1.SERVICE/METHOD.
// Every call is forwarded to the workspace's guest as it is, bytes for
// bytes, in both directions at once (bidirectional streams included): the
// node neither decodes nor buffers the guest's messages, it copies them
// under HTTP/2 flow control. What the guest sends is bounded where it is
// decoded, on ctrl (its per-message limit and header limit). Only the
// services in GuestServices are forwarded; the node serves those of
// NodeServices itself (logs.go), when its Runtime offers them; any other
// path is not found.

// ErrNotRunning is returned by Guests for a workspace the node does not
// run.
var ErrNotRunning = errors.New("the workspace does not run on this node")

// GuestServices are the guest services the node forwards.
var GuestServices = []string{
	"kibotos.guest.v1.ProcessService",
	"kibotos.guest.v1.FileService",
	"kibotos.guest.v1.PortService",
}

// Guests is implemented by a Runtime whose guests serve the data plane:
// the agent then forwards to them on its data tunnels.
type Guests interface {
	// GuestTransport returns the transport of workspaceID's guest data
	// service (HTTP/2; requests are sent as they are, to whatever host
	// they name); ErrNotRunning when the workspace does not run.
	GuestTransport(workspaceID string) (http.RoundTripper, error)
}

// DataPath is the path prefix of a workspace's services in the node's data
// service.
func DataPath(workspaceID string) string { return "/w/" + workspaceID }

// copyBuffers are the proxy's copy buffers: 256 KiB, so that a stream of
// large messages moves in few reads and writes (the default is 32 KiB).
var copyBuffers = &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(x []byte) { b.p.Put(&x) }

// guestKey carries the workspace of a forwarded request.
type guestKey struct{}

// NewDataHandler returns the node's data service over g.
func NewDataHandler(g Guests) http.Handler {
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "guest"
			pr.Out.Host = "guest"
		},
		Transport:     guestRouter{g},
		FlushInterval: -1, // streams: every write goes out at once
		BufferPool:    copyBuffers,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// ctrl answers both as unavailable, without this text.
			if errors.Is(err, ErrNotRunning) {
				http.Error(w, "the workspace does not run on this node", http.StatusServiceUnavailable)
				return
			}
			http.Error(w, "the workspace's guest cannot be reached", http.StatusBadGateway)
		},
	}
	// The node's own services (NodeServices), when g offers them.
	var local http.Handler
	if l, ok := g.(Logs); ok {
		_, local = nodev1connect.NewWorkspaceLogServiceHandler(newLogService(l), connect.WithCompression("gzip", nil, nil),
			connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage), connect.WithSendMaxBytes(protocol.MaxDataPlaneMessage))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := http.Handler(proxy)
		id, tail, ok := splitDataPath(r.URL.Path)
		if !ok && local != nil {
			id, tail, ok = splitServicePath(r.URL.Path, NodeServices)
			h = local
		}
		if !ok {
			http.NotFound(w, r)
			return
		}
		r2 := r.Clone(context.WithValue(r.Context(), guestKey{}, id))
		r2.URL.Path, r2.URL.RawPath = tail, ""
		h.ServeHTTP(w, r2)
	})
}

// NodeServices are the services the node serves itself on its data
// tunnels, at /w/WORKSPACE_ID/SERVICE/METHOD as the guests' are.
var NodeServices = []string{nodev1connect.WorkspaceLogServiceName}

// splitDataPath splits /w/ID/SERVICE/METHOD into ID and /SERVICE/METHOD,
// for the services of GuestServices only.
func splitDataPath(p string) (id, tail string, ok bool) { return splitServicePath(p, GuestServices) }

// splitServicePath splits /w/ID/SERVICE/METHOD into ID and
// /SERVICE/METHOD, for the services of services only.
func splitServicePath(p string, services []string) (id, tail string, ok bool) {
	rest, ok := strings.CutPrefix(p, "/w/")
	if !ok {
		return "", "", false
	}
	id, svcMethod, ok := strings.Cut(rest, "/")
	if !ok || id == "" {
		return "", "", false
	}
	svc, method, ok := strings.Cut(svcMethod, "/")
	if !ok || method == "" || strings.Contains(method, "/") {
		return "", "", false
	}
	for _, s := range services {
		if svc == s {
			return id, "/" + svcMethod, true
		}
	}
	return "", "", false
}

// guestRouter sends each request to its workspace's guest.
type guestRouter struct{ g Guests }

func (t guestRouter) RoundTrip(r *http.Request) (*http.Response, error) {
	id, _ := r.Context().Value(guestKey{}).(string)
	tr, err := t.g.GuestTransport(id)
	if err != nil {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, err
	}
	// The guest's call is over once its response is: closing the response
	// body ends the request too. Without that, a guest that answers before
	// the caller ends its requests (an error, a forward whose port refused)
	// would hold the proxy until the caller's next request, as the
	// transport waits for the request body to end before the stream is
	// done.
	ctx, cancel := context.WithCancel(r.Context())
	res, err := tr.RoundTrip(r.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	res.Body = &guestBody{ReadCloser: res.Body, cancel: cancel}
	return res, nil
}

// guestBody is a guest's response body whose Close ends the request.
type guestBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *guestBody) Close() error {
	b.cancel()
	return b.ReadCloser.Close()
}
