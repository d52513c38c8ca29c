package guest

import (
	"bufio"
	"net"
	"net/http"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// A connection from the node carries one of two protocols, told apart by
// its first byte: "{" starts the line protocol of package protocol (ping,
// writeback, shutdown: what the node's health checks and stops use), "P"
// the HTTP/2 client preface of the data plane ("PRI * HTTP/2.0", h2c with
// prior knowledge), served with connect-go. Anything else is closed.

// newDataPlane returns the HTTP/2 server and the handler of the data plane.
func (a *Agent) newDataPlane() (*http2.Server, http.Handler) {
	mux := http.NewServeMux()
	// No compression: the bytes cross one host's sockets, and gzip cost
	// more CPU than the whole path (it was 8.9 CPU-seconds per GiB of a
	// process's output in the guest alone).
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage), connect.WithSendMaxBytes(protocol.MaxDataPlaneMessage), noGzip}
	mux.Handle(guestv1connect.NewProcessServiceHandler(processService{a: a}, opts...))
	mux.Handle(guestv1connect.NewFileServiceHandler(newFileService("/"), opts...))
	mux.Handle(guestv1connect.NewPortServiceHandler(newPortService(), opts...))
	srv := &http2.Server{
		MaxConcurrentStreams: 128,
		MaxReadFrameSize:     64 << 10,
		// Bounds what the node can make the guest buffer per stream and
		// per connection (request bodies: SendInput is the largest).
		MaxUploadBufferPerStream:     1 << 20,
		MaxUploadBufferPerConnection: 4 << 20,
	}
	return srv, mux
}

// peekedConn is a connection whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (a *Agent) serveConn(c net.Conn) {
	br := bufio.NewReader(c)
	b, err := br.Peek(1)
	if err != nil {
		c.Close()
		return
	}
	switch b[0] {
	case '{':
		a.serveLines(c, br)
	case 'P':
		a.h2.ServeConn(&peekedConn{Conn: c, r: br}, &http2.ServeConnOpts{Context: a.ctx, Handler: a.h2Handler})
		c.Close()
	default:
		c.Close()
	}
}
