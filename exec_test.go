package kibotos_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// fakeGuest is a guest ProcessService that knows a few programs:
//
//	echo ARGS...    prints ARGS and a newline, exits 0
//	sh -c 'echo X'  prints X and a newline, exits 0
//	sh -c 'exit N'  exits with N (no other script)
//	exit N          exits with N
//	warn            prints "out" on stdout, "err" on stderr, exits 1
//	kill            is killed by signal 9
//	drop            prints "a", drops 5 bytes, prints "b", exits 0
//	cat             copies its input to its output until CloseInput
//	sleep           runs until signalled
//
// Its input buffer takes 4 bytes per SendInput, so that longer input is
// refused with resource_exhausted and accepted_bytes 4; WriteInput takes
// every byte (unimplemented when noStream, as a server of an earlier
// release).
type fakeGuest struct {
	guestv1connect.UnimplementedProcessServiceHandler
	noStream bool
	streams  atomic.Int64 // WriteInput streams served
	next     atomic.Int64
	mu       sync.Mutex
	procs    map[string]*fakeProc
}

type fakeProc struct {
	argv    []string
	env     []string
	dir     string
	mu      sync.Mutex
	input   []byte
	closed  bool
	signal  int32
	changed chan struct{} // closed and replaced at every change
}

func newFakeGuest() *fakeGuest { return &fakeGuest{procs: map[string]*fakeProc{}} }

func (g *fakeGuest) proc(id string) (*fakeProc, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.procs[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no process %s", id))
	}
	return p, nil
}

func (p *fakeProc) update(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
	close(p.changed)
	p.changed = make(chan struct{})
}

func (g *fakeGuest) Start(_ context.Context, req *connect.Request[guestv1.StartRequest]) (*connect.Response[guestv1.StartResponse], error) {
	id := fmt.Sprintf("p%d", g.next.Add(1))
	g.mu.Lock()
	g.procs[id] = &fakeProc{argv: req.Msg.GetArgv(), env: req.Msg.GetEnv(), dir: req.Msg.GetWorkingDirectory(), changed: make(chan struct{})}
	g.mu.Unlock()
	return connect.NewResponse(&guestv1.StartResponse{ProcessId: id, Pid: 7}), nil
}

func (g *fakeGuest) Events(ctx context.Context, req *connect.Request[guestv1.EventsRequest], out *connect.ServerStream[guestv1.EventsResponse]) error {
	p, err := g.proc(req.Msg.GetProcessId())
	if err != nil {
		return err
	}
	from := req.Msg.GetFromOffset()
	var off uint64
	output := func(s guestv1.Stream, data string) error {
		o, d := off, []byte(data)
		off += uint64(len(d))
		if off <= from {
			return nil
		}
		return out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Output{Output: &guestv1.Output{Stream: s, Offset: o, Data: d}}})
	}
	exit := func(code, sig int32) error {
		return out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Exited{Exited: &guestv1.Exited{ExitCode: code, Signal: sig, EndOffset: off}}})
	}
	if err := out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Started{Started: &guestv1.Started{Pid: 7}}}); err != nil {
		return err
	}
	argv := p.argv
	switch argv[0] {
	case "echo":
		if err := output(guestv1.Stream_STREAM_STDOUT, strings.Join(argv[1:], " ")+"\n"); err != nil {
			return err
		}
		return exit(0, 0)
	case "env":
		if err := output(guestv1.Stream_STREAM_STDOUT, p.dir+" "+strings.Join(p.env, " ")+"\n"); err != nil {
			return err
		}
		return exit(0, 0)
	case "sh":
		if len(argv) == 3 && argv[1] == "-c" && strings.HasPrefix(argv[2], "echo ") {
			if err := output(guestv1.Stream_STREAM_STDOUT, strings.TrimPrefix(argv[2], "echo ")+"\n"); err != nil {
				return err
			}
			return exit(0, 0)
		}
		if len(argv) == 3 && argv[1] == "-c" && strings.HasPrefix(argv[2], "exit ") {
			n, _ := strconv.Atoi(strings.TrimPrefix(argv[2], "exit "))
			return exit(int32(n), 0)
		}
		return exit(127, 0)
	case "exit":
		n, _ := strconv.Atoi(argv[1])
		return exit(int32(n), 0)
	case "warn":
		if err := output(guestv1.Stream_STREAM_STDOUT, "out\n"); err != nil {
			return err
		}
		if err := output(guestv1.Stream_STREAM_STDERR, "err\n"); err != nil {
			return err
		}
		return exit(1, 0)
	case "kill":
		return exit(0, 9)
	case "drop":
		if err := output(guestv1.Stream_STREAM_STDOUT, "a"); err != nil {
			return err
		}
		if err := out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Dropped{Dropped: &guestv1.Dropped{Offset: off, Bytes: 5}}}); err != nil {
			return err
		}
		off += 5
		if err := output(guestv1.Stream_STREAM_STDOUT, "b"); err != nil {
			return err
		}
		return exit(0, 0)
	case "cat", "sleep":
		for {
			p.mu.Lock()
			in, closed, sig, changed := string(p.input), p.closed, p.signal, p.changed
			p.mu.Unlock()
			for argv[0] == "cat" && uint64(len(in)) > off {
				// Chunks of at most 32 KiB, as the guest sends them.
				if err := output(guestv1.Stream_STREAM_STDOUT, in[off:min(uint64(len(in)), off+32<<10)]); err != nil {
					return err
				}
			}
			switch {
			case sig != 0:
				return exit(0, sig)
			case closed && argv[0] == "cat":
				return exit(0, 0)
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return exit(127, 0)
}

func (g *fakeGuest) SendInput(_ context.Context, req *connect.Request[guestv1.SendInputRequest]) (*connect.Response[guestv1.SendInputResponse], error) {
	p, err := g.proc(req.Msg.GetProcessId())
	if err != nil {
		return nil, err
	}
	data := req.Msg.GetData()
	var took int
	p.update(func() {
		if req.Msg.GetOffset() != uint64(len(p.input)) {
			return
		}
		took = min(len(data), 4)
		p.input = append(p.input, data[:took]...)
	})
	if took < len(data) {
		ce := connect.NewError(connect.CodeResourceExhausted, errors.New("input buffer full"))
		if d, err := connect.NewErrorDetail(&guestv1.SendInputResponse{AcceptedBytes: uint64(took)}); err == nil {
			ce.AddDetail(d)
		}
		return nil, ce
	}
	return connect.NewResponse(&guestv1.SendInputResponse{AcceptedBytes: uint64(took)}), nil
}

func (g *fakeGuest) WriteInput(ctx context.Context, in *connect.ClientStream[guestv1.WriteInputRequest]) (*connect.Response[guestv1.WriteInputResponse], error) {
	if g.noStream {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("no WriteInput"))
	}
	g.streams.Add(1)
	var p *fakeProc
	var off, accepted uint64
	for first := true; in.Receive(); first = false {
		m := in.Msg()
		if first {
			var err error
			if p, err = g.proc(m.GetProcessId()); err != nil {
				return nil, err
			}
			off = m.GetOffset()
		}
		data := m.GetData()
		p.update(func() {
			skip := min(uint64(len(p.input))-min(off, uint64(len(p.input))), uint64(len(data)))
			p.input = append(p.input, data[skip:]...)
			if m.GetCloseInput() {
				p.closed = true
			}
		})
		off += uint64(len(data))
		accepted += uint64(len(data))
	}
	if err := in.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&guestv1.WriteInputResponse{AcceptedBytes: accepted, InputOffset: off}), nil
}

func (g *fakeGuest) CloseInput(_ context.Context, req *connect.Request[guestv1.CloseInputRequest]) (*connect.Response[guestv1.CloseInputResponse], error) {
	p, err := g.proc(req.Msg.GetProcessId())
	if err != nil {
		return nil, err
	}
	p.update(func() { p.closed = true })
	return connect.NewResponse(&guestv1.CloseInputResponse{}), nil
}

func (g *fakeGuest) Signal(_ context.Context, req *connect.Request[guestv1.SignalRequest]) (*connect.Response[guestv1.SignalResponse], error) {
	p, err := g.proc(req.Msg.GetProcessId())
	if err != nil {
		return nil, err
	}
	p.update(func() { p.signal = req.Msg.GetSignal() })
	return connect.NewResponse(&guestv1.SignalResponse{}), nil
}

// execEnv is a ctrl with the data plane and a node whose guests are a
// fakeGuest, a client, and an AVAILABLE Workspace.
func execEnv(t *testing.T, opts ...kibotos.Option) (*kibotos.Client, *kibotos.Workspace) {
	t.Helper()
	return execEnvGuest(t, newFakeGuest(), opts...)
}

// execEnvGuest is execEnv with the guest g.
func execEnvGuest(t *testing.T, g *fakeGuest, opts ...kibotos.Option) (*kibotos.Client, *kibotos.Workspace) {
	t.Helper()
	rt := agenttest.New()
	rt.Guest = g
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt, DataPlane: true})
	if err := waitForCapability(e, capability.WorkspaceCreate); err != nil {
		t.Fatal(err)
	}
	c, err := kibotos.NewClient(e.URL, append([]kibotos.Option{kibotos.WithTLSFiles(e.PKI.CA, e.PKI.Operator, e.PKI.OperatorKey)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ws, err := c.Workspaces().Create(t.Context(), kibotos.WorkspaceSpec{MemoryMiB: 256, CPUMillis: 500})
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	return c, ws
}

// TestExec runs processes through Workspace.ExecCommand against a real
// ctrl, its data plane and the node's data tunnel.
func TestExec(t *testing.T) {
	t.Parallel()
	_, ws := execEnv(t)
	ctx := t.Context()

	t.Run("Output", func(t *testing.T) {
		out, err := ws.ExecCommand(ctx, "sh", "-c", "echo hi").Output()
		if err != nil || string(out) != "hi\n" {
			t.Fatalf("Output() = %q, %v; want %q", out, err, "hi\n")
		}
	})
	t.Run("EnvDir", func(t *testing.T) {
		cmd := ws.ExecCommand(ctx, "env")
		cmd.Env, cmd.Dir = []string{"A=1", "B=2"}, "/work"
		out, err := cmd.Output()
		if err != nil || string(out) != "/work A=1 B=2\n" {
			t.Fatalf("Output() = %q, %v", out, err)
		}
	})
	t.Run("ExitCode", func(t *testing.T) {
		err := ws.ExecCommand(ctx, "exit", "3").Run()
		var ee *kibotos.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 || ee.Signal() != 0 || err.Error() != "exit status 3" {
			t.Fatalf("Run(exit 3) = %v, want *ExitError with code 3", err)
		}
	})
	t.Run("Signal", func(t *testing.T) {
		err := ws.ExecCommand(ctx, "kill").Run()
		var ee *kibotos.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != -1 || ee.Signal() != syscall.Signal(9) {
			t.Fatalf("Run(kill) = %v, want *ExitError with signal 9 and code -1", err)
		}
	})
	t.Run("OutputStderr", func(t *testing.T) {
		out, err := ws.ExecCommand(ctx, "warn").Output()
		var ee *kibotos.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || string(ee.Stderr) != "err\n" || string(out) != "out\n" {
			t.Fatalf("Output(warn) = %q, %v (stderr %q)", out, err, ee.Stderr)
		}
	})
	t.Run("CombinedOutput", func(t *testing.T) {
		out, err := ws.ExecCommand(ctx, "warn").CombinedOutput()
		if string(out) != "out\nerr\n" || err == nil {
			t.Fatalf("CombinedOutput(warn) = %q, %v", out, err)
		}
	})
	t.Run("Stdin", func(t *testing.T) {
		// Streamed (WriteInput): 3 MiB, across several streams (one is
		// closed and confirmed every MiB).
		in := bytes.Repeat([]byte("0123456789abcdef"), 3<<16)
		cmd := ws.ExecCommand(ctx, "cat")
		cmd.Stdin = bytes.NewReader(in)
		out, err := cmd.Output()
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("cat: %d bytes out of %d, %v", len(out), len(in), err)
		}
	})
	t.Run("StdinUnary", func(t *testing.T) {
		// A server without WriteInput: every SendInput is refused past 4
		// bytes with resource_exhausted, and resumed from accepted_bytes.
		g := newFakeGuest()
		g.noStream = true
		_, ws := execEnvGuest(t, g)
		in := bytes.Repeat([]byte("0123456789abcdef"), 10)
		cmd := ws.ExecCommand(ctx, "cat")
		cmd.Stdin = bytes.NewReader(in)
		out, err := cmd.Output()
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("cat: %d bytes out of %d, %v", len(out), len(in), err)
		}
	})
	t.Run("NilStdinClosesInput", func(t *testing.T) {
		if out, err := ws.ExecCommand(ctx, "cat").Output(); err != nil || len(out) != 0 {
			t.Fatalf("cat with nil Stdin = %q, %v", out, err)
		}
	})
	t.Run("StartWait", func(t *testing.T) {
		var out bytes.Buffer
		cmd := ws.ExecCommand(ctx, "echo", "started")
		cmd.Stdout = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.ProcessID() == "" {
			t.Error("ProcessID() empty after Start")
		}
		if err := cmd.Wait(); err != nil || out.String() != "started\n" || cmd.Exited() == nil {
			t.Fatalf("Wait = %v, out %q, exited %v", err, out.String(), cmd.Exited())
		}
		if err := cmd.Wait(); err == nil {
			t.Error("second Wait = nil, want an error")
		}
	})
	t.Run("Dropped", func(t *testing.T) {
		cmd := ws.ExecCommand(ctx, "drop")
		out, err := cmd.Output()
		var de *kibotos.OutputDroppedError
		if !errors.As(err, &de) || de.Bytes != 5 || string(out) != "ab" || cmd.DroppedBytes() != 5 {
			t.Fatalf("Output(drop) = %q, %v; want ab and *OutputDroppedError{5}", out, err)
		}
	})
	t.Run("ContextKills", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cmd := ws.ExecCommand(cctx, "sleep")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := cmd.Wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait after cancel = %v, want context.Canceled", err)
		}
	})
	t.Run("OwnToken", func(t *testing.T) {
		cmd := ws.ExecCommand(ctx, "echo", "x")
		cmd.Token = "not-a-token"
		err := cmd.Run()
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("Run with a bad token = %v, want unauthenticated", err)
		}
	})
}

// TestExecMissingCapability: a server that does not offer workspace.exec
// (no node registered yet) gets no request but GetServerInfo; the error
// names the capability.
func TestExecMissingCapability(t *testing.T) {
	e := ctrltest.New(t, ctrltest.Options{})
	var sent []string
	var mu sync.Mutex
	count := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			mu.Lock()
			sent = append(sent, r.Spec().Procedure)
			mu.Unlock()
			return next(ctx, r)
		}
	})
	c, err := kibotos.NewClient(e.URL, kibotos.WithTLSFiles(e.PKI.CA, e.PKI.Operator, e.PKI.OperatorKey),
		kibotos.WithConnectOptions(connect.WithInterceptors(count)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Workspaces().Handle("ws-0123456789abcdefghij").ExecCommand(t.Context(), "true").Run()
	var me *kibotos.MissingCapabilityError
	if !errors.As(err, &me) || me.Capability != capability.WorkspaceExec {
		t.Fatalf("Run = %v, want *MissingCapabilityError for workspace.exec", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1 || sent[0] != "/kibotos.ctrl.v1.ServerInfoService/GetServerInfo" {
		t.Errorf("sent %v, want GetServerInfo only", sent)
	}
}

// TestExecSessionRenewal: the session a Cmd creates (10s, the shortest)
// expires while the process runs; the Cmd creates another and goes on
// sending input and reading events from where it was.
func TestExecSessionRenewal(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 11s for a session to expire")
	}
	t.Parallel()
	var sessions atomic.Int32
	count := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			if r.Spec().Procedure == "/kibotos.ctrl.v1.SessionService/CreateDataPlaneSession" {
				sessions.Add(1)
			}
			return next(ctx, r)
		}
	})
	_, ws := execEnv(t, kibotos.WithConnectOptions(connect.WithInterceptors(count)))
	pr, pw := io.Pipe()
	cmd := ws.ExecCommand(t.Context(), "cat")
	cmd.Stdin, cmd.SessionTTL = pr, 10*time.Second
	var out ctrltest.SyncBuffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := pw.Write([]byte("before ")); err != nil {
		t.Fatal(err)
	}
	// The server's clock decides the expiry: wait past it.
	time.Sleep(11 * time.Second)
	if _, err := pw.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := cmd.Wait(); err != nil || out.String() != "before after" {
		t.Fatalf("Wait = %v, out %q; want nil, %q", err, out.String(), "before after")
	}
	if n := sessions.Load(); n < 2 {
		t.Errorf("%d sessions created, want a renewal", n)
	}
}
