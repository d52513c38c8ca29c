package kibotos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// DefaultPortSessionTTL is the lifetime of the data-plane session a
// PortDialer creates when SessionTTL is zero. A connection ends when the
// token it was opened with expires (the server closes it, SESSION_EXPIRED):
// a PortDialer renews its session once less than half of it is left, so
// every connection it opens may last half of this at least.
const DefaultPortSessionTTL = time.Hour

// portChunk is the largest chunk a port connection sends (the public
// bound is 64 KiB).
const portChunk = 32 << 10

// portCloseGrace bounds how long a closed port connection still delivers
// what was written before Close, in the background.
const portCloseGrace = 30 * time.Second

// PortDialer opens TCP connections to ports of one Workspace's loopback
// through the public data plane (PortForwardService), as a process of the
// Workspace would. Make one with Workspace.PortDialer and set its fields
// before the first DialPort; it is safe for concurrent use.
//
// The stream of each connection is a bidirectional stream: the Client's
// HTTP client must speak HTTP/2 to ctrl (the default one does); over
// HTTP/1.1 DialPort fails. The connections use the Connect protocol
// whatever the Client's options.
type PortDialer struct {
	// Token, when set, is the data-plane token (scope EXEC) sent instead of
	// creating a session: it is never renewed.
	Token string
	// SessionTTL is the lifetime of the sessions the PortDialer creates,
	// from 10s to 24h; zero is DefaultPortSessionTTL.
	SessionTTL time.Duration

	ws     *Workspace
	client ctrlv1connect.PortForwardServiceClient

	mu      sync.Mutex
	checked bool
	token   string
	expiry  time.Time
}

// PortDialer returns a PortDialer of the Workspace.
func (w *Workspace) PortDialer() *PortDialer {
	return &PortDialer{ws: w, client: ctrlv1connect.NewPortForwardServiceClient(w.c.httpClient, w.c.endpoint)}
}

// DialPort connects to port (1–65535) on the Workspace's loopback through a
// PortDialer of its own (a new session for each call; use PortDialer to
// share one). ctx bounds the connecting only.
func (w *Workspace) DialPort(ctx context.Context, port int) (net.Conn, error) {
	return w.PortDialer().DialPort(ctx, port)
}

func (d *PortDialer) ttl() time.Duration {
	if d.SessionTTL == 0 {
		return DefaultPortSessionTTL
	}
	return d.SessionTTL
}

// tokenFor returns the token to send: Token, or the PortDialer's session,
// created or renewed when less than half of its lifetime is left (renew:
// at once). The capabilities are checked at the first call (nothing is
// sent when the server does not offer them: a *MissingCapabilityError).
func (d *PortDialer) tokenFor(ctx context.Context, renew bool) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cl := d.ws.c
	req := &ctrlv1.CreateDataPlaneSessionRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: NewCommandID()}, WorkspaceId: d.ws.id,
		Scopes: []ctrlv1.DataPlaneScope{ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC}, Ttl: durationpb.New(d.ttl()),
	}
	if !d.checked {
		info, err := cl.serverInfo(ctx, cl.retry)
		if err != nil {
			return "", err
		}
		if err := MissingCapability(info, ctrlv1connect.PortForwardServiceForwardPortProcedure); err != nil {
			return "", err
		}
		if d.Token == "" {
			if err := MissingRequestCapability(info, ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure, req); err != nil {
				return "", err
			}
		}
		d.checked = true
	}
	if d.Token != "" {
		return d.Token, nil
	}
	if !renew && d.token != "" && time.Until(d.expiry) > d.ttl()/2 {
		return d.token, nil
	}
	var res *connect.Response[ctrlv1.CreateDataPlaneSessionResponse]
	err := Retry(ctx, cl.retry, func(ctx context.Context) error {
		var err error
		res, err = cl.SessionService.CreateDataPlaneSession(ctx, connect.NewRequest(req))
		return err
	})
	if err != nil {
		return "", err
	}
	d.token, d.expiry = res.Msg.GetSession().GetToken(), res.Msg.GetSession().GetExpireTime().AsTime()
	return d.token, nil
}

// Prepare checks the capabilities (a *MissingCapabilityError when the
// server does not offer them; nothing else is sent) and creates the
// session unless Token is set, so that a refusal (an unknown Workspace, a
// token refused) comes before the first connection. DialPort does it when
// it was not done.
func (d *PortDialer) Prepare(ctx context.Context) error {
	_, err := d.tokenFor(ctx, false)
	return err
}

// DialPort connects to port (1–65535) on the Workspace's loopback (the
// guest tries 127.0.0.1, then [::1]) and returns the connection. ctx
// bounds the connecting only. Nothing listening on the port is a
// failed_precondition error. The connection's Read returns io.EOF once the
// Workspace's side closed its writing half; CloseWrite closes this side's.
func (d *PortDialer) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("kibotos: port %d is not in 1–65535", port)
	}
	renewed := false
	for {
		tok, err := d.tokenFor(ctx, false)
		if err != nil {
			return nil, err
		}
		c, err := d.dial(ctx, tok, port)
		if err != nil && d.Token == "" && !renewed && Reason(err) == ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED {
			// Revoked or expired early by the server's clock: once more
			// with a new session.
			renewed = true
			if _, rerr := d.tokenFor(ctx, true); rerr != nil {
				return nil, rerr
			}
			continue
		}
		return c, err
	}
}

// dial opens one stream and waits for its connected notice.
func (d *PortDialer) dial(ctx context.Context, tok string, port int) (*PortConn, error) {
	life, cancel := context.WithCancel(context.Background())
	stream := d.client.ForwardPort(life)
	setBearer(stream.RequestHeader(), tok)
	// The transport does not see the context's end while it waits for the
	// next request to send: closing the requests makes it.
	abort := func() {
		cancel()
		_ = stream.CloseRequest()
	}
	stop := context.AfterFunc(ctx, abort)
	fail := func(err error) (*PortConn, error) {
		stop()
		abort()
		_ = stream.CloseResponse()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if err := stream.Send(&ctrlv1.ForwardPortRequest{WorkspaceId: d.ws.id, Port: uint32(port)}); err != nil && !errors.Is(err, io.EOF) {
		return fail(err)
	}
	m, err := stream.Receive()
	if err != nil {
		return fail(err)
	}
	if m.GetConnected() == nil {
		return fail(errors.New("kibotos: the forward did not start with connected"))
	}
	if !stop() {
		// ctx ended as the connection opened.
		return fail(ctx.Err())
	}
	c := &PortConn{stream: stream, cancel: cancel, data: make(chan []byte), done: make(chan struct{}),
		wch: make(chan []byte), wdone: make(chan struct{}),
		local: PortAddr{WorkspaceID: d.ws.id}, remote: PortAddr{WorkspaceID: d.ws.id, Port: port, Address: m.GetConnected().GetAddress()},
		rd: newPortDeadline(), wd: newPortDeadline()}
	go c.receive()
	go c.writer()
	return c, nil
}

// PortAddr is an end of a PortConn.
type PortAddr struct {
	// WorkspaceID is the Workspace.
	WorkspaceID string
	// Port is the port in the Workspace (0 for the local end).
	Port int
	// Address is the address the guest connected to ("127.0.0.1:8080").
	Address string
}

// Network is "kibotos".
func (PortAddr) Network() string { return "kibotos" }

func (a PortAddr) String() string {
	if a.Port == 0 {
		return a.WorkspaceID
	}
	return a.WorkspaceID + ":" + strconv.Itoa(a.Port)
}

// PortConn is a connection to a port of a Workspace: a net.Conn over one
// ForwardPort stream. It holds one chunk each way (like a socket's
// buffers): a Write returns once its last chunk was handed to the stream's
// writer, and an error of the stream is returned by the next Write; a side
// that does not read holds back the other through HTTP/2's flow control.
// A deadline that passes fails the calls it bounds and leaves the
// connection usable.
type PortConn struct {
	stream *connect.BidiStreamForClient[ctrlv1.ForwardPortRequest, ctrlv1.ForwardPortResponse]
	cancel context.CancelFunc
	local  PortAddr
	remote PortAddr

	// data carries the chunks receive reads; closed after the last.
	data chan []byte
	// rerr is why data was closed (io.EOF: the Workspace's side closed its
	// half); set before it is closed.
	rerr error
	rbuf []byte // the rest of the chunk Read is at
	rmu  sync.Mutex

	// wch carries chunks to the writer; nil asks for close_write.
	wch chan []byte
	// wdone is closed when the writer ended, werr saying why (set
	// before).
	wdone   chan struct{}
	werr    error
	wmu     sync.Mutex // Write and CloseWrite, one at a time
	wclosed bool

	done      chan struct{} // closed by Close
	closeOnce sync.Once
	rd, wd    *portDeadline
}

// errWriteShut is the writer's end after close_write.
var errWriteShut = errors.New("kibotos: write after CloseWrite")

// abort ends the stream at once. The transport does not see the
// context's end while it waits for the next request to send: closing the
// requests makes it.
func (c *PortConn) abort() {
	c.cancel()
	_ = c.stream.CloseRequest()
}

// receive reads the stream into data until its end.
func (c *PortConn) receive() {
	defer close(c.data)
	for {
		m, err := c.stream.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.EOF
			}
			c.rerr = err
			return
		}
		if m.GetRemoteClosed() != nil {
			c.rerr = io.EOF
			return
		}
		if d := m.GetData(); len(d) > 0 {
			select {
			case c.data <- d:
			case <-c.done: // closed: discarded, until the stream ends
			}
		}
	}
}

// writer sends the chunks of wch until close_write, Close or a failure;
// at Close it ends the requests once the chunk it holds is sent.
func (c *PortConn) writer() {
	defer close(c.wdone)
	for {
		select {
		case b := <-c.wch:
			if b == nil {
				err := c.stream.Send(&ctrlv1.ForwardPortRequest{CloseWrite: true})
				if err == nil {
					err = c.stream.CloseRequest()
				}
				if err != nil {
					c.werr = c.sendError(err)
				} else {
					c.werr = errWriteShut
				}
				return
			}
			if err := c.stream.Send(&ctrlv1.ForwardPortRequest{Data: b}); err != nil {
				c.werr = c.sendError(err)
				return
			}
		case <-c.done:
			c.werr = net.ErrClosed
			_ = c.stream.CloseRequest()
			return
		}
	}
}

// sendError is the error of a failed Send: the server's answer ends the
// call (Read returns it), so it is io.ErrClosedPipe here.
func (c *PortConn) sendError(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrClosedPipe
	}
	return err
}

// Read reads what the Workspace's side wrote; io.EOF once it closed its
// writing half.
func (c *PortConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(c.rbuf) == 0 {
		select {
		case <-c.done:
			return 0, net.ErrClosed
		case <-c.rd.wait():
			return 0, os.ErrDeadlineExceeded
		default:
		}
		select {
		case b, ok := <-c.data:
			if !ok {
				return 0, c.rerr
			}
			c.rbuf = b
		case <-c.rd.wait():
			return 0, os.ErrDeadlineExceeded
		case <-c.done:
			return 0, net.ErrClosed
		}
	}
	n := copy(p, c.rbuf)
	c.rbuf = c.rbuf[n:]
	return n, nil
}

// hand gives b (nil: close_write) to the writer, within the write
// deadline.
func (c *PortConn) hand(b []byte) error {
	select {
	case <-c.done:
		return net.ErrClosed
	case <-c.wd.wait():
		return os.ErrDeadlineExceeded
	case <-c.wdone:
		return c.werr
	default:
	}
	select {
	case c.wch <- b:
		return nil
	case <-c.done:
		return net.ErrClosed
	case <-c.wd.wait():
		return os.ErrDeadlineExceeded
	case <-c.wdone:
		return c.werr
	}
}

// Write sends p to the Workspace's side, in chunks of 32 KiB.
func (c *PortConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wclosed {
		return 0, errWriteShut
	}
	n := 0
	for n < len(p) {
		k := min(len(p)-n, portChunk)
		if err := c.hand(bytes.Clone(p[n : n+k])); err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

// CloseWrite closes this side's writing half once what was written is
// sent: the Workspace's side then reads end of file.
func (c *PortConn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wclosed {
		return nil
	}
	if err := c.hand(nil); err != nil {
		return err
	}
	c.wclosed = true
	select {
	case <-c.wdone:
		if c.werr != errWriteShut {
			return c.werr
		}
		return nil
	case <-c.done:
		return net.ErrClosed
	}
}

// Close closes the connection: pending Reads and Writes return, the chunk
// the writer holds still reaches the Workspace's side, then its end of
// file; what it sends is discarded. The stream is cut after 30s at most.
func (c *PortConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.done)
		go func() {
			t := time.AfterFunc(portCloseGrace, c.abort)
			defer t.Stop()
			for range c.data {
			}
			<-c.wdone
			c.abort()
			_ = c.stream.CloseResponse()
		}()
	})
	return nil
}

// LocalAddr names the Workspace (Port 0).
func (c *PortConn) LocalAddr() net.Addr { return c.local }

// RemoteAddr names the Workspace and the port.
func (c *PortConn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both deadlines.
func (c *PortConn) SetDeadline(t time.Time) error {
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

// SetReadDeadline sets the deadline of Read, pending ones included.
func (c *PortConn) SetReadDeadline(t time.Time) error { c.rd.set(t); return nil }

// SetWriteDeadline sets the deadline of Write and CloseWrite, pending ones
// included.
func (c *PortConn) SetWriteDeadline(t time.Time) error { c.wd.set(t); return nil }

// portDeadline is a deadline whose channel is closed once it passed.
type portDeadline struct {
	mu    sync.Mutex
	gen   uint64
	timer *time.Timer
	ch    chan struct{}
}

func newPortDeadline() *portDeadline { return &portDeadline{ch: make(chan struct{})} }

// set moves the deadline (zero: none). A callback of an earlier deadline
// finds another generation and does nothing.
func (d *portDeadline) set(at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	select {
	case <-d.ch:
		d.ch = make(chan struct{})
	default:
	}
	if at.IsZero() {
		return
	}
	dur := time.Until(at)
	if dur <= 0 {
		close(d.ch)
		return
	}
	gen, ch := d.gen, d.ch
	d.timer = time.AfterFunc(dur, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.gen == gen {
			close(ch)
		}
	})
}

// wait is closed once the deadline passed.
func (d *portDeadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

var _ net.Conn = (*PortConn)(nil)
