package dataplane_test

import (
	"context"
	"crypto/ed25519"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/dataplane"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/workspace"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type env struct {
	st  *sqlite.Store
	ws  *workspace.Service
	dp  *dataplane.Service
	clk *clock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	st, err := sqlite.Open(context.Background(), t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := &clock{t: time.Now().UTC()}
	engine := &command.Engine{Store: st, Now: clk.Now}
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = 7
	key, err := dataplane.KeyFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	return &env{st: st, clk: clk,
		ws: &workspace.Service{Engine: engine, Store: st, Pages: paging.NewCodec(make([]byte, 32)), Now: clk.Now,
			Templates:   func(id string) (string, bool) { return "v1", id == workspace.DefaultTemplate },
			MaxCapacity: func() workspace.Capacity { return workspace.Capacity{MemoryMiB: 4096, CPUMillis: 4000} }},
		dp: &dataplane.Service{Engine: engine, Store: st, Key: key, Endpoint: "https://dp.test", Now: clk.Now},
	}
}

func (e *env) create(t *testing.T, id string) string {
	t.Helper()
	r, err := e.ws.Create(t.Context(), &ctrlv1.CreateWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: id},
		Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetWorkspace().GetWorkspaceId()
}

func (e *env) issue(t *testing.T, cid, ws string, ttl time.Duration, scopes ...ctrlv1.DataPlaneScope) *ctrlv1.DataPlaneSession {
	t.Helper()
	req := &ctrlv1.CreateDataPlaneSessionRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid}, WorkspaceId: ws, Scopes: scopes}
	if ttl != 0 {
		req.Ttl = durationpb.New(ttl)
	}
	r, err := e.dp.Create(t.Context(), req)
	if err != nil {
		t.Fatalf("Create(%s) = %v", cid, err)
	}
	return r.GetSession()
}

func (e *env) revoke(t *testing.T, cid, ws string) *ctrlv1.RevokeWorkspaceDataPlaneResponse {
	t.Helper()
	r, err := e.ws.RevokeDataPlane(t.Context(), &ctrlv1.RevokeWorkspaceDataPlaneRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid}, WorkspaceId: ws})
	if err != nil {
		t.Fatalf("RevokeDataPlane(%s) = %v", cid, err)
	}
	return r
}

func wantFault(t *testing.T, what string, err error, kind fault.Kind, reason fault.Reason) {
	t.Helper()
	fe, ok := fault.As(err)
	if !ok || fe.Kind != kind || fe.Reason != reason {
		t.Fatalf("%s = %v, want %v (%s)", what, err, kind, reason)
	}
}

const (
	exec = ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC
	fs   = ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM
)

func TestCreateMethod(t *testing.T) {
	if dataplane.CreateMethod != ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure {
		t.Fatalf("CreateMethod = %q, want %q", dataplane.CreateMethod, ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure)
	}
}

func TestVerify(t *testing.T) {
	e := newEnv(t)
	v := e.dp.Verifier()
	v.MaxStale = time.Hour // only notifications refresh the cache here
	defer v.Close()
	ctx := t.Context()
	a, b := e.create(t, "c-a"), e.create(t, "c-b")
	s := e.issue(t, "s-1", a, 0, exec)
	if s.GetDataPlaneGeneration() != 1 || s.GetEndpoint() != "https://dp.test" || !strings.HasPrefix(s.GetSessionId(), "dps-") ||
		s.GetExpireTime().AsTime().Sub(s.GetCreatedAt().AsTime()) != dataplane.DefaultTTL {
		t.Fatalf("session = %v", s)
	}
	if c, err := v.Verify(ctx, s.GetToken(), a, dataplane.ScopeExec); err != nil || c.SessionID != s.GetSessionId() {
		t.Fatalf("Verify = %v, %v", c, err)
	}
	_, err := v.Verify(ctx, s.GetToken(), b, dataplane.ScopeExec)
	wantFault(t, "Verify for another workspace", err, fault.KindPermissionDenied, fault.ReasonPermissionDenied)
	_, err = v.Verify(ctx, s.GetToken(), a, dataplane.ScopeFilesystem)
	wantFault(t, "Verify without the scope", err, fault.KindPermissionDenied, fault.ReasonPermissionDenied)
	_, err = v.Verify(ctx, s.GetToken()+"x", a, dataplane.ScopeExec)
	wantFault(t, "Verify of a tampered token", err, fault.KindUnauthenticated, fault.ReasonPermissionDenied)
	other := &dataplane.Verifier{Key: ed25519.NewKeyFromSeed(make([]byte, 32)).Public().(ed25519.PublicKey), Store: e.st}
	_, err = other.Verify(ctx, s.GetToken(), a, dataplane.ScopeExec)
	wantFault(t, "Verify under another key", err, fault.KindUnauthenticated, fault.ReasonPermissionDenied)

	// Expiry: accepted until expire_time, refused from then on.
	short := e.issue(t, "s-short", a, 10*time.Second, exec, fs)
	e.clk.Add(10*time.Second - time.Microsecond)
	if _, err := v.Verify(ctx, short.GetToken(), a, dataplane.ScopeFilesystem); err != nil {
		t.Fatalf("Verify just before expiry = %v", err)
	}
	e.clk.Add(time.Microsecond)
	_, err = v.Verify(ctx, short.GetToken(), a, dataplane.ScopeFilesystem)
	wantFault(t, "Verify at expiry", err, fault.KindUnauthenticated, fault.ReasonSessionExpired)

	// Revocation: the generation moves, earlier tokens are refused, later
	// ones accepted; the other Workspace is untouched.
	sb := e.issue(t, "s-b", b, 0, exec)
	r := e.revoke(t, "r-1", a)
	if r.GetWorkspace().GetDataPlaneGeneration() != 2 || r.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED ||
		r.GetCommand().GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_REVOKE_DATA_PLANE {
		t.Fatalf("revoke = %v", r)
	}
	_, err = v.Verify(ctx, s.GetToken(), a, dataplane.ScopeExec)
	wantFault(t, "Verify after revocation", err, fault.KindUnauthenticated, fault.ReasonSessionExpired)
	if _, err := v.Verify(ctx, sb.GetToken(), b, dataplane.ScopeExec); err != nil {
		t.Fatalf("Verify of another workspace's token after revocation = %v", err)
	}
	s2 := e.issue(t, "s-2", a, 0, exec)
	if s2.GetDataPlaneGeneration() != 2 {
		t.Fatalf("generation after revoke = %d, want 2", s2.GetDataPlaneGeneration())
	}
	if _, err := v.Verify(ctx, s2.GetToken(), a, dataplane.ScopeExec); err != nil {
		t.Fatalf("Verify of a token issued after revocation = %v", err)
	}
	// Replay: the same ID returns the identical token, even revoked.
	if again := e.issue(t, "s-1", a, 0, exec); again.GetToken() != s.GetToken() {
		t.Fatal("a replay returned another token")
	}
	// Revoke replays too (no second increment).
	if r := e.revoke(t, "r-1", a); r.GetWorkspace().GetDataPlaneGeneration() != 2 {
		t.Fatalf("replayed revoke: generation %d, want 2", r.GetWorkspace().GetDataPlaneGeneration())
	}
}

// TestRevocationLatency measures how long a Verifier keeps accepting a
// token after the revocation committed: its notification invalidates the
// cache, so the first Verify after RevokeDataPlane returns refuses.
func TestRevocationLatency(t *testing.T) {
	e := newEnv(t)
	e.clk = nil
	e.dp.Now, e.ws.Now, e.ws.Engine.Now = nil, nil, nil
	v := e.dp.Verifier()
	v.MaxStale = time.Hour
	defer v.Close()
	ctx := t.Context()
	ws := e.create(t, "c")
	s := e.issue(t, "s", ws, 0, exec)
	if _, err := v.Verify(ctx, s.GetToken(), ws, dataplane.ScopeExec); err != nil {
		t.Fatal(err)
	}
	// A concurrent stream of verifications, as a data plane would make.
	refused := make(chan time.Time, 1)
	go func() {
		for ctx.Err() == nil {
			if _, err := v.Verify(ctx, s.GetToken(), ws, dataplane.ScopeExec); err != nil {
				refused <- time.Now()
				return
			}
		}
	}()
	e.revoke(t, "r", ws)
	committed := time.Now() // RevokeDataPlane returns after the commit
	select {
	case at := <-refused:
		lat := max(at.Sub(committed), 0)
		t.Logf("revocation latency: %v", lat)
		if lat > 100*time.Millisecond {
			t.Fatalf("revocation latency %v, want at most 100ms", lat)
		}
	case <-time.After(100 * time.Millisecond):
		t.Fatal("the token is still accepted 100ms after the revocation committed")
	}
	// Sequentially, too: the first Verify after the revoke refuses.
	s2 := e.issue(t, "s2", ws, 0, exec)
	if _, err := v.Verify(ctx, s2.GetToken(), ws, dataplane.ScopeExec); err != nil {
		t.Fatal(err)
	}
	e.revoke(t, "r2", ws)
	_, err := v.Verify(ctx, s2.GetToken(), ws, dataplane.ScopeExec)
	wantFault(t, "first Verify after the revoke", err, fault.KindUnauthenticated, fault.ReasonSessionExpired)
}

// TestStaleFallback: a revocation whose notification never arrives
// (another replica committed it) is seen at the latest MaxStale later.
func TestStaleFallback(t *testing.T) {
	e := newEnv(t)
	v := e.dp.Verifier()
	v.MaxStale = time.Second
	defer v.Close()
	ctx := t.Context()
	ws := e.create(t, "c")
	s := e.issue(t, "s", ws, 0, exec)
	if _, err := v.Verify(ctx, s.GetToken(), ws, dataplane.ScopeExec); err != nil {
		t.Fatal(err)
	}
	// Raise the generation without a notification.
	if err := e.st.InTx(ctx, func(tx store.Tx) error {
		w, err := tx.GetWorkspace(ctx, ws)
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		pub.DataPlaneGeneration++
		if err := workspace.Save(w, pub, e.clk.Now()); err != nil {
			return err
		}
		return tx.UpdateWorkspace(ctx, w)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(ctx, s.GetToken(), ws, dataplane.ScopeExec); err != nil {
		t.Fatalf("Verify within MaxStale of an unnotified change = %v (the cache should still hold)", err)
	}
	e.clk.Add(time.Second)
	_, err := v.Verify(ctx, s.GetToken(), ws, dataplane.ScopeExec)
	wantFault(t, "Verify MaxStale after an unnotified revocation", err, fault.KindUnauthenticated, fault.ReasonSessionExpired)
}

func TestCreateInvalid(t *testing.T) {
	e := newEnv(t)
	ws := e.create(t, "c")
	for _, tc := range []struct {
		name   string
		req    *ctrlv1.CreateDataPlaneSessionRequest
		kind   fault.Kind
		reason fault.Reason
		field  string
	}{
		{"no workspace", &ctrlv1.CreateDataPlaneSessionRequest{Scopes: []ctrlv1.DataPlaneScope{exec}}, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "workspace_id"},
		{"unknown workspace", &ctrlv1.CreateDataPlaneSessionRequest{WorkspaceId: "ws-nope", Scopes: []ctrlv1.DataPlaneScope{exec}}, fault.KindNotFound, fault.ReasonNotFound, ""},
		{"no scope", &ctrlv1.CreateDataPlaneSessionRequest{WorkspaceId: ws}, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "scopes"},
		{"unspecified scope", &ctrlv1.CreateDataPlaneSessionRequest{WorkspaceId: ws, Scopes: []ctrlv1.DataPlaneScope{0}}, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "scopes"},
		{"unknown scope", &ctrlv1.CreateDataPlaneSessionRequest{WorkspaceId: ws, Scopes: []ctrlv1.DataPlaneScope{9}}, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "scopes"},
		{"repeated scope", &ctrlv1.CreateDataPlaneSessionRequest{WorkspaceId: ws, Scopes: []ctrlv1.DataPlaneScope{exec, fs, exec}}, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "scopes"},
		{"ttl too short", &ctrlv1.CreateDataPlaneSessionRequest{WorkspaceId: ws, Scopes: []ctrlv1.DataPlaneScope{exec}, Ttl: durationpb.New(9 * time.Second)}, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "ttl"},
		{"ttl zero", &ctrlv1.CreateDataPlaneSessionRequest{WorkspaceId: ws, Scopes: []ctrlv1.DataPlaneScope{exec}, Ttl: durationpb.New(0)}, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "ttl"},
		{"ttl too long", &ctrlv1.CreateDataPlaneSessionRequest{WorkspaceId: ws, Scopes: []ctrlv1.DataPlaneScope{exec}, Ttl: durationpb.New(24*time.Hour + time.Second)}, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "ttl"},
		{"ttl invalid", &ctrlv1.CreateDataPlaneSessionRequest{WorkspaceId: ws, Scopes: []ctrlv1.DataPlaneScope{exec}, Ttl: &durationpb.Duration{Seconds: 1, Nanos: -1}}, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "ttl"},
	} {
		tc.req.Metadata = &ctrlv1.CommandMetadata{CommandId: "bad-" + strings.ReplaceAll(tc.name, " ", "-")}
		_, err := e.dp.Create(t.Context(), tc.req)
		fe, ok := fault.As(err)
		if !ok || fe.Kind != tc.kind || fe.Reason != tc.reason || fe.Field != tc.field {
			t.Errorf("Create(%s) = %v, want %v %s field %q", tc.name, err, tc.kind, tc.reason, tc.field)
		}
	}
	// The bounds themselves are accepted.
	e.issue(t, "min", ws, dataplane.MinTTL, exec)
	e.issue(t, "max", ws, dataplane.MaxTTL, fs)
}

func TestCreateStates(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	ws := e.create(t, "c")
	setState := func(st ctrlv1.WorkspaceState) {
		if err := e.st.InTx(ctx, func(tx store.Tx) error {
			w, err := tx.GetWorkspace(ctx, ws)
			if err != nil {
				return err
			}
			pub, err := workspace.Decode(w)
			if err != nil {
				return err
			}
			pub.State = st
			if err := workspace.Save(w, pub, e.clk.Now()); err != nil {
				return err
			}
			return tx.UpdateWorkspace(ctx, w)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i, st := range []ctrlv1.WorkspaceState{
		ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING,
		ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING,
		ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED,
	} {
		setState(st)
		e.issue(t, "st-"+string(rune('a'+i)), ws, 0, exec)
		e.revoke(t, "rv-"+string(rune('a'+i)), ws)
	}
	req := func(id string) *ctrlv1.CreateDataPlaneSessionRequest {
		return &ctrlv1.CreateDataPlaneSessionRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: id}, WorkspaceId: ws, Scopes: []ctrlv1.DataPlaneScope{exec}}
	}
	setState(ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING)
	_, err := e.dp.Create(ctx, req("deleting"))
	wantFault(t, "Create on DELETING", err, fault.KindFailedPrecondition, fault.ReasonStateConflict)
	_, err = e.ws.RevokeDataPlane(ctx, &ctrlv1.RevokeWorkspaceDataPlaneRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "rv-deleting"}, WorkspaceId: ws})
	wantFault(t, "Revoke on DELETING", err, fault.KindFailedPrecondition, fault.ReasonStateConflict)
	setState(ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
	_, err = e.dp.Create(ctx, req("deleted"))
	wantFault(t, "Create on DELETED", err, fault.KindNotFound, fault.ReasonNotFound)
	_, err = e.ws.RevokeDataPlane(ctx, &ctrlv1.RevokeWorkspaceDataPlaneRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "rv-deleted"}, WorkspaceId: ws})
	wantFault(t, "Revoke on DELETED", err, fault.KindFailedPrecondition, fault.ReasonStateConflict)
	_, err = e.ws.RevokeDataPlane(ctx, &ctrlv1.RevokeWorkspaceDataPlaneRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "rv-unknown"}, WorkspaceId: "ws-nope"})
	wantFault(t, "Revoke of an unknown workspace", err, fault.KindNotFound, fault.ReasonNotFound)
	// A token of a Workspace that is gone is refused as expired.
	v := e.dp.Verifier()
	defer v.Close()
	w, _ := e.ws.Get(ctx, ws)
	tok, _ := dataplane.Sign(e.dp.Key, &dataplane.Claims{Version: 1, SessionID: "dps-x", WorkspaceID: ws, Generation: w.GetDataPlaneGeneration(),
		Scopes: []string{dataplane.ScopeExec}, IssuedAt: e.clk.Now().UnixMicro(), ExpiresAt: e.clk.Now().Add(time.Minute).UnixMicro()})
	_, err = v.Verify(ctx, tok, ws, dataplane.ScopeExec)
	wantFault(t, "Verify for a deleted workspace", err, fault.KindUnauthenticated, fault.ReasonSessionExpired)
}

// TestTokenNeverStored: the command record holds the claims, not the
// token.
func TestTokenNeverStored(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	ws := e.create(t, "c")
	s := e.issue(t, "s", ws, 0, exec)
	sig := s.GetToken()[strings.LastIndexByte(s.GetToken(), '.')+1:]
	var rec *store.Command
	if err := e.st.View(ctx, func(tx store.Tx) error {
		var err error
		rec, err = tx.GetCommand(ctx, "s")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rec.Result), sig) || strings.Contains(string(rec.Result), "kbd1") || rec.ObjectID != s.GetSessionId() {
		t.Fatalf("the command record holds the token, or not the session: %q", rec.Result)
	}
}
