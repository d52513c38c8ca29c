package api_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/dataplane"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

const (
	scopeExec = ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC
	scopeFS   = ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM
)

func sessionReq(id, ws string, ttl time.Duration, scopes ...ctrlv1.DataPlaneScope) *ctrlv1.CreateDataPlaneSessionRequest {
	r := &ctrlv1.CreateDataPlaneSessionRequest{Metadata: md(id), WorkspaceId: ws, Scopes: scopes}
	if ttl != 0 {
		r.Ttl = durationpb.New(ttl)
	}
	return r
}

func revokeReq(id, ws string) *ctrlv1.RevokeWorkspaceDataPlaneRequest {
	return &ctrlv1.RevokeWorkspaceDataPlaneRequest{Metadata: md(id), WorkspaceId: ws}
}

// TestDataPlaneSessionScopesServed: workspace.exec and
// workspace.filesystem are served once a node registered, so sessions of
// either scope are issued then; before, an issue request is refused by its
// scopes, naming the field.
func TestDataPlaneSessionScopesServed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bare := ctrltest.New(t, ctrltest.Options{})
	bc := bare.Clients(bare.HTTP)
	for _, scope := range []ctrlv1.DataPlaneScope{scopeExec, scopeFS} {
		_, err := bc.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("dpns-none-"+scope.String(), "ws-none", 0, scope)))
		d := wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false)
		if d.GetField() != "scopes" {
			t.Errorf("%v without a node: field = %q, want scopes", scope, d.GetField())
		}
	}

	_, c, _ := wsEnv(t, ctrltest.Options{})
	w, _ := createWS(t, c, "dpns-create")
	waitNode(t, c) // the workspace capabilities are listed once the node has registered
	info, err := c.ServerInfo.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	caps := info.Msg.GetCapabilities()
	for _, want := range []string{capability.WorkspaceDataPlaneRevoke, capability.WorkspaceExec, capability.WorkspaceFilesystem} {
		if !slices.Contains(caps, want) {
			t.Errorf("capabilities = %v, want %s", caps, want)
		}
	}
	if _, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("dpns-fs", w.GetWorkspaceId(), 0, scopeFS))); err != nil {
		t.Errorf("CreateDataPlaneSession(FILESYSTEM) = %v", err)
	}
	if _, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("dpns-exec", w.GetWorkspaceId(), 0, scopeExec))); err != nil {
		t.Errorf("CreateDataPlaneSession(EXEC) = %v", err)
	}
	r, err := c.Workspace.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(revokeReq("dpns-revoke", w.GetWorkspaceId())))
	if err != nil || r.Msg.GetWorkspace().GetDataPlaneGeneration() != 2 {
		t.Fatalf("RevokeWorkspaceDataPlane = %v, %v", r, err)
	}
}

func TestDataPlaneSessions(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); testDataPlaneSessions(t, false) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); testDataPlaneSessions(t, true) })
}

func testDataPlaneSessions(t *testing.T, pg bool) {
	e, c, _ := wsEnv(t, ctrltest.Options{DataPlane: true, Postgres: pg})
	ctx := t.Context()
	v := e.Verifier
	w, _ := createWS(t, c, "dp-create")
	ws := w.GetWorkspaceId()
	waitCommand(t, c, "dp-create")
	other, _ := createWS(t, c, "dp-create-other")

	r, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("dp-s1", ws, time.Hour, scopeExec, scopeFS)))
	if err != nil {
		t.Fatal(err)
	}
	s := r.Msg.GetSession()
	if s.GetWorkspaceId() != ws || s.GetDataPlaneGeneration() != 1 || s.GetEndpoint() != ctrltest.DataPlaneURL ||
		!slices.Equal(s.GetScopes(), []ctrlv1.DataPlaneScope{scopeExec, scopeFS}) ||
		s.GetExpireTime().AsTime().Sub(s.GetCreatedAt().AsTime()) != time.Hour || !strings.HasPrefix(s.GetToken(), "kbd1.") {
		t.Fatalf("session = %v", s)
	}
	tok := s.GetToken()
	if _, err := v.Verify(ctx, tok, ws, dataplane.ScopeExec); err != nil {
		t.Fatalf("Verify = %v", err)
	}
	// The same command ID returns the identical token.
	again, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("dp-s1", ws, time.Hour, scopeExec, scopeFS)))
	if err != nil || again.Msg.GetSession().GetToken() != tok || !proto.Equal(again.Msg, r.Msg) {
		t.Fatalf("replay = %v, %v; want the identical session", again, err)
	}
	// ... and other input under it is already_exists.
	_, err = c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("dp-s1", ws, time.Hour, scopeExec)))
	wantErr(t, err, connect.CodeAlreadyExists, ctrlv1.FailureReason_FAILURE_REASON_COMMAND_ID_REUSED, false)

	// Tokens survive a stop and a start.
	if _, err := stopWS(c, t, "dp-stop", getWS(t, c, ws), false); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(ctx, tok, ws, dataplane.ScopeFilesystem); err != nil {
		t.Fatalf("Verify after stop = %v", err)
	}
	// A STOPPED Workspace issues sessions too (used after its start).
	stopped, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("dp-s-stopped", ws, 0, scopeExec)))
	if err != nil {
		t.Fatalf("CreateDataPlaneSession on STOPPED = %v", err)
	}
	if _, err := c.Workspace.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("dp-start"), WorkspaceId: ws, ExpectedExpirationRevision: 1})); err != nil {
		t.Fatal(err)
	}
	waitCommand(t, c, "dp-start")
	for _, tk := range []string{tok, stopped.Msg.GetSession().GetToken()} {
		if _, err := v.Verify(ctx, tk, ws, dataplane.ScopeExec); err != nil {
			t.Fatalf("Verify after start = %v", err)
		}
	}

	// Revocation: completed in the request, the generation moves, every
	// earlier token is refused as expired; it is replayed, not repeated.
	rv, err := c.Workspace.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(revokeReq("dp-revoke", ws)))
	if err != nil {
		t.Fatal(err)
	}
	cmd := rv.Msg.GetCommand()
	if rv.Msg.GetWorkspace().GetDataPlaneGeneration() != 2 || cmd.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED ||
		cmd.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_REVOKE_DATA_PLANE || cmd.GetCompletedAt() == nil ||
		rv.Msg.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("revoke = %v", rv.Msg)
	}
	if got := waitCommand(t, c, "dp-revoke"); got.GetError() != nil || got.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_REVOKE_DATA_PLANE {
		t.Fatalf("GetWorkspaceCommand(dp-revoke) = %v", got)
	}
	for _, tk := range []string{tok, stopped.Msg.GetSession().GetToken()} {
		_, err := v.Verify(ctx, tk, ws, dataplane.ScopeExec)
		wantFaultErr(t, err, "unauthenticated", "SESSION_EXPIRED")
	}
	rv2, err := c.Workspace.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(revokeReq("dp-revoke", ws)))
	if err != nil || rv2.Msg.GetWorkspace().GetDataPlaneGeneration() != 2 {
		t.Fatalf("replayed revoke = %v, %v", rv2, err)
	}
	if getWS(t, c, ws).GetDataPlaneGeneration() != 2 {
		t.Fatal("a replayed revoke moved the generation")
	}
	// The replay of the first session still returns its (now revoked) token.
	again, err = c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("dp-s1", ws, time.Hour, scopeExec, scopeFS)))
	if err != nil || again.Msg.GetSession().GetToken() != tok {
		t.Fatalf("replay after revoke = %v, %v", again, err)
	}
	// A new session carries the new generation and is accepted; for
	// another Workspace or a scope it lacks it is permission_denied.
	fresh, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("dp-s2", ws, 0, scopeFS)))
	if err != nil || fresh.Msg.GetSession().GetDataPlaneGeneration() != 2 {
		t.Fatalf("session after revoke = %v, %v", fresh, err)
	}
	ft := fresh.Msg.GetSession().GetToken()
	if _, err := v.Verify(ctx, ft, ws, dataplane.ScopeFilesystem); err != nil {
		t.Fatalf("Verify of the new session = %v", err)
	}
	_, err = v.Verify(ctx, ft, other.GetWorkspaceId(), dataplane.ScopeFilesystem)
	wantFaultErr(t, err, "permission_denied", "PERMISSION_DENIED")
	_, err = v.Verify(ctx, ft, ws, dataplane.ScopeExec)
	wantFaultErr(t, err, "permission_denied", "PERMISSION_DENIED")

	// Bad input.
	for _, tc := range []struct {
		name   string
		req    *ctrlv1.CreateDataPlaneSessionRequest
		code   connect.Code
		reason ctrlv1.FailureReason
	}{
		{"unknown workspace", sessionReq("dp-bad-1", "ws-aaaaaaaaaaaaaaaaaaaa", 0, scopeExec), connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND},
		{"no workspace", sessionReq("dp-bad-2", "", 0, scopeExec), connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"no scopes", sessionReq("dp-bad-3", ws, 0), connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"repeated scope", sessionReq("dp-bad-4", ws, 0, scopeExec, scopeExec), connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"unknown scope", sessionReq("dp-bad-5", ws, 0, 7), connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"ttl 1s", sessionReq("dp-bad-6", ws, time.Second, scopeExec), connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"ttl 25h", sessionReq("dp-bad-7", ws, 25*time.Hour, scopeExec), connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"bad command ID", sessionReq("-bad", ws, 0, scopeExec), connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID},
	} {
		_, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(tc.req))
		settled := tc.code == connect.CodeNotFound
		wantErr(t, err, tc.code, tc.reason, settled)
	}
	_, err = c.Workspace.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(revokeReq("dp-rv-bad", "ws-aaaaaaaaaaaaaaaaaaaa")))
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, true)

	// After the deletion: no session, no revocation, old tokens refused.
	if _, err := c.Workspace.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("dp-delete"), WorkspaceId: ws, ExpectedExpirationRevision: 1})); err != nil {
		t.Fatal(err)
	}
	_, err = c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("dp-after-delete", ws, 0, scopeExec)))
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, true)
	_, err = c.Workspace.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(revokeReq("dp-rv-deleted", ws)))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
	_, err = v.Verify(ctx, ft, ws, dataplane.ScopeFilesystem)
	wantFaultErr(t, err, "unauthenticated", "SESSION_EXPIRED")
}

// wantFaultErr checks a Verifier refusal by its kind and reason names.
func wantFaultErr(t *testing.T, err error, kind, reason string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), reason) {
		t.Fatalf("Verify = %v, want %s (%s)", err, kind, reason)
	}
	if got := fault.KindOf(err).String(); got != kind {
		t.Fatalf("Verify = %v of kind %s, want %s", err, got, kind)
	}
}

// TestDataPlaneTokenNeverLeaves issues a token and searches every other
// response, every error, every log line and the store's files for it.
func TestDataPlaneTokenNeverLeaves(t *testing.T) {
	t.Parallel()
	e, c, _ := wsEnv(t, ctrltest.Options{DataPlane: true})
	ctx := t.Context()
	w, _ := createWS(t, c, "tk-create")
	ws := w.GetWorkspaceId()
	waitCommand(t, c, "tk-create")
	r, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("tk-1", ws, 0, scopeExec)))
	if err != nil {
		t.Fatal(err)
	}
	tok := r.Msg.GetSession().GetToken()
	sig := tok[strings.LastIndexByte(tok, '.')+1:]
	var seen bytes.Buffer
	keep := func(msg any, err error) {
		if err != nil {
			seen.WriteString(err.Error())
			if ce, ok := err.(*connect.Error); ok {
				for _, d := range ce.Details() {
					v, _ := d.Value()
					fmt.Fprintf(&seen, "%v", v)
				}
			}
		}
		if pm, ok := msg.(proto.Message); ok && pm != nil {
			b, _ := protojson.Marshal(pm)
			seen.Write(b)
		}
	}
	// Failures of the same command ID and of the token itself.
	_, err = c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("tk-1", ws, 0, scopeFS)))
	keep(nil, err)
	_, err = c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("tk-2", ws, time.Second, scopeExec)))
	keep(nil, err)
	for _, scope := range []string{dataplane.ScopeExec, dataplane.ScopeFilesystem} {
		for _, id := range []string{ws, "ws-other"} {
			_, err := e.Verifier.Verify(ctx, tok, id, scope)
			keep(nil, err)
			_, err = e.Verifier.Verify(ctx, tok+"x", id, scope)
			keep(nil, err)
		}
	}
	g, err := c.Workspace.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: ws}))
	keep(msgOf(g), err)
	l, err := c.Workspace.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
	keep(msgOf(l), err)
	gc, err := c.Workspace.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: "tk-1"}))
	keep(msgOf(gc), err)
	rv, err := c.Workspace.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(revokeReq("tk-revoke", ws)))
	keep(msgOf(rv), err)
	_, err = e.Verifier.Verify(ctx, tok, ws, dataplane.ScopeExec)
	keep(nil, err)
	seen.WriteString(e.Log.String())
	if strings.Contains(seen.String(), sig) {
		t.Fatal("the token appears in a response, error or log line")
	}
	if !strings.Contains(e.Log.String(), "CreateDataPlaneSession") {
		t.Fatal("the log has no calls; the search proves nothing")
	}
	// Nor in the store: the command record holds the claims only.
	if err := e.Store.View(ctx, func(tx store.Tx) error {
		rec, err := tx.GetCommand(ctx, "tk-1")
		if err != nil {
			return err
		}
		if bytes.Contains(rec.Result, []byte(sig)) || bytes.Contains(rec.Result, []byte("kbd1.")) {
			t.Error("the token is stored in its command record")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
