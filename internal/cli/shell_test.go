//go:build linux

package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// openPty opens a pseudo-terminal pair (/dev/ptmx) of rows×cols.
func openPty(t *testing.T, rows, cols uint16) (master, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("TIOCSPTLCK: %v", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("TIOCGPTN: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	setPtySize(t, s, rows, cols)
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

func setPtySize(t *testing.T, tty *os.File, rows, cols uint16) {
	t.Helper()
	if err := unix.IoctlSetWinsize(int(tty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatalf("TIOCSWINSZ: %v", err)
	}
}

// shellGuest is a guest whose one process is a tiny shell on a terminal:
// it runs "echo WORD; exit N" lines (ended by a carriage return, as a
// terminal in raw mode sends them) and records its sizes and input.
type shellGuest struct {
	guestv1connect.UnimplementedProcessServiceHandler
	mu     sync.Mutex
	start  *guestv1.StartRequest
	sizes  []string
	input  []byte
	offset uint64
	wake   chan struct{}
}

func (g *shellGuest) Start(_ context.Context, req *connect.Request[guestv1.StartRequest]) (*connect.Response[guestv1.StartResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.start = req.Msg
	if p := req.Msg.GetPty(); p != nil {
		g.sizes = append(g.sizes, fmt.Sprintf("%dx%d", p.GetRows(), p.GetCols()))
	}
	return connect.NewResponse(&guestv1.StartResponse{ProcessId: "sh", Pid: 2}), nil
}

func (g *shellGuest) Resize(_ context.Context, req *connect.Request[guestv1.ResizeRequest]) (*connect.Response[guestv1.ResizeResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sizes = append(g.sizes, fmt.Sprintf("%dx%d", req.Msg.GetRows(), req.Msg.GetCols()))
	return connect.NewResponse(&guestv1.ResizeResponse{}), nil
}

// SendInput takes at most 4 bytes a call, and fails with
// resource_exhausted when it takes fewer than it got: kibo resends the
// rest from the accepted offset.
func (g *shellGuest) SendInput(_ context.Context, req *connect.Request[guestv1.SendInputRequest]) (*connect.Response[guestv1.SendInputResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	data := req.Msg.GetData()
	var skip uint64
	if off := req.Msg.GetOffset(); off < g.offset {
		skip = min(g.offset-off, uint64(len(data)))
	}
	took := min(uint64(len(data))-skip, 4)
	g.input = append(g.input, data[skip:skip+took]...)
	g.offset += took
	select {
	case g.wake <- struct{}{}:
	default:
	}
	res := &guestv1.SendInputResponse{AcceptedBytes: skip + took, InputOffset: g.offset}
	if skip+took < uint64(len(data)) {
		ce := connect.NewError(connect.CodeResourceExhausted, errors.New("input buffer full"))
		if d, err := connect.NewErrorDetail(res); err == nil {
			ce.AddDetail(d)
		}
		return nil, ce
	}
	return connect.NewResponse(res), nil
}

func (g *shellGuest) Events(ctx context.Context, req *connect.Request[guestv1.EventsRequest], out *connect.ServerStream[guestv1.EventsResponse]) error {
	var off uint64 // the output offset, as the guest counts it
	output := func(s string) error {
		o := &guestv1.Output{Stream: guestv1.Stream_STREAM_STDOUT, Offset: off, Data: []byte(s)}
		off += uint64(len(s))
		return out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Output{Output: o}})
	}
	if err := output("$ "); err != nil {
		return err
	}
	done := 0
	for {
		g.mu.Lock()
		in := string(g.input)
		g.mu.Unlock()
		for {
			i := strings.IndexByte(in[done:], '\r')
			if i < 0 {
				break
			}
			line := in[done : done+i]
			done += i + 1
			if j := strings.LastIndexByte(line, 3); j >= 0 {
				line = line[j+1:] // Ctrl-C drops what came before
			}
			var word string
			var code int32
			if _, err := fmt.Sscanf(line, "echo %s exit %d", &word, &code); err == nil {
				if err := output(strings.TrimSuffix(word, ";") + "\r\n"); err != nil {
					return err
				}
				return out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Exited{Exited: &guestv1.Exited{ExitCode: code}}})
			}
		}
		select {
		case <-g.wake:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestWorkspaceShell drives kibo workspace shell through a pseudo-terminal:
// the process starts on a terminal of the local size, a resize reaches it,
// keys (Ctrl-C too) reach it in raw mode, "echo hi; exit 3" prints hi and
// ends kibo with 3, and the local terminal is restored.
func TestWorkspaceShell(t *testing.T) {
	rt := agenttest.New()
	g := &shellGuest{wake: make(chan struct{}, 1)}
	rt.Guest = g
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt})
	c := conn(e)
	waitWorkspaceServed(t, c)
	id := strings.TrimSpace(kibo(t, args(c, "workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "-q", "--wait")...).want(t, ExitOK).stdout)

	master, tty := openPty(t, 24, 80)
	before, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	var stderr bytes.Buffer
	code := make(chan int, 1)
	go func() { code <- run(t.Context(), testEnv(t), args(c, "workspace", "shell", id), tty, tty, &stderr) }()

	waitFor(t, "the prompt", func() bool { mu.Lock(); defer mu.Unlock(); return strings.Contains(out.String(), "$ ") })
	g.mu.Lock()
	argv, pty := g.start.GetArgv(), g.start.GetPty()
	g.mu.Unlock()
	if strings.Join(argv, " ") != "/bin/sh -l" || pty.GetRows() != 24 || pty.GetCols() != 80 {
		t.Errorf("started %q on %v, want /bin/sh -l on 24x80", argv, pty)
	}
	raw, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) != 0 {
		t.Errorf("local terminal not in raw mode: lflag %#x", raw.Lflag)
	}

	setPtySize(t, tty, 30, 100)
	if err := syscall.Kill(os.Getpid(), syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the resize", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return strings.Join(g.sizes, " ") == "24x80 30x100"
	})

	if _, err := master.Write([]byte("\x03echo hi; exit 3\r")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-code:
		if got != 3 {
			t.Errorf("exit code %d, want 3 (stderr %q)", got, stderr.String())
		}
	case <-time.After(20 * time.Second):
		g.mu.Lock()
		t.Fatalf("kibo workspace shell did not end; input %q, stderr %q", g.input, stderr.String())
	}
	g.mu.Lock()
	if in := string(g.input); in != "\x03echo hi; exit 3\r" {
		t.Errorf("input = %q, want Ctrl-C and the line, once", in)
	}
	g.mu.Unlock()
	waitFor(t, "hi", func() bool { mu.Lock(); defer mu.Unlock(); return strings.Contains(out.String(), "hi\r\n") })
	after, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if *after != *before {
		t.Errorf("terminal not restored: %+v, want %+v", after, before)
	}

	// Not a terminal: a usage error naming exec, nothing sent.
	if r := kiboWith(t, testEnv(t), "echo hi\n", args(c, "workspace", "shell", id)...).want(t, ExitUsage); !strings.Contains(r.stderr, "kibo workspace exec") {
		t.Errorf("stderr %q does not suggest exec", r.stderr)
	}
	kibo(t, args(c, "workspace", "shell", id, "sh")...).want(t, ExitUsage)
	// A server without workspace.exec: 14, nothing sent, the terminal untouched.
	bare := ctrltest.New(t, ctrltest.Options{})
	if got := run(t.Context(), testEnv(t), args(conn(bare), "workspace", "shell", id), tty, tty, &stderr); got != ExitUnavailable {
		t.Errorf("without workspace.exec: exit %d, want %d", got, ExitUnavailable)
	}
}
