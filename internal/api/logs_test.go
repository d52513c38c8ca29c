package api_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// TestWorkspaceLogService: the public WorkspaceLogService over a
// data-plane token with the exec scope and no client certificate, read by
// the node from its files: the whole log and its tail; a follower gets
// what is appended and is cut by a revocation; a stopped Workspace's log
// is still served, an unknown one is not_found; the refusals of admission.
func TestWorkspaceLogService(t *testing.T) {
	t.Parallel()
	rt := agenttest.New()
	rt.LogDir = t.TempDir()
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt, DataPlane: true})
	c := e.Clients(e.HTTP)
	ctx := t.Context()
	w, _ := createWS(t, c, "log-create")
	ws := w.GetWorkspaceId()
	waitCommand(t, c, "log-create")
	session := func(id string, scopes ...ctrlv1.DataPlaneScope) string {
		r, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq(id, ws, time.Hour, scopes...)))
		if err != nil {
			t.Fatalf("CreateDataPlaneSession(%s) = %v", id, err)
		}
		return r.Msg.GetSession().GetToken()
	}
	tok := session("log-s1", scopeExec)
	l := ctrlv1connect.NewWorkspaceLogServiceClient(e.Client(t, "", ""), e.URL)
	read := func(tok string, m *ctrlv1.ReadWorkspaceLogRequest) (string, error) {
		s, err := l.ReadWorkspaceLog(ctx, bearerReq(m, tok))
		if err != nil {
			return "", err
		}
		defer s.Close()
		var b strings.Builder
		for s.Receive() {
			b.Write(s.Msg().GetData())
		}
		return b.String(), s.Err()
	}

	if _, err := read(tok, &ctrlv1.ReadWorkspaceLogRequest{WorkspaceId: ws}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("no log yet: %v, want not_found", err)
	} else if containsRoute(connectMessage(err)) {
		t.Errorf("no log yet: %v names the internal route", err)
	}
	p := filepath.Join(rt.LogDir, ws+".log")
	if err := os.WriteFile(p+".1", []byte("guest: started\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("pid 1: hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := read(tok, &ctrlv1.ReadWorkspaceLogRequest{WorkspaceId: ws}); err != nil || got != "guest: started\npid 1: hello\n" {
		t.Errorf("log = %q, %v", got, err)
	}
	if got, err := read(tok, &ctrlv1.ReadWorkspaceLogRequest{WorkspaceId: ws, TailBytes: 6}); err != nil || got != "hello\n" {
		t.Errorf("tail 6 = %q, %v", got, err)
	}

	// A follower gets what is appended; a revocation cuts it.
	s, err := l.ReadWorkspaceLog(ctx, bearerReq(&ctrlv1.ReadWorkspaceLogRequest{WorkspaceId: ws, Follow: true, FromEnd: true}, tok))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || len(s.Msg().GetData()) != 0 {
		t.Fatalf("a follower's first chunk: %v, %v; want an empty one", s.Msg(), s.Err())
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("later\n")
	f.Close()
	if !s.Receive() || string(s.Msg().GetData()) != "later\n" {
		t.Fatalf("followed %v, %v", s.Msg(), s.Err())
	}
	if _, err := c.Workspace.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(revokeReq("log-revoke", ws))); err != nil {
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
		t.Fatal("the follower of a revoked token is still open after 5s")
	}
	s.Close()

	// Refusals.
	fresh := session("log-s2", scopeExec)
	fsTok := session("log-s-fs", scopeFS)
	other, _ := createWS(t, c, "log-create-other")
	for _, tc := range []struct {
		name, ws, tok string
		code          connect.Code
	}{
		{"no token", ws, "", connect.CodeUnauthenticated},
		{"filesystem scope", ws, fsTok, connect.CodePermissionDenied},
		{"another workspace", other.GetWorkspaceId(), fresh, connect.CodePermissionDenied},
		{"revoked token", ws, tok, connect.CodeUnauthenticated},
	} {
		if _, err := read(tc.tok, &ctrlv1.ReadWorkspaceLogRequest{WorkspaceId: tc.ws}); connect.CodeOf(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}

	// Stopped: the last log is still served.
	if _, err := stopWS(c, t, "log-stop", getWS(t, c, ws), false); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, ws, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if got, err := read(fresh, &ctrlv1.ReadWorkspaceLogRequest{WorkspaceId: ws, TailBytes: 6}); err != nil || got != "later\n" {
		t.Errorf("stopped: %q, %v", got, err)
	}
}
