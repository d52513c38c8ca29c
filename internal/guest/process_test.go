package guest

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
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

// guestClient returns a ProcessService client of a new agent.
func guestClient(t *testing.T) guestv1connect.ProcessServiceClient {
	t.Helper()
	_, sock, _ := startAgent(t)
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
		return protocol.Dial(ctx, sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return guestv1connect.NewProcessServiceClient(&http.Client{Transport: tr}, "http://guest", connect.WithGRPC(),
		connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage))
}

// readEvents reads a process's events from offset from, sleeping pause
// after each of the first slow events: the output bytes, the dropped
// bytes and the exit.
func readEvents(t *testing.T, ctx context.Context, c guestv1connect.ProcessServiceClient, id string, from uint64, slow int, pause time.Duration) (out, dropped uint64, exited *guestv1.Exited) {
	t.Helper()
	s, err := c.Events(ctx, connect.NewRequest(&guestv1.EventsRequest{ProcessId: id, FromOffset: from}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := 0
	for s.Receive() {
		out += uint64(len(s.Msg().GetOutput().GetData()))
		dropped += s.Msg().GetDropped().GetBytes()
		if e := s.Msg().GetExited(); e != nil {
			exited = e
		}
		if n++; n < slow {
			time.Sleep(pause)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return out, dropped, exited
}

// TestOutputBackpressure: while a client reads a process's events, the
// ring loses nothing, however slowly it reads (the process waits on its
// full pipe); with nobody reading, the process is never blocked and the
// oldest output goes, announced by a dropped event.
func TestOutputBackpressure(t *testing.T) {
	c := guestClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const total = 4 * RingBytes

	// Attached before the output starts (it waits for a line of input).
	r, err := c.Start(ctx, connect.NewRequest(&guestv1.StartRequest{Argv: []string{"sh", "-c", "read x; head -c 4194304 /dev/zero"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := r.Msg.GetProcessId()
	type result struct {
		out, dropped uint64
		exited       *guestv1.Exited
	}
	got := make(chan result, 1)
	go func() {
		out, dropped, exited := readEvents(t, ctx, c, id, 0, 40, 20*time.Millisecond)
		got <- result{out, dropped, exited}
	}()
	time.Sleep(100 * time.Millisecond) // the stream is attached
	if _, err := c.SendInput(ctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: id, Data: []byte("go\n")})); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if res.out != total || res.dropped != 0 || res.exited.GetExitCode() != 0 || res.exited.GetEndOffset() != total {
		t.Errorf("a slow reader got %d bytes, %d dropped, exit %v; want all %d, none dropped", res.out, res.dropped, res.exited, total)
	}

	// Attached only after the start (two calls): nothing is lost in
	// between, the output waits for the first stream.
	r, err = c.Start(ctx, connect.NewRequest(&guestv1.StartRequest{Argv: []string{"head", "-c", "4194304", "/dev/zero"}}))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if out, dropped, exited := readEvents(t, ctx, c, r.Msg.GetProcessId(), 0, 0, 0); out != total || dropped != 0 || exited.GetEndOffset() != total {
		t.Errorf("attached after the start: %d bytes, %d dropped, exit %v; want all %d", out, dropped, exited, total)
	}

	// Nobody attached: the process runs to its end once the start's
	// reservation (startReservation) has passed.
	r, err = c.Start(ctx, connect.NewRequest(&guestv1.StartRequest{Argv: []string{"head", "-c", "4194304", "/dev/zero"}}))
	if err != nil {
		t.Fatal(err)
	}
	id = r.Msg.GetProcessId()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l, err := c.List(ctx, connect.NewRequest(&guestv1.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		var done bool
		for _, p := range l.Msg.GetProcesses() {
			if p.GetProcessId() == id && p.GetExited() != nil {
				done = true
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a process with nobody reading did not end: the ring blocked it")
		}
	}
	out, dropped, exited := readEvents(t, ctx, c, id, 0, 0, 0)
	if dropped != total-RingBytes || out != RingBytes || exited.GetEndOffset() != total {
		t.Errorf("read after the end: %d bytes, %d dropped, exit %v; want %d and %d", out, dropped, exited, RingBytes, total-RingBytes)
	}
}

// TestWriteInputFlowControl: a stream of input larger than the input
// buffer, sent while the process does not read yet, is taken whole: the
// guest holds the sender back (flow control) instead of refusing; a
// resent first offset skips what was taken; close_input ends the input.
func TestWriteInputFlowControl(t *testing.T) {
	c := guestClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := c.Start(ctx, connect.NewRequest(&guestv1.StartRequest{Argv: []string{"sh", "-c", "sleep 0.3; wc -c"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := r.Msg.GetProcessId()
	const total = 16 * InputBytes
	chunk := make([]byte, 48<<10)
	s := c.WriteInput(ctx)
	sent := 0
	for first := true; sent < total; first = false {
		m := &guestv1.WriteInputRequest{Data: chunk}
		if first {
			m.ProcessId = id
		}
		if err := s.Send(m); err != nil {
			t.Fatal(err)
		}
		sent += len(chunk)
	}
	res, err := s.CloseAndReceive()
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetAcceptedBytes() != uint64(sent) || res.Msg.GetInputOffset() != uint64(sent) {
		t.Fatalf("accepted %d, offset %d; want %d", res.Msg.GetAcceptedBytes(), res.Msg.GetInputOffset(), sent)
	}
	// A resend from offset 0 of the first chunk is skipped, and one more
	// chunk with close_input ends the input.
	s = c.WriteInput(ctx)
	_ = s.Send(&guestv1.WriteInputRequest{ProcessId: id, Offset: uint64(sent - len(chunk)), Data: chunk})
	_ = s.Send(&guestv1.WriteInputRequest{Data: []byte("abc"), CloseInput: true})
	res, err = s.CloseAndReceive()
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetAcceptedBytes() != uint64(len(chunk)+3) || res.Msg.GetInputOffset() != uint64(sent+3) {
		t.Fatalf("resend: accepted %d, offset %d; want %d, %d", res.Msg.GetAcceptedBytes(), res.Msg.GetInputOffset(), len(chunk)+3, sent+3)
	}
	ev, err := c.Events(ctx, connect.NewRequest(&guestv1.EventsRequest{ProcessId: id}))
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for ev.Receive() {
		out = append(out, ev.Msg().GetOutput().GetData()...)
	}
	if got := strings.TrimSpace(string(out)); got != strconv.Itoa(sent+3) {
		t.Errorf("wc -c read %q bytes, want %d", got, sent+3)
	}
}

// TestMergeEnv: the given environment is added to the default one, an
// entry replacing the default of its name (PATH stays unless replaced).
func TestMergeEnv(t *testing.T) {
	base := []string{"PATH=/bin", "HOME=/root", "TERM=dumb"}
	for _, tc := range []struct {
		add, want []string
	}{
		{nil, base},
		{[]string{"FOO=1"}, []string{"PATH=/bin", "HOME=/root", "TERM=dumb", "FOO=1"}},
		{[]string{"HOME=/home/u", "FOO=1", "FOO=2"}, []string{"PATH=/bin", "HOME=/home/u", "TERM=dumb", "FOO=2"}},
		{[]string{"PATH=/opt/bin"}, []string{"PATH=/opt/bin", "HOME=/root", "TERM=dumb"}},
	} {
		if got := mergeEnv(base, tc.add); !slices.Equal(got, tc.want) {
			t.Errorf("mergeEnv(%q) = %q, want %q", tc.add, got, tc.want)
		}
	}
	if base[1] != "HOME=/root" {
		t.Error("mergeEnv changed its base")
	}
}

// BenchmarkOutputStream: a process's output read through Events over the
// agent's socket, uncompressed as the node reads it (the guest's share of
// the data plane's streaming).
func BenchmarkOutputStream(b *testing.B) {
	_, sock, _ := startAgent(&testing.T{})
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
		return protocol.Dial(ctx, sock)
	}}
	defer tr.CloseIdleConnections()
	c := guestv1connect.NewProcessServiceClient(&http.Client{Transport: tr}, "http://guest", connect.WithGRPC(),
		connect.WithAcceptCompression("gzip", nil, nil), connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage))
	const size = 256 << 20
	b.SetBytes(size)
	for b.Loop() {
		r, err := c.Start(context.Background(), connect.NewRequest(&guestv1.StartRequest{Argv: []string{"head", "-c", strconv.Itoa(size), "/dev/zero"}}))
		if err != nil {
			b.Fatal(err)
		}
		s, err := c.Events(context.Background(), connect.NewRequest(&guestv1.EventsRequest{ProcessId: r.Msg.GetProcessId()}))
		if err != nil {
			b.Fatal(err)
		}
		var n int
		for s.Receive() {
			n += len(s.Msg().GetOutput().GetData())
		}
		s.Close()
		if n != size {
			b.Fatalf("%d bytes", n)
		}
	}
}
