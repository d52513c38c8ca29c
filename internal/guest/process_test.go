package guest

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// TestProcessServiceOverSocket: the agent serves the ProcessService and the
// line protocol on the same socket, told apart by the first byte (the
// sandbox tests run the service in real workspaces; this one runs under
// the race detector).
func TestProcessServiceOverSocket(t *testing.T) {
	_, sock, _ := startAgent(t)
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
		return protocol.Dial(ctx, sock)
	}}
	defer tr.CloseIdleConnections()
	c := guestv1connect.NewProcessServiceClient(&http.Client{Transport: tr}, "http://guest", connect.WithGRPC(),
		connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for range 3 {
		r, err := c.Start(ctx, connect.NewRequest(&guestv1.StartRequest{Argv: []string{"cat"}}))
		if err != nil {
			t.Fatal(err)
		}
		id := r.Msg.GetProcessId()
		if _, err := c.SendInput(ctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: id, Data: []byte("ping\n")})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CloseInput(ctx, connect.NewRequest(&guestv1.CloseInputRequest{ProcessId: id})); err != nil {
			t.Fatal(err)
		}
		s, err := c.Events(ctx, connect.NewRequest(&guestv1.EventsRequest{ProcessId: id}))
		if err != nil {
			t.Fatal(err)
		}
		var out []byte
		var exited *guestv1.Exited
		for s.Receive() {
			out = append(out, s.Msg().GetOutput().GetData()...)
			if e := s.Msg().GetExited(); e != nil {
				exited = e
			}
		}
		if s.Err() != nil || string(out) != "ping\n" || exited.GetExitCode() != 0 || exited.GetEndOffset() != 5 {
			t.Errorf("cat: %q %v %v", out, exited, s.Err())
		}
		s.Close()
	}
	// The line protocol still answers on the same socket.
	if resp := do(t, sock, protocol.Request{Op: protocol.OpPing}); !resp.OK {
		t.Errorf("ping: %+v", resp)
	}
	// A connection that speaks neither is closed.
	conn, err := protocol.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = conn.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := conn.Read(make([]byte, 16)); n != 0 || err == nil {
		t.Errorf("an unknown protocol: read %d, %v", n, err)
	}
}
