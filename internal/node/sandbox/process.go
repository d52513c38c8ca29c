package sandbox

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// The data plane's client on the node: connect-go (gRPC protocol) over
// HTTP/2 with prior knowledge on connections the node sends over the
// channel (protocol.NodeChannel.Dial), one channel connection per HTTP/2
// connection. What the guest sends is bounded: every message by
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
)

// ProcessClient is a ProcessService client of one workspace's guest.
// Close it when done: it closes its HTTP/2 connection.
type ProcessClient struct {
	guestv1connect.ProcessServiceClient
	tr *http2.Transport
}

// Close closes the client's connections to the guest.
func (c *ProcessClient) Close() { c.tr.CloseIdleConnections() }

// Processes returns a ProcessService client of workspaceID's guest.
func (r *Runtime) Processes(workspaceID string) (*ProcessClient, error) {
	e := r.get(workspaceID)
	if e == nil || !e.alive() {
		return nil, ErrNotRunning
	}
	tr := &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
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
		},
		MaxHeaderListSize: maxGuestHeaders,
		MaxReadFrameSize:  64 << 10,
		// A guest that stops answering is found by pings, not waited
		// for forever.
		ReadIdleTimeout: 30 * time.Second,
		PingTimeout:     10 * time.Second,
	}
	c := guestv1connect.NewProcessServiceClient(&http.Client{Transport: tr}, "http://guest",
		connect.WithGRPC(), connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage), connect.WithSendMaxBytes(protocol.MaxDataPlaneMessage))
	return &ProcessClient{ProcessServiceClient: c, tr: tr}, nil
}

// errNoExit: the guest's event stream ended without an exit.
var errNoExit = errors.New("sandbox: exec: the guest's event stream ended without an exit")
