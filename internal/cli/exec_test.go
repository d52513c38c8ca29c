package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// execGuest is a guest whose processes are named by argv[0]: "echo"
// prints its arguments, "fail" prints to stderr and exits 3, "kill" is
// killed by signal 9, "cat" prints its input once it is closed.
type execGuest struct {
	guestv1connect.UnimplementedProcessServiceHandler
	mu     sync.Mutex
	argv   map[string][]string
	input  map[string][]byte
	closed map[string]chan struct{}
}

func newExecGuest() *execGuest {
	return &execGuest{argv: map[string][]string{}, input: map[string][]byte{}, closed: map[string]chan struct{}{}}
}

func (g *execGuest) Start(_ context.Context, req *connect.Request[guestv1.StartRequest]) (*connect.Response[guestv1.StartResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	id := req.Msg.GetArgv()[0]
	g.argv[id], g.closed[id] = req.Msg.GetArgv(), make(chan struct{})
	return connect.NewResponse(&guestv1.StartResponse{ProcessId: id, Pid: 2}), nil
}

func (g *execGuest) SendInput(_ context.Context, req *connect.Request[guestv1.SendInputRequest]) (*connect.Response[guestv1.SendInputResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.input[req.Msg.GetProcessId()] = append(g.input[req.Msg.GetProcessId()], req.Msg.GetData()...)
	return connect.NewResponse(&guestv1.SendInputResponse{AcceptedBytes: uint64(len(req.Msg.GetData()))}), nil
}

func (g *execGuest) CloseInput(_ context.Context, req *connect.Request[guestv1.CloseInputRequest]) (*connect.Response[guestv1.CloseInputResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.closed[req.Msg.GetProcessId()])
	return connect.NewResponse(&guestv1.CloseInputResponse{}), nil
}

func (g *execGuest) Events(ctx context.Context, req *connect.Request[guestv1.EventsRequest], out *connect.ServerStream[guestv1.EventsResponse]) error {
	id := req.Msg.GetProcessId()
	g.mu.Lock()
	argv, closed := g.argv[id], g.closed[id]
	g.mu.Unlock()
	output := func(stream guestv1.Stream, s string) error {
		return out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Output{Output: &guestv1.Output{Stream: stream, Data: []byte(s)}}})
	}
	exit := &guestv1.Exited{}
	switch id {
	case "echo":
		if err := output(guestv1.Stream_STREAM_STDOUT, strings.Join(argv[1:], " ")+"\n"); err != nil {
			return err
		}
	case "fail":
		if err := output(guestv1.Stream_STREAM_STDERR, "oops\n"); err != nil {
			return err
		}
		exit.ExitCode = 3
	case "kill":
		exit.Signal, exit.SignalName = 9, "SIGKILL"
	case "cat":
		select {
		case <-closed:
		case <-ctx.Done():
			return ctx.Err()
		}
		g.mu.Lock()
		in := string(g.input[id])
		g.mu.Unlock()
		if err := output(guestv1.Stream_STREAM_STDOUT, in); err != nil {
			return err
		}
	}
	return out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Exited{Exited: exit}})
}

// TestWorkspaceExec: kibo workspace exec passes output, input and the
// remote status through, writes --status-file, and before the start exits
// with its own codes.
func TestWorkspaceExec(t *testing.T) {
	t.Parallel()
	rt := agenttest.New()
	rt.Guest = newExecGuest()
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt})
	c := conn(e)
	waitWorkspaceServed(t, c)
	id := strings.TrimSpace(kibo(t, args(c, "workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "-q", "--wait")...).want(t, ExitOK).stdout)
	exec := func(stdin string, rest ...string) result {
		return kiboWith(t, testEnv(t), stdin, args(c, append([]string{"workspace", "exec", id}, rest...)...)...)
	}
	if r := exec("", "--", "echo", "hi", "there").want(t, ExitOK); r.stdout != "hi there\n" || r.stderr != "" {
		t.Errorf("echo: stdout %q, stderr %q", r.stdout, r.stderr)
	}
	dir := t.TempDir()
	status := filepath.Join(dir, "status.json")
	if r := exec("", "--status-file", status, "--", "fail").want(t, 3); r.stderr != "oops\n" {
		t.Errorf("fail: stderr %q", r.stderr)
	}
	if b, _ := os.ReadFile(status); string(b) != `{"exit_code":3}`+"\n" {
		t.Errorf("status file = %q", b)
	}
	exec("", "--status-file", status, "--", "kill").want(t, 128+9)
	if b, _ := os.ReadFile(status); string(b) != `{"signal":9}`+"\n" {
		t.Errorf("status file = %q", b)
	}
	if r := exec("typed line\n", "--", "cat").want(t, ExitOK); r.stdout != "typed line\n" {
		t.Errorf("cat: stdout %q", r.stdout)
	}
	exec("", "--status-file", status, "--", "echo", "hi").want(t, ExitOK)
	if b, _ := os.ReadFile(status); string(b) != `{"exit_code":0}`+"\n" {
		t.Errorf("status file = %q", b)
	}
	// Before the start: kibo's own exit codes.
	kibo(t, args(c, "workspace", "exec", "ws-unknownunknownunkn", "--", "true")...).want(t, int(connect.CodeNotFound))
	r := kibo(t, args(c, "workspace", "exec", id, "--status-file", status, "--ttl", "1s", "--", "true")...).want(t, int(connect.CodeInvalidArgument))
	if b, _ := os.ReadFile(status); !strings.HasPrefix(string(b), `{"error":`) {
		t.Errorf("status file after a refusal = %q (stderr %s)", b, r.stderr)
	}
	kibo(t, args(c, "workspace", "exec", id, "echo")...).want(t, ExitUsage)
	kibo(t, args(c, "workspace", "stop", id, "--expected-expiration-revision", "current")...).want(t, ExitOK)
	exec("", "--", "true").want(t, int(connect.CodeFailedPrecondition))

	// A server without workspace.exec (no node): 14, nothing sent.
	bare := ctrltest.New(t, ctrltest.Options{})
	kibo(t, args(conn(bare), "workspace", "exec", id, "--", "true")...).want(t, ExitUnavailable)
}
