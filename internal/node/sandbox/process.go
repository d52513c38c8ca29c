package sandbox

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// The data plane's client on the node: connect-go (gRPC protocol) over
// HTTP/2 with prior knowledge on connections the node sends over the
// channel (protocol.NodeChannel.Dial), one channel connection per HTTP/2
// connection. Each execution has one client, shared by every call to its
// guest: its HTTP/2 connection is dialed once and carries call after call
// (a call then costs no dial, no connection preface and no settings
// exchange); a connection that breaks is dialed again at the next call,
// one idle for guestIdleTimeout is closed, and the client is dropped when
// the execution ends or the Runtime closes. A connection that is busy
// with the guest's MaxConcurrentStreams streams makes the transport dial
// another one, so the connections of an execution are bounded by its
// concurrent calls. What the guest sends is bounded: every message by
// protocol.MaxDataPlaneMessage (connect.WithReadMaxBytes, checked before it is
// decoded), the header lists that carry errors by maxGuestHeaders, and
// HTTP/2 flow control stops a guest that sends faster than the node
// reads.

const (
	// maxGuestHeaders bounds the headers and trailers of a response
	// (where the gRPC protocol puts errors).
	maxGuestHeaders = 64 << 10
	// guestDialTimeout bounds sending a connection over the channel.
	guestDialTimeout = 10 * time.Second
	// guestIdleTimeout: a connection to the guest that carried no call
	// for this long is closed.
	guestIdleTimeout = 90 * time.Second
)

// ProcessClient is a ProcessService client of one execution's guest,
// shared by every caller of Processes while the execution runs. Close
// releases it; its connections stay open for the next call and are closed
// when the execution ends.
type ProcessClient struct {
	guestv1connect.ProcessServiceClient
	tr *http2.Transport
}

// Close releases the client. Its connections are the execution's: they
// stay open for the next call.
func (c *ProcessClient) Close() {}

// guestClients holds the ProcessClient of each execution that has one.
var guestClients = struct {
	sync.Mutex
	m map[*execution]*ProcessClient
}{m: map[*execution]*ProcessClient{}}

// Processes returns the ProcessService client of workspaceID's guest.
func (r *Runtime) Processes(workspaceID string) (*ProcessClient, error) {
	e := r.get(workspaceID)
	if e == nil || !e.alive() || r.closed() {
		return nil, ErrNotRunning
	}
	guestClients.Lock()
	defer guestClients.Unlock()
	if c := guestClients.m[e]; c != nil {
		return c, nil
	}
	c := newProcessClient(e)
	guestClients.m[e] = c
	go func() {
		select {
		case <-e.done:
		case <-r.ctx.Done():
		}
		guestClients.Lock()
		delete(guestClients.m, e)
		guestClients.Unlock()
		c.tr.CloseIdleConnections()
	}()
	return c, nil
}

// GuestTransport returns the HTTP/2 transport of workspaceID's guest data
// service (the one Processes's client uses): the node's data service
// forwards the data plane's calls on it.
func (r *Runtime) GuestTransport(workspaceID string) (http.RoundTripper, error) {
	c, err := r.Processes(workspaceID)
	if err != nil {
		return nil, err
	}
	return c.tr, nil
}

// newProcessClient returns a client whose connections are sent over e's
// channel.
func newProcessClient(e *execution) *ProcessClient {
	// The node's receive windows toward the guest: 256 KiB per stream, 16 MiB
	// per connection (x/net/http2 takes them from its net/http twin), so
	// that what a guest sends ahead of the node's reading stays small (the
	// defaults are 4 MiB and 1 GiB).
	tr, err := http2.ConfigureTransports(&http.Transport{DisableCompression: true, HTTP2: &http.HTTP2Config{
		MaxReceiveBufferPerStream: 256 << 10, MaxReceiveBufferPerConnection: 16 << 20}})
	if err != nil {
		tr = &http2.Transport{} // only for a net/http transport configured already
	}
	tr.ConnPool = nil // it dials by itself (ConfigureTransports leaves dialing to net/http)
	tr.AllowHTTP = true
	tr.DialTLSContext = func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
		if !e.alive() {
			return nil, ErrNotRunning
		}
		ch, err := e.channel()
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(ctx, guestDialTimeout)
		defer cancel()
		return ch.Dial(ctx)
	}
	tr.MaxHeaderListSize = maxGuestHeaders
	tr.MaxReadFrameSize = 512 << 10 // the guest writes output in few, large frames
	tr.IdleConnTimeout = guestIdleTimeout
	// A guest that stops answering is found by pings, not waited for
	// forever.
	tr.ReadIdleTimeout, tr.PingTimeout = 30*time.Second, 10*time.Second
	c := guestv1connect.NewProcessServiceClient(&http.Client{Transport: tr}, "http://guest",
		connect.WithGRPC(), connect.WithAcceptCompression("gzip", nil, nil),
		connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage), connect.WithSendMaxBytes(protocol.MaxDataPlaneMessage))
	return &ProcessClient{ProcessServiceClient: c, tr: tr}
}

// errNoExit: the guest's event stream ended without an exit.
var errNoExit = errors.New("sandbox: exec: the guest's event stream ended without an exit")
