package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
)

// Bounds of port forwarding.
const (
	// MaxForwards bounds the forwards open at once; one more fails with
	// resource_exhausted.
	MaxForwards = 256
	// MaxForwardChunk bounds the data of one ForwardRequest and of one
	// ForwardResponse.
	MaxForwardChunk = 64 << 10
	// forwardDialTimeout bounds the connecting to the port.
	forwardDialTimeout = 10 * time.Second
)

// noGzip serves a handler without compression: the bytes of a forward are
// mostly compressed or encrypted already, and gzip would spend the
// workspace's CPU on every chunk for nothing.
var noGzip = connect.WithCompression("gzip", nil, nil)

// portService serves the PortService: the guest is PID 1 of the
// workspace's network namespace, so its loopback is the workspace's own.
// Each forward holds one TCP connection and two goroutines; its bytes are
// never buffered beyond one chunk each way: a side that does not read
// stops the other through the connection's window or HTTP/2's flow
// control.
type portService struct {
	// slots holds one token per open forward (MaxForwards).
	slots chan struct{}
	// dial connects to an address (net.Dialer.DialContext).
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func newPortService() portService {
	d := &net.Dialer{Timeout: forwardDialTimeout}
	return portService{slots: make(chan struct{}, MaxForwards), dial: d.DialContext}
}

// connectPort dials 127.0.0.1:port, then [::1]:port when that fails.
func (s portService) connectPort(ctx context.Context, port uint32) (net.Conn, error) {
	p := strconv.FormatUint(uint64(port), 10)
	c, err4 := s.dial(ctx, "tcp", net.JoinHostPort("127.0.0.1", p))
	if err4 == nil {
		return c, nil
	}
	c, err6 := s.dial(ctx, "tcp", net.JoinHostPort("::1", p))
	if err6 == nil {
		return c, nil
	}
	if ctx.Err() != nil {
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	if errors.Is(err4, syscall.ECONNREFUSED) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("nothing listens on port %d in the workspace", port))
	}
	var ne net.Error
	if errors.As(err4, &ne) && ne.Timeout() {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("connecting to port %d in the workspace timed out", port))
	}
	return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("cannot connect to port %d in the workspace", port))
}

// Forward connects to a port and copies both ways until both halves are
// closed, the connection fails, or the call is canceled.
func (s portService) Forward(ctx context.Context, stream *connect.BidiStream[guestv1.ForwardRequest, guestv1.ForwardResponse]) error {
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d forwards are open", MaxForwards))
	}
	first, err := stream.Receive()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return connect.NewError(connect.CodeInvalidArgument, errors.New("no port"))
		}
		return err
	}
	port := first.GetPort()
	if port < 1 || port > 65535 {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("port %d is not in 1–65535", port))
	}
	conn, err := s.connectPort(ctx, port)
	if err != nil {
		return err
	}
	defer conn.Close()
	// A canceled call closes the connection, which ends both copies.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := stream.Send(&guestv1.ForwardResponse{Event: &guestv1.ForwardResponse_Connected{
		Connected: &guestv1.PortConnected{Address: conn.RemoteAddr().String()}}}); err != nil {
		return err
	}
	up := make(chan error, 1)
	go func() { up <- forwardUp(stream, conn, first) }()
	down := make(chan error, 1)
	go func() { down <- forwardDown(stream, conn) }()
	// The call ends when both copies are done, or at the first failure:
	// the connection is closed, which ends the copy that reads it.
	var upDone, downDone bool
	for !upDone || !downDone {
		select {
		case err := <-up:
			upDone = true
			if err != nil {
				conn.Close()
				if !downDone {
					<-down
				}
				return err
			}
		case err := <-down:
			downDone = true
			if err != nil {
				// The copy up may be blocked in Receive: it ends when
				// the call does.
				conn.Close()
				return err
			}
		}
	}
	return nil
}

// closeWriter is a connection whose writing half closes alone.
type closeWriter interface{ CloseWrite() error }

// forwardUp writes what the client sends to conn (first is the first
// request: it may carry data too), and closes conn's writing half at
// close_write or at the end of the client's requests.
func forwardUp(stream *connect.BidiStream[guestv1.ForwardRequest, guestv1.ForwardResponse], conn net.Conn, first *guestv1.ForwardRequest) error {
	m := first
	for {
		if len(m.GetData()) > MaxForwardChunk {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("a chunk of %d bytes exceeds %d", len(m.GetData()), MaxForwardChunk))
		}
		if len(m.GetData()) > 0 {
			if _, err := conn.Write(m.GetData()); err != nil {
				return connect.NewError(connect.CodeAborted, errors.New("the connection in the workspace failed while writing"))
			}
		}
		if m.GetCloseWrite() {
			break
		}
		var err error
		m, err = stream.Receive()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	if cw, ok := conn.(closeWriter); ok {
		_ = cw.CloseWrite()
	}
	// Anything after close_write is refused; the client's end of requests
	// is awaited, so that the call does not end before the client is done.
	if m != nil && m.GetCloseWrite() {
		for {
			m, err := stream.Receive()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if len(m.GetData()) > 0 {
				return connect.NewError(connect.CodeInvalidArgument, errors.New("data after close_write"))
			}
		}
	}
	return nil
}

// forwardDown sends what conn reads to the client, then remote_closed at
// its end of file.
func forwardDown(stream *connect.BidiStream[guestv1.ForwardRequest, guestv1.ForwardResponse], conn net.Conn) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if serr := stream.Send(&guestv1.ForwardResponse{Event: &guestv1.ForwardResponse_Data{Data: buf[:n]}}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			return stream.Send(&guestv1.ForwardResponse{Event: &guestv1.ForwardResponse_RemoteClosed{RemoteClosed: &guestv1.PortRemoteClosed{}}})
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return connect.NewError(connect.CodeCanceled, errors.New("forward closed"))
			}
			return connect.NewError(connect.CodeAborted, errors.New("the connection in the workspace failed while reading"))
		}
	}
}

// NewPortService returns the PortService handler the guest serves, for
// tests that run it outside a workspace (it then dials the caller's
// loopback).
func NewPortService() guestv1connect.PortServiceHandler { return newPortService() }
