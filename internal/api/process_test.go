package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// fakeGuest is a guest ProcessService: argv[0] "echo" prints its
// arguments and exits 0, "exit" exits with 3, "sleep" runs until the
// stream is cancelled; its input buffer takes 4 bytes.
type fakeGuest struct {
	guestv1connect.UnimplementedProcessServiceHandler
}

func (fakeGuest) Start(_ context.Context, req *connect.Request[guestv1.StartRequest]) (*connect.Response[guestv1.StartResponse], error) {
	return connect.NewResponse(&guestv1.StartResponse{ProcessId: req.Msg.GetArgv()[0], Pid: 7}), nil
}

func (fakeGuest) Events(ctx context.Context, req *connect.Request[guestv1.EventsRequest], out *connect.ServerStream[guestv1.EventsResponse]) error {
	send := func(ev *guestv1.EventsResponse) error { return out.Send(ev) }
	if err := send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Started{Started: &guestv1.Started{Pid: 7}}}); err != nil {
		return err
	}
	switch req.Msg.GetProcessId() {
	case "echo":
		if err := send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Output{Output: &guestv1.Output{Stream: guestv1.Stream_STREAM_STDOUT, Data: []byte("hi\n")}}}); err != nil {
			return err
		}
		return send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Exited{Exited: &guestv1.Exited{EndOffset: 3}}})
	case "exit":
		return send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Exited{Exited: &guestv1.Exited{ExitCode: 3}}})
	case "sleep":
		<-ctx.Done()
		return ctx.Err()
	}
	return connect.NewError(connect.CodeNotFound, nil)
}

func (fakeGuest) SendInput(_ context.Context, req *connect.Request[guestv1.SendInputRequest]) (*connect.Response[guestv1.SendInputResponse], error) {
	accepted := uint64(4)
	if req.Msg.GetProcessId() == "liar" { // claims more than it was sent
		accepted = 1 << 40
		if len(req.Msg.GetData()) <= 4 {
			return connect.NewResponse(&guestv1.SendInputResponse{AcceptedBytes: accepted}), nil
		}
	}
	if n := len(req.Msg.GetData()); n > 4 {
		ce := connect.NewError(connect.CodeResourceExhausted, nil)
		if d, err := connect.NewErrorDetail(&guestv1.SendInputResponse{AcceptedBytes: accepted, InputOffset: 4}); err == nil {
			ce.AddDetail(d)
		}
		return nil, ce
	}
	return connect.NewResponse(&guestv1.SendInputResponse{AcceptedBytes: uint64(len(req.Msg.GetData()))}), nil
}

func bearerReq[T any](msg *T, tok string) *connect.Request[T] {
	r := connect.NewRequest(msg)
	if tok != "" {
		r.Header().Set("Authorization", "Bearer "+tok)
	}
	return r
}

// events collects a stream's output and exit.
func events(t *testing.T, p ctrlv1connect.ProcessServiceClient, ws, id, tok string) (string, *ctrlv1.ProcessExited, error) {
	t.Helper()
	s, err := p.ProcessEvents(t.Context(), bearerReq(&ctrlv1.ProcessEventsRequest{WorkspaceId: ws, ProcessId: id}, tok))
	if err != nil {
		return "", nil, err
	}
	defer s.Close()
	var out string
	var exit *ctrlv1.ProcessExited
	for s.Receive() {
		out += string(s.Msg().GetOutput().GetData())
		if e := s.Msg().GetExited(); e != nil {
			exit = e
		}
	}
	return out, exit, s.Err()
}

// TestProcessService: the public ProcessService over a data-plane token
// and no client certificate, forwarded to the workspace's guest over the
// node's data tunnel; the refusals of the token and the Workspace; a
// revocation ends an open stream.
func TestProcessService(t *testing.T) {
	t.Parallel()
	rt := agenttest.New()
	rt.Guest = fakeGuest{}
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt, DataPlane: true})
	c := e.Clients(e.HTTP)
	ctx := t.Context()
	w, _ := createWS(t, c, "proc-create")
	ws := w.GetWorkspaceId()
	waitCommand(t, c, "proc-create")
	session := func(id, ws string, scopes ...ctrlv1.DataPlaneScope) string {
		r, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq(id, ws, time.Hour, scopes...)))
		if err != nil {
			t.Fatalf("CreateDataPlaneSession(%s) = %v", id, err)
		}
		return r.Msg.GetSession().GetToken()
	}
	tok := session("proc-s1", ws, scopeExec)
	// No client certificate: the token is the credential.
	p := ctrlv1connect.NewProcessServiceClient(e.Client(t, "", ""), e.URL)

	st, err := p.StartProcess(ctx, bearerReq(&ctrlv1.StartProcessRequest{WorkspaceId: ws, Argv: []string{"echo", "hi"}}, tok))
	if err != nil || st.Msg.GetProcessId() != "echo" || st.Msg.GetPid() != 7 {
		t.Fatalf("StartProcess = %v, %v", st, err)
	}
	if out, exit, err := events(t, p, ws, "echo", tok); err != nil || out != "hi\n" || exit == nil || exit.GetExitCode() != 0 {
		t.Fatalf("ProcessEvents(echo) = %q, %v, %v", out, exit, err)
	}
	if _, exit, err := events(t, p, ws, "exit", tok); err != nil || exit.GetExitCode() != 3 {
		t.Fatalf("ProcessEvents(exit) = %v, %v; want exit code 3", exit, err)
	}
	_, _, err = events(t, p, ws, "unknown", tok)
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("ProcessEvents(unknown) = %v, want not_found", err)
	}
	in, err := p.SendInput(ctx, bearerReq(&ctrlv1.SendInputRequest{WorkspaceId: ws, ProcessId: "echo", Data: []byte("ab")}, tok))
	if err != nil || in.Msg.GetAcceptedBytes() != 2 {
		t.Fatalf("SendInput(2 bytes) = %v, %v", in, err)
	}
	_, err = p.SendInput(ctx, bearerReq(&ctrlv1.SendInputRequest{WorkspaceId: ws, ProcessId: "echo", Data: []byte("0123456789")}, tok))
	if d := wantErr(t, err, connect.CodeResourceExhausted, ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, false); d.GetAcceptedBytes() != 4 {
		t.Errorf("accepted_bytes = %d, want 4", d.GetAcceptedBytes())
	}
	// A guest claiming more bytes than it was sent is cut to what it was sent.
	in, err = p.SendInput(ctx, bearerReq(&ctrlv1.SendInputRequest{WorkspaceId: ws, ProcessId: "liar", Data: []byte("ab")}, tok))
	if err != nil || in.Msg.GetAcceptedBytes() != 2 {
		t.Errorf("SendInput(liar, 2 bytes) = %v, %v; want accepted_bytes 2", in, err)
	}
	_, err = p.SendInput(ctx, bearerReq(&ctrlv1.SendInputRequest{WorkspaceId: ws, ProcessId: "liar", Data: []byte("0123456789")}, tok))
	if d := wantErr(t, err, connect.CodeResourceExhausted, ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, false); d.GetAcceptedBytes() != 10 {
		t.Errorf("SendInput(liar, 10 bytes): accepted_bytes = %d, want 10", d.GetAcceptedBytes())
	}

	// Refusals.
	other, _ := createWS(t, c, "proc-create-other")
	fsTok := session("proc-s-fs", ws, scopeFS)
	doomed, _ := createWS(t, c, "proc-create-doomed")
	waitCommand(t, c, "proc-create-doomed")
	doomedTok := session("proc-s-doomed", doomed.GetWorkspaceId(), scopeExec)
	if _, err := c.Workspace.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("proc-delete"), WorkspaceId: doomed.GetWorkspaceId(), ExpectedExpirationRevision: 1})); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, doomed.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
	for _, tc := range []struct {
		name, ws, tok string
		code          connect.Code
		reason        ctrlv1.FailureReason
	}{
		{"no token", ws, "", connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED},
		{"forged token", ws, tok[:len(tok)-4] + "AAAA", connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED},
		{"garbage token", ws, "kbd1.x.y", connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED},
		{"another workspace", other.GetWorkspaceId(), tok, connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED},
		{"unknown workspace", "ws-unknown", tok, connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED},
		{"filesystem scope", ws, fsTok, connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED},
		{"deleted workspace", doomed.GetWorkspaceId(), doomedTok, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND},
	} {
		_, err := p.ListProcesses(ctx, bearerReq(&ctrlv1.ListProcessesRequest{WorkspaceId: tc.ws}, tc.tok))
		if ce := new(connect.Error); err != nil && errorsAs(err, &ce) && ce.Message() != "" && containsRoute(ce.Message()) {
			t.Errorf("%s: message %q names the internal route", tc.name, ce.Message())
		}
		t.Run(tc.name, func(t *testing.T) { wantErr(t, err, tc.code, tc.reason, false) })
	}

	// Revocation ends an open stream; the old token is refused, a new one
	// works.
	s, err := p.ProcessEvents(ctx, bearerReq(&ctrlv1.ProcessEventsRequest{WorkspaceId: ws, ProcessId: "sleep"}, tok))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetStarted() == nil {
		t.Fatalf("first event = %v, %v; want started", s.Msg(), s.Err())
	}
	if _, err := c.Workspace.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(revokeReq("proc-revoke", ws))); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for s.Receive() {
		}
		ended <- s.Err()
	}()
	select {
	case err := <-ended:
		wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED, false)
	case <-time.After(5 * time.Second):
		t.Fatal("the stream of a revoked token is still open after 5s")
	}
	_, err = p.ListProcesses(ctx, bearerReq(&ctrlv1.ListProcessesRequest{WorkspaceId: ws}, tok))
	wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED, false)
	fresh := session("proc-s2", ws, scopeExec)
	if _, exit, err := events(t, p, ws, "echo", fresh); err != nil || exit == nil {
		t.Fatalf("ProcessEvents with a new token = %v, %v", exit, err)
	}

	// Not AVAILABLE: failed_precondition with the observed Workspace.
	if _, err := stopWS(c, t, "proc-stop", getWS(t, c, ws), false); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, ws, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	_, err = p.StartProcess(ctx, bearerReq(&ctrlv1.StartProcessRequest{WorkspaceId: ws, Argv: []string{"echo"}}, fresh))
	d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, false)
	if d.GetObservedWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Errorf("observed_workspace = %v, want the STOPPED workspace", d.GetObservedWorkspace())
	}

	// The Workspace API still needs the operator certificate.
	_, err = ctrlv1connect.NewWorkspaceServiceClient(e.Client(t, "", ""), e.URL).GetWorkspace(ctx,
		bearerReq(&ctrlv1.GetWorkspaceRequest{WorkspaceId: ws}, fresh))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("GetWorkspace with a token and no certificate = %v, want unauthenticated", err)
	}
}

// TestProcessWireTwins: the public messages the handler transcodes from
// the guest's have the same wire form.
func TestProcessWireTwins(t *testing.T) {
	for _, tc := range []struct{ guest, public proto.Message }{
		{&guestv1.StartResponse{ProcessId: "p", Pid: 3, Existing: true}, &ctrlv1.StartProcessResponse{ProcessId: "p", Pid: 3, Existing: true}},
		{&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Output{Output: &guestv1.Output{Stream: 2, Offset: 5, Data: []byte("x")}}},
			&ctrlv1.ProcessEventsResponse{Event: &ctrlv1.ProcessEventsResponse_Output{Output: &ctrlv1.ProcessOutput{Stream: 2, Offset: 5, Data: []byte("x")}}}},
		{&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Exited{Exited: &guestv1.Exited{ExitCode: 1, Signal: 9, SignalName: "SIGKILL", EndOffset: 4}}},
			&ctrlv1.ProcessEventsResponse{Event: &ctrlv1.ProcessEventsResponse_Exited{Exited: &ctrlv1.ProcessExited{ExitCode: 1, Signal: 9, SignalName: "SIGKILL", EndOffset: 4}}}},
		{&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Dropped{Dropped: &guestv1.Dropped{Offset: 1, Bytes: 2}}},
			&ctrlv1.ProcessEventsResponse{Event: &ctrlv1.ProcessEventsResponse_Dropped{Dropped: &ctrlv1.ProcessOutputDropped{Offset: 1, Bytes: 2}}}},
		{&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Started{Started: &guestv1.Started{Pid: 4}}},
			&ctrlv1.ProcessEventsResponse{Event: &ctrlv1.ProcessEventsResponse_Started{Started: &ctrlv1.ProcessStarted{Pid: 4}}}},
		{&guestv1.SendInputResponse{AcceptedBytes: 3, InputOffset: 9}, &ctrlv1.SendInputResponse{AcceptedBytes: 3, InputOffset: 9}},
		{&guestv1.ListResponse{Processes: []*guestv1.ProcessInfo{{ProcessId: "p", Tag: "t", Argv: []string{"a"}, Pid: 2, Running: true,
			Exited: &guestv1.Exited{ExitCode: 2}, Pty: true, OutputOffset: 8}}},
			&ctrlv1.ListProcessesResponse{Processes: []*ctrlv1.ProcessInfo{{ProcessId: "p", Tag: "t", Argv: []string{"a"}, Pid: 2, Running: true,
				Exited: &ctrlv1.ProcessExited{ExitCode: 2}, Pty: true, OutputOffset: 8}}}},
	} {
		b, err := proto.Marshal(tc.guest)
		if err != nil {
			t.Fatal(err)
		}
		got := tc.public.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(b, got); err != nil || !proto.Equal(got, tc.public) {
			t.Errorf("%T → %T = %v, %v; want %v", tc.guest, tc.public, got, err, tc.public)
		}
	}
}

var _ = http.StatusOK

func errorsAs(err error, target **connect.Error) bool {
	ce, ok := err.(*connect.Error)
	if ok {
		*target = ce
	}
	return ok
}

// containsRoute: a message that names the internal route (nodes, tunnels,
// guests).
func containsRoute(msg string) bool {
	for _, w := range []string{"node", "tunnel", "guest"} {
		if strings.Contains(strings.ToLower(msg), w) {
			return true
		}
	}
	return false
}
