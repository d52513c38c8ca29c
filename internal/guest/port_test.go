package guest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// portClient returns a PortService client of a guest agent on its socket.
func portClient(t *testing.T) guestv1connect.PortServiceClient {
	t.Helper()
	_, sock, _ := startAgent(t)
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
		return protocol.Dial(ctx, sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return guestv1connect.NewPortServiceClient(&http.Client{Transport: tr}, "http://guest", connect.WithGRPC(),
		connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage), connect.WithSendMaxBytes(protocol.MaxDataPlaneMessage))
}

// echoServer listens on the loopback (the guest runs on the host in these
// tests, so its loopback is the test's) and echoes each connection until
// its end of file, then closes it.
func echoServer(t *testing.T) (port uint32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return uint32(l.Addr().(*net.TCPAddr).Port)
}

// TestPortForwardEcho: bytes go both ways through a forward; close_write
// reaches the workspace's side as end of file, whose close comes back as
// remote_closed, and the call ends cleanly. 8 MiB pass in chunks with the
// same digest (the guest buffers one chunk each way: a reader that lags
// holds back the writer through flow control).
func TestPortForwardEcho(t *testing.T) {
	c := portClient(t)
	port := echoServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := c.Forward(ctx)
	if err := s.Send(&guestv1.ForwardRequest{Port: port}); err != nil {
		t.Fatal(err)
	}
	m, err := s.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if a := m.GetConnected().GetAddress(); !strings.HasPrefix(a, "127.0.0.1:") {
		t.Fatalf("connected: %v", m)
	}
	data := make([]byte, 8<<20)
	_, _ = rand.Read(data)
	sent := make(chan error, 1)
	go func() {
		for off := 0; off < len(data); off += MaxForwardChunk {
			if err := s.Send(&guestv1.ForwardRequest{Data: data[off:min(off+MaxForwardChunk, len(data))]}); err != nil {
				sent <- err
				return
			}
		}
		sent <- s.Send(&guestv1.ForwardRequest{CloseWrite: true})
	}()
	h := sha256.New()
	var n int
	var closed bool
	for {
		m, err := s.Receive()
		if err != nil {
			t.Fatalf("receive after %d bytes: %v", n, err)
		}
		if m.GetRemoteClosed() != nil {
			closed = true
			break
		}
		if len(m.GetData()) > MaxForwardChunk {
			t.Fatalf("chunk of %d bytes", len(m.GetData()))
		}
		h.Write(m.GetData())
		n += len(m.GetData())
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := s.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Receive(); !errors.Is(err, io.EOF) {
		t.Errorf("end: %v", err)
	}
	_ = s.CloseResponse()
	want := sha256.Sum256(data)
	if !closed || n != len(data) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Errorf("echoed %d of %d bytes, closed %v, digest equal %v", n, len(data), closed, bytes.Equal(h.Sum(nil), want[:]))
	}
}

// TestPortForwardRefused: a port nothing listens on fails with
// failed_precondition naming it; a port out of range or none is
// invalid_argument.
func TestPortForwardRefused(t *testing.T) {
	c := portClient(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := uint32(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		port uint32
		code connect.Code
		msg  string
	}{
		{free, connect.CodeFailedPrecondition, "nothing listens on port"},
		{0, connect.CodeInvalidArgument, "not in 1–65535"},
		{65536, connect.CodeInvalidArgument, "not in 1–65535"},
	} {
		s := c.Forward(ctx)
		_ = s.Send(&guestv1.ForwardRequest{Port: tc.port})
		_, err := s.Receive()
		if connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("port %d: %v, want %v %q", tc.port, err, tc.code, tc.msg)
		}
		_ = s.CloseRequest()
		_ = s.CloseResponse()
	}
}

// TestPortForwardRemoteFirst: a server that speaks first and closes is
// read to its end while the client sends nothing; the client's close then
// ends the call. A chunk over 64 KiB is refused.
func TestPortForwardRemoteFirst(t *testing.T) {
	c := portClient(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = conn.Write([]byte("hello\n"))
			conn.Close()
		}
	}()
	port := uint32(l.Addr().(*net.TCPAddr).Port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := c.Forward(ctx)
	_ = s.Send(&guestv1.ForwardRequest{Port: port})
	var got []byte
	for {
		m, err := s.Receive()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.GetData()...)
		if m.GetRemoteClosed() != nil {
			break
		}
	}
	if string(got) != "hello\n" {
		t.Errorf("got %q", got)
	}
	_ = s.CloseRequest()
	if _, err := s.Receive(); !errors.Is(err, io.EOF) {
		t.Errorf("end: %v", err)
	}
	_ = s.CloseResponse()

	s = c.Forward(ctx)
	_ = s.Send(&guestv1.ForwardRequest{Port: echoServer(t)})
	_ = s.Send(&guestv1.ForwardRequest{Data: make([]byte, MaxForwardChunk+1)})
	for {
		if _, err = s.Receive(); err != nil {
			break
		}
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a chunk of %d bytes: %v", MaxForwardChunk+1, err)
	}
	_ = s.CloseResponse()
}

// TestPortForwardIPv6: a server listening on [::1] only is reached when
// 127.0.0.1 refuses.
func TestPortForwardIPv6(t *testing.T) {
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, _ = c.Write([]byte("six"))
			c.Close()
		}
	}()
	c := portClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := c.Forward(ctx)
	_ = s.Send(&guestv1.ForwardRequest{Port: uint32(l.Addr().(*net.TCPAddr).Port)})
	m, err := s.Receive()
	if err != nil || !strings.HasPrefix(m.GetConnected().GetAddress(), "[::1]:") {
		t.Fatalf("connected = %v, %v; want [::1]", m, err)
	}
	m, err = s.Receive()
	if err != nil || string(m.GetData()) != "six" {
		t.Errorf("data = %v, %v", m, err)
	}
	_ = s.CloseRequest()
	_ = s.CloseResponse()
}

// TestPortForwardBound: a forward beyond the bound fails with
// resource_exhausted.
func TestPortForwardBound(t *testing.T) {
	svc := newPortService()
	svc.slots = make(chan struct{}, 1)
	svc.slots <- struct{}{} // one forward is open
	mux := http.NewServeMux()
	mux.Handle(guestv1connect.NewPortServiceHandler(svc))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	c := guestv1connect.NewPortServiceClient(srv.Client(), srv.URL, connect.WithGRPC())
	s := c.Forward(t.Context())
	_ = s.Send(&guestv1.ForwardRequest{Port: echoServer(t)})
	if _, err := s.Receive(); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("forward beyond the bound = %v, want resource_exhausted", err)
	}
	_ = s.CloseResponse()
}

// TestPortForwardBackpressure: a workspace server that writes as fast as
// it can to a client that reads nothing is held back (TCP's window and
// HTTP/2's flow control, one chunk in the guest): far less than what it
// tried is taken; the client's cancel then closes its connection.
func TestPortForwardBackpressure(t *testing.T) {
	c := portClient(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	written := make(chan int64, 1)
	closed := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 64<<10)
		_, _ = rand.Read(buf) // not compressible
		var n int64
		for n < 256<<20 {
			_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
			k, err := conn.Write(buf)
			n += int64(k)
			if err != nil {
				break
			}
		}
		written <- n
		// Then the end of the forward reaches it.
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(buf)
		closed <- err
	}()
	ctx, cancel := context.WithCancel(t.Context())
	s := c.Forward(ctx)
	_ = s.Send(&guestv1.ForwardRequest{Port: uint32(l.Addr().(*net.TCPAddr).Port)})
	if m, err := s.Receive(); err != nil || m.GetConnected() == nil {
		t.Fatalf("connected: %v, %v", m, err)
	}
	n := <-written
	t.Logf("a server writing to a client that reads nothing got %d KiB out", n>>10)
	if n >= 64<<20 {
		t.Errorf("%d bytes taken from a server while the client read nothing", n)
	}
	// As ctrl does when its client goes: the transport sees the context's
	// end once the requests are closed.
	cancel()
	_ = s.CloseRequest()
	if err := <-closed; err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the workspace's side after the client's cancel: %v, want its end", err)
	}
	_ = s.CloseResponse()
}
