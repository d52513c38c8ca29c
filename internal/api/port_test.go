package api_test

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	"github.com/kibotos/kibotos/internal/api"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// fakePorts is a guest PortService: port 7 echoes until close_write, then
// sends remote_closed; port 9 has no listener; port 11 connects and sends
// one chunk of 100 KiB (over the public bound), then holds the connection
// until the call ends.
type fakePorts struct {
	guestv1connect.UnimplementedPortServiceHandler
}

func (fakePorts) Forward(ctx context.Context, s *connect.BidiStream[guestv1.ForwardRequest, guestv1.ForwardResponse]) error {
	first, err := s.Receive()
	if err != nil {
		return err
	}
	if len(first.ProtoReflect().GetUnknown()) > 0 {
		return connect.NewError(connect.CodeInternal, errors.New("the workspace_id reached the guest"))
	}
	connected := &guestv1.ForwardResponse{Event: &guestv1.ForwardResponse_Connected{Connected: &guestv1.PortConnected{
		Address: fmt.Sprintf("127.0.0.1:%d", first.GetPort())}}}
	switch first.GetPort() {
	case 7:
		if err := s.Send(connected); err != nil {
			return err
		}
		m := first
		for {
			if len(m.GetData()) > 0 {
				if err := s.Send(&guestv1.ForwardResponse{Event: &guestv1.ForwardResponse_Data{Data: m.GetData()}}); err != nil {
					return err
				}
			}
			if m.GetCloseWrite() {
				if err := s.Send(&guestv1.ForwardResponse{Event: &guestv1.ForwardResponse_RemoteClosed{RemoteClosed: &guestv1.PortRemoteClosed{}}}); err != nil {
					return err
				}
			}
			if m, err = s.Receive(); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return err
			}
		}
	case 9:
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("nothing listens on port 9 in the workspace"))
	case 11:
		if err := s.Send(connected); err != nil {
			return err
		}
		if err := s.Send(&guestv1.ForwardResponse{Event: &guestv1.ForwardResponse_Data{Data: make([]byte, 100<<10)}}); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("nothing listens on port %d in the workspace", first.GetPort()))
}

// forward opens a ForwardPort stream with tok and sends its first message.
func forward(ctx context.Context, p ctrlv1connect.PortForwardServiceClient, tok string, first *ctrlv1.ForwardPortRequest) *connect.BidiStreamForClient[ctrlv1.ForwardPortRequest, ctrlv1.ForwardPortResponse] {
	s := p.ForwardPort(ctx)
	if tok != "" {
		s.RequestHeader().Set("Authorization", "Bearer "+tok)
	}
	_ = s.Send(first)
	return s
}

// TestPortForwardService: the public PortForwardService over a data-plane
// token with the exec scope and no client certificate, forwarded to the
// workspace's guest; the guest's refusal passes, its oversized chunks are
// cut; the refusals of admission; a revocation ends an open forward; an
// HTTP/1.1 client cannot forward.
func TestPortForwardService(t *testing.T) {
	t.Parallel()
	rt := agenttest.New()
	path, h := guestv1connect.NewPortServiceHandler(fakePorts{})
	rt.GuestServices = map[string]http.Handler{path: h}
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt, DataPlane: true})
	c := e.Clients(e.HTTP)
	ctx := t.Context()
	w, _ := createWS(t, c, "pf-create")
	ws := w.GetWorkspaceId()
	waitCommand(t, c, "pf-create")
	session := func(id string, scopes ...ctrlv1.DataPlaneScope) string {
		r, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq(id, ws, time.Hour, scopes...)))
		if err != nil {
			t.Fatalf("CreateDataPlaneSession(%s) = %v", id, err)
		}
		return r.Msg.GetSession().GetToken()
	}
	tok := session("pf-s1", scopeExec)
	p := ctrlv1connect.NewPortForwardServiceClient(e.Client(t, "", ""), e.URL, connect.WithGRPC())

	// Echo, half-close, end.
	s := forward(ctx, p, tok, &ctrlv1.ForwardPortRequest{WorkspaceId: ws, Port: 7, Data: []byte("one ")})
	if m, err := s.Receive(); err != nil || m.GetConnected().GetAddress() != "127.0.0.1:7" {
		t.Fatalf("first response = %v, %v; want connected", m, err)
	}
	_ = s.Send(&ctrlv1.ForwardPortRequest{Data: []byte("two")})
	_ = s.Send(&ctrlv1.ForwardPortRequest{CloseWrite: true})
	var got []byte
	var closed bool
	for !closed {
		m, err := s.Receive()
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		got = append(got, m.GetData()...)
		closed = m.GetRemoteClosed() != nil
	}
	_ = s.CloseRequest()
	if _, err := s.Receive(); !errors.Is(err, io.EOF) {
		t.Errorf("end = %v, want a clean end", err)
	}
	_ = s.CloseResponse()
	if string(got) != "one two" {
		t.Errorf("echoed %q", got)
	}

	// The guest's refusal; the checks of the first message.
	for _, tc := range []struct {
		name  string
		first *ctrlv1.ForwardPortRequest
		code  connect.Code
	}{
		{"nothing listens", &ctrlv1.ForwardPortRequest{WorkspaceId: ws, Port: 9}, connect.CodeFailedPrecondition},
		{"port 0", &ctrlv1.ForwardPortRequest{WorkspaceId: ws}, connect.CodeInvalidArgument},
		{"port 65536", &ctrlv1.ForwardPortRequest{WorkspaceId: ws, Port: 65536}, connect.CodeInvalidArgument},
		{"chunk over 64 KiB", &ctrlv1.ForwardPortRequest{WorkspaceId: ws, Port: 7, Data: make([]byte, api.MaxPortChunk+1)}, connect.CodeInvalidArgument},
		{"no workspace_id", &ctrlv1.ForwardPortRequest{Port: 7}, connect.CodeInvalidArgument},
	} {
		s := forward(ctx, p, tok, tc.first)
		_, err := s.Receive()
		if connect.CodeOf(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
		if tc.name == "nothing listens" && err != nil && !containsText(err, "nothing listens on port 9") {
			t.Errorf("%s: %v does not say nothing listens", tc.name, err)
		}
		if err != nil && containsRoute(connectMessage(err)) {
			t.Errorf("%s: %v names the internal route", tc.name, err)
		}
		_ = s.CloseResponse()
	}

	// Admission, as the ProcessService's.
	other, _ := createWS(t, c, "pf-create-other")
	fsTok := session("pf-s-fs", scopeFS)
	for _, tc := range []struct {
		name, ws, tok string
		code          connect.Code
		reason        ctrlv1.FailureReason
	}{
		{"no token", ws, "", connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED},
		{"forged token", ws, tok[:len(tok)-4] + "AAAA", connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED},
		{"another workspace", other.GetWorkspaceId(), tok, connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED},
		{"filesystem scope", ws, fsTok, connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED},
	} {
		s := forward(ctx, p, tc.tok, &ctrlv1.ForwardPortRequest{WorkspaceId: tc.ws, Port: 7})
		_, err := s.Receive()
		t.Run(tc.name, func(t *testing.T) { wantErr(t, err, tc.code, tc.reason, false) })
		_ = s.CloseResponse()
	}

	// A guest's chunk over 64 KiB is cut; revocation ends the forward.
	s = forward(ctx, p, tok, &ctrlv1.ForwardPortRequest{WorkspaceId: ws, Port: 11})
	if m, err := s.Receive(); err != nil || m.GetConnected() == nil {
		t.Fatalf("first response = %v, %v; want connected", m, err)
	}
	n := 0
	for n < 100<<10 {
		m, err := s.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.GetData()) > api.MaxPortChunk {
			t.Errorf("a chunk of %d bytes passed", len(m.GetData()))
		}
		n += len(m.GetData())
	}
	if _, err := c.Workspace.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(revokeReq("pf-revoke", ws))); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := s.Receive(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED, false)
	case <-time.After(5 * time.Second):
		t.Fatal("the forward of a revoked token is still open after 5s")
	}
	_ = s.CloseResponse()

	// HTTP/1.1 cannot carry a bidirectional stream.
	fresh := session("pf-s2", scopeExec)
	p1 := ctrlv1connect.NewPortForwardServiceClient(e.HTTP1Client(t, "", ""), e.URL)
	s = forward(ctx, p1, fresh, &ctrlv1.ForwardPortRequest{WorkspaceId: ws, Port: 7})
	_ = s.CloseRequest()
	if _, err := s.Receive(); err == nil {
		t.Error("ForwardPort over HTTP/1.1 answered")
	}
	_ = s.CloseResponse()
}

// TestPortWireTwins: the public messages of ForwardPort have the wire form
// of the guest's (the guest's field 1, workspace_id, is reserved).
func TestPortWireTwins(t *testing.T) {
	for _, tc := range []struct{ guest, public proto.Message }{
		{&guestv1.ForwardRequest{Port: 80, Data: []byte("x"), CloseWrite: true}, &ctrlv1.ForwardPortRequest{Port: 80, Data: []byte("x"), CloseWrite: true}},
		{&guestv1.ForwardResponse{Event: &guestv1.ForwardResponse_Connected{Connected: &guestv1.PortConnected{Address: "[::1]:80"}}},
			&ctrlv1.ForwardPortResponse{Event: &ctrlv1.ForwardPortResponse_Connected{Connected: &ctrlv1.PortForwardConnected{Address: "[::1]:80"}}}},
		{&guestv1.ForwardResponse{Event: &guestv1.ForwardResponse_Data{Data: []byte("y")}},
			&ctrlv1.ForwardPortResponse{Event: &ctrlv1.ForwardPortResponse_Data{Data: []byte("y")}}},
		{&guestv1.ForwardResponse{Event: &guestv1.ForwardResponse_RemoteClosed{RemoteClosed: &guestv1.PortRemoteClosed{}}},
			&ctrlv1.ForwardPortResponse{Event: &ctrlv1.ForwardPortResponse_RemoteClosed{RemoteClosed: &ctrlv1.PortForwardRemoteClosed{}}}},
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

// connectMessage is the message of a Connect error.
func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// containsText reports whether err's message contains s.
func containsText(err error, s string) bool {
	return err != nil && strings.Contains(connectMessage(err), s)
}
