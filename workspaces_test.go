package kibotos_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
)

// accept answers CreateWorkspace with a CREATING Workspace and a
// PROCESSING command, after failing the first len(failures) calls.
func accept(failures ...error) func(context.Context, int, proto.Message) (proto.Message, error) {
	return func(_ context.Context, n int, req proto.Message) (proto.Message, error) {
		if n <= len(failures) {
			return nil, failures[n-1]
		}
		id := req.(*ctrlv1.CreateWorkspaceRequest).GetMetadata().GetCommandId()
		return &ctrlv1.CreateWorkspaceResponse{
			Workspace: fakeWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, 1),
			Command:   fakeCommand(id, ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_CREATE, statusProcessing),
		}, nil
	}
}

// stopped answers StopWorkspace with a completed stop, after failing the
// first len(failures) calls.
func stopped(failures ...error) func(context.Context, int, proto.Message) (proto.Message, error) {
	return func(_ context.Context, n int, req proto.Message) (proto.Message, error) {
		if n <= len(failures) {
			return nil, failures[n-1]
		}
		r := req.(*ctrlv1.StopWorkspaceRequest)
		return &ctrlv1.StopWorkspaceResponse{
			Workspace: fakeWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, r.GetExpectedExpirationRevision()),
			Command:   fakeCommand(r.GetMetadata().GetCommandId(), ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP, statusCompleted),
		}, nil
	}
}

// current answers GetWorkspace with an AVAILABLE Workspace whose
// expiration revision is rev.
func current(rev uint64) func(context.Context, int, proto.Message) (proto.Message, error) {
	return func(context.Context, int, proto.Message) (proto.Message, error) {
		return &ctrlv1.GetWorkspaceResponse{Workspace: fakeWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, rev)}, nil
	}
}

// handle returns a handle on the fake's Workspace (one GetWorkspace).
func handle(t *testing.T, c *kibotos.Client) *kibotos.Workspace {
	t.Helper()
	ws, err := c.Workspaces().Get(t.Context(), fakeWorkspaceID)
	if err != nil {
		t.Fatalf("Get = %v", err)
	}
	return ws
}

func commandIDs(f *fakeCtrl, method string) []string {
	var out []string
	for _, r := range f.requests(method) {
		out = append(out, r.(interface {
			GetMetadata() *ctrlv1.CommandMetadata
		}).GetMetadata().GetCommandId())
	}
	return out
}

var spec = kibotos.WorkspaceSpec{MemoryMiB: 256, CPUMillis: 500, WritableLayerMiB: 64, Labels: map[string]string{"team": "ml"}}

func TestWorkspaceSpecRequest(t *testing.T) {
	s := spec
	s.TemplateID = "busybox"
	got := s.Request()
	want := &ctrlv1.CreateWorkspaceRequest{
		TemplateId: "busybox", Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500},
		WritableLayerCapacityBytes: 64 << 20, Labels: map[string]string{"team": "ml"},
	}
	if !proto.Equal(got, want) {
		t.Errorf("Request() = %v, want %v", got, want)
	}
	got.Labels["team"] = "changed"
	if s.Labels["team"] != "ml" {
		t.Error("Request() shares its labels with the spec")
	}
}

func TestPrepareCreateExposesTheIDBeforeSending(t *testing.T) {
	unknown := connect.NewError(connect.CodeUnavailable, errors.New("connection reset")) // no ErrorDetail: the result is unknown
	f := newFakeCtrl(allWorkspaceCaps...).on("CreateWorkspace", accept(unknown, timedOut()))
	c := clientOf(t, f)

	p, err := c.Workspaces().PrepareCreate(spec)
	if err != nil {
		t.Fatal(err)
	}
	id := p.CommandID()
	if err := kibotos.ValidateCommandID(id); err != nil {
		t.Fatalf("PrepareCreate made the command ID %q: %v", id, err)
	}
	if got := f.methods(); len(got) != 0 {
		t.Fatalf("PrepareCreate sent %v; it must send nothing", got)
	}
	ws, err := p.Do(t.Context())
	if err != nil {
		t.Fatalf("Do = %v", err)
	}
	if got := commandIDs(f, "CreateWorkspace"); !slices.Equal(got, []string{id, id, id}) {
		t.Errorf("CreateWorkspace command IDs = %v, want %s three times (two unknown results, then the answer)", got, id)
	}
	if ws.ID() != fakeWorkspaceID || ws.CommandID() != id || ws.Command().GetCommandId() != id || ws.Last().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING {
		t.Errorf("handle = %s, command %s (%v), state %v", ws.ID(), ws.CommandID(), ws.Command(), ws.Last().GetState())
	}
	// Do again resends the same request: a replay, never a new ID.
	if _, err := p.Do(t.Context()); err != nil {
		t.Fatal(err)
	}
	reqs := f.requests("CreateWorkspace")
	if !proto.Equal(reqs[0], reqs[len(reqs)-1]) {
		t.Errorf("the second Do sent %v, want the first request %v", reqs[len(reqs)-1], reqs[0])
	}
}

func TestCreateCommandIDs(t *testing.T) {
	t.Run("the caller's ID", func(t *testing.T) {
		f := newFakeCtrl(allWorkspaceCaps...).on("CreateWorkspace", accept())
		c := clientOf(t, f)
		ws, err := c.Workspaces().Create(t.Context(), spec, kibotos.WithCommandID("deploy/web/42"))
		if err != nil {
			t.Fatal(err)
		}
		if got := commandIDs(f, "CreateWorkspace"); !slices.Equal(got, []string{"deploy/web/42"}) || ws.CommandID() != "deploy/web/42" {
			t.Errorf("command IDs sent %v, handle %q; want deploy/web/42", got, ws.CommandID())
		}
	})
	t.Run("a fresh ID per create", func(t *testing.T) {
		f := newFakeCtrl(allWorkspaceCaps...).on("CreateWorkspace", accept())
		c := clientOf(t, f)
		for range 2 {
			if _, err := c.Workspaces().Create(t.Context(), spec); err != nil {
				t.Fatal(err)
			}
		}
		if got := commandIDs(f, "CreateWorkspace"); len(got) != 2 || got[0] == got[1] {
			t.Errorf("command IDs of two creates = %v, want two different ones", got)
		}
	})
	t.Run("a settled failure is not resent, and names its ID", func(t *testing.T) {
		settled := detailed(connect.CodeResourceExhausted, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, CommandSettled: true, Message: "no node has 64 GiB"})
		f := newFakeCtrl(allWorkspaceCaps...).on("CreateWorkspace", accept(settled))
		c := clientOf(t, f)
		ws, err := c.Workspaces().Create(t.Context(), spec)
		var we *kibotos.WriteError
		if ws != nil || !errors.As(err, &we) || !kibotos.IsSettled(err) || connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("Create = %v, %v; want no handle and a settled *WriteError", ws, err)
		}
		if got := commandIDs(f, "CreateWorkspace"); !slices.Equal(got, []string{we.CommandID}) {
			t.Errorf("sent %v, want one request with %s", got, we.CommandID)
		}
	})
	t.Run("retries stop at the policy's bound", func(t *testing.T) {
		f := newFakeCtrl(allWorkspaceCaps...).on("CreateWorkspace", accept(timedOut(), timedOut(), timedOut()))
		c := clientOf(t, f)
		_, err := c.Workspaces().Create(t.Context(), spec, kibotos.WithRetryPolicy(kibotos.RetryPolicy{MaxAttempts: 2}))
		if !kibotos.IsRetryable(err) {
			t.Fatalf("Create = %v, want the retryable error of the last attempt", err)
		}
		if got := commandIDs(f, "CreateWorkspace"); len(got) != 2 || got[0] != got[1] {
			t.Errorf("sent %v, want two requests with one ID", got)
		}
	})
}

func TestExpirationRevisionIsRequired(t *testing.T) {
	f := newFakeCtrl(allWorkspaceCaps...).on("GetWorkspace", current(3))
	c := clientOf(t, f)
	ws := handle(t, c)
	for name, op := range map[string]func(context.Context, kibotos.ExpirationRevision, ...kibotos.CallOption) error{
		"stop": ws.Stop, "start": ws.Start, "delete": ws.Delete,
	} {
		for _, rev := range []kibotos.ExpirationRevision{{}, kibotos.ExpectExpirationRevision(0)} {
			if err := op(t.Context(), rev); !errors.Is(err, kibotos.ErrNoExpirationRevision) {
				t.Errorf("%s with revision %v = %v, want ErrNoExpirationRevision", name, rev, err)
			}
		}
	}
	if got := f.methods(); !slices.Equal(got, []string{"GetServerInfo", "GetWorkspace"}) {
		t.Errorf("requests = %v, want only those of Get", got)
	}
	if err := ws.Start(t.Context(), kibotos.ExpectExpirationRevision(3), kibotos.WithForce()); err == nil || !strings.Contains(err.Error(), "WithForce") {
		t.Errorf("Start(WithForce) = %v, want an error naming the option", err)
	}
}

func TestExpectedExpirationRevision(t *testing.T) {
	f := newFakeCtrl(allWorkspaceCaps...).on("GetWorkspace", current(3)).on("StopWorkspace", stopped())
	c := clientOf(t, f)
	ws := handle(t, c)
	if err := ws.Stop(t.Context(), kibotos.ExpectExpirationRevision(3), kibotos.WithForce()); err != nil {
		t.Fatal(err)
	}
	got := f.requests("StopWorkspace")[0].(*ctrlv1.StopWorkspaceRequest)
	if got.GetExpectedExpirationRevision() != 3 || got.GetMode() != ctrlv1.StopMode_STOP_MODE_FORCE || got.GetWorkspaceId() != fakeWorkspaceID {
		t.Errorf("StopWorkspace request = %v", got)
	}
	if n := f.count("GetWorkspace"); n != 1 {
		t.Errorf("GetWorkspace called %d times, want 1 (Get only): an expected revision is not read", n)
	}
	if ws.Last().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || ws.Command().GetStatus() != statusCompleted {
		t.Errorf("handle after Stop: %v, %v", ws.Last(), ws.Command())
	}
	// The stop completed: Wait has nothing to read.
	before := len(f.methods())
	if err := ws.Wait(t.Context()); err != nil || len(f.methods()) != before {
		t.Errorf("Wait after a completed stop = %v, sent %v", err, f.methods()[before:])
	}
}

func TestCurrentExpirationRevision(t *testing.T) {
	t.Run("read once, kept across resends", func(t *testing.T) {
		f := newFakeCtrl(allWorkspaceCaps...).on("GetWorkspace", current(7)).on("StopWorkspace", stopped(timedOut()))
		c := clientOf(t, f)
		ws := handle(t, c)
		p, err := ws.PrepareStop(kibotos.CurrentExpirationRevision())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Do(t.Context()); err != nil {
			t.Fatalf("Do = %v", err)
		}
		if got := f.methods(); !slices.Equal(got, []string{"GetServerInfo", "GetWorkspace", "GetWorkspace", "StopWorkspace", "StopWorkspace"}) {
			t.Errorf("requests = %v, want Get's read, one read of the revision, then the stop and its resend", got)
		}
		for i, r := range f.requests("StopWorkspace") {
			r := r.(*ctrlv1.StopWorkspaceRequest)
			if r.GetExpectedExpirationRevision() != 7 || r.GetMetadata().GetCommandId() != p.CommandID() {
				t.Errorf("stop %d = %v, want revision 7 and command ID %s", i+1, r, p.CommandID())
			}
		}
	})
	for _, refusal := range []*connect.Error{
		detailed(connect.CodeFailedPrecondition, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH, CommandSettled: true,
			Message: "expiration revision is 8, not 7", ObservedWorkspace: fakeWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, 8)}),
		detailed(connect.CodeAborted, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, CommandSettled: true, Message: "revision moved"}),
	} {
		t.Run("never read again after "+refusal.Code().String(), func(t *testing.T) {
			f := newFakeCtrl(allWorkspaceCaps...).on("GetWorkspace", current(7)).on("StopWorkspace", stopped(refusal, refusal)) // a settled failure replays
			c := clientOf(t, f)
			ws := handle(t, c)
			p, err := ws.PrepareStop(kibotos.CurrentExpirationRevision())
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Do(t.Context())
			var we *kibotos.WriteError
			if connect.CodeOf(err) != refusal.Code() || !errors.As(err, &we) || we.CommandID != p.CommandID() {
				t.Fatalf("Do = %v, want the %v refusal as a *WriteError", err, refusal.Code())
			}
			// Doing it again replays the same request: no new read, no new ID.
			_, err = p.Do(t.Context())
			if connect.CodeOf(err) != refusal.Code() {
				t.Fatalf("second Do = %v", err)
			}
			if got := f.methods(); !slices.Equal(got, []string{"GetServerInfo", "GetWorkspace", "GetWorkspace", "StopWorkspace", "StopWorkspace"}) {
				t.Errorf("requests = %v, want one read of the revision and no other", got)
			}
			reqs := f.requests("StopWorkspace")
			if !proto.Equal(reqs[0], reqs[1]) || reqs[0].(*ctrlv1.StopWorkspaceRequest).GetExpectedExpirationRevision() != 7 {
				t.Errorf("stops sent %v, want the same request with revision 7 twice", reqs)
			}
			if refusal.Code() == connect.CodeFailedPrecondition && ws.Last().GetExpiration().GetRevision() != 8 {
				t.Errorf("handle after the refusal shows revision %d, want the observed 8", ws.Last().GetExpiration().GetRevision())
			}
		})
	}
}

func TestMissingCapabilitySendsNothing(t *testing.T) {
	expiring := spec
	expiring.Expiration = &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, Deadline: timestamppb.Now()}
	tests := []struct {
		name       string
		caps       []string
		op         func(*testing.T, *kibotos.Client) error
		capability string
		field      string
	}{
		{"create without workspace.create", nil, func(t *testing.T, c *kibotos.Client) error {
			_, err := c.Workspaces().Create(t.Context(), spec)
			return err
		}, capability.WorkspaceCreate, ""},
		{"create with an expiration, without workspace.expiration", allWorkspaceCaps, func(t *testing.T, c *kibotos.Client) error {
			_, err := c.Workspaces().Create(t.Context(), expiring)
			return err
		}, capability.WorkspaceExpiration, "expiration"},
		{"stop without workspace.stop", []string{capability.WorkspaceCreate}, func(t *testing.T, c *kibotos.Client) error {
			return c.Workspaces().Handle(fakeWorkspaceID).Stop(t.Context(), kibotos.CurrentExpirationRevision())
		}, capability.WorkspaceStop, ""},
		{"stop with an expiration, without workspace.expiration", allWorkspaceCaps, func(t *testing.T, c *kibotos.Client) error {
			return c.Workspaces().Handle(fakeWorkspaceID).Stop(t.Context(), kibotos.ExpectExpirationRevision(1), kibotos.WithStopExpiration(expiring.Expiration))
		}, capability.WorkspaceExpiration, "expiration"},
		{"start without workspace.start", []string{capability.WorkspaceCreate}, func(t *testing.T, c *kibotos.Client) error {
			return c.Workspaces().Handle(fakeWorkspaceID).Start(t.Context(), kibotos.ExpectExpirationRevision(1))
		}, capability.WorkspaceStart, ""},
		{"delete without workspace.delete", []string{capability.WorkspaceCreate}, func(t *testing.T, c *kibotos.Client) error {
			return c.Workspaces().Handle(fakeWorkspaceID).Delete(t.Context(), kibotos.CurrentExpirationRevision())
		}, capability.WorkspaceDelete, ""},
		{"list without workspace.create", nil, func(t *testing.T, c *kibotos.Client) error {
			for _, err := range c.Workspaces().List(t.Context(), nil) {
				return err
			}
			return nil
		}, capability.WorkspaceCreate, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeCtrl(tt.caps...).on("GetWorkspace", current(1)).on("CreateWorkspace", accept()).on("StopWorkspace", stopped())
			c := clientOf(t, f)
			err := tt.op(t, c)
			var me *kibotos.MissingCapabilityError
			if !errors.As(err, &me) || me.Capability != tt.capability || me.Field != tt.field {
				t.Fatalf("error = %v, want a *MissingCapabilityError for %s (field %q)", err, tt.capability, tt.field)
			}
			if got := f.methods(); !slices.Equal(got, []string{"GetServerInfo"}) {
				t.Errorf("requests = %v, want GetServerInfo alone", got)
			}
		})
	}
}

func TestServerInfoIsReadOnce(t *testing.T) {
	f := newFakeCtrl(allWorkspaceCaps...).on("CreateWorkspace", accept()).on("GetWorkspace", current(1)).on("StopWorkspace", stopped())
	c := clientOf(t, f)
	ws, err := c.Workspaces().Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := ws.Stop(t.Context(), kibotos.CurrentExpirationRevision()); err != nil {
		t.Fatal(err)
	}
	if n := f.count("GetServerInfo"); n != 1 {
		t.Errorf("GetServerInfo called %d times, want 1", n)
	}
	if _, err := c.RefreshServerInfo(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ServerInfo(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := f.count("GetServerInfo"); n != 2 {
		t.Errorf("GetServerInfo called %d times after RefreshServerInfo, want 2", n)
	}
}

func TestWorkspaceWait(t *testing.T) {
	f := newFakeCtrl(allWorkspaceCaps...).on("CreateWorkspace", accept()).on("GetWorkspace", current(1)).
		on("GetWorkspaceCommand", script(processing, completed))
	c := clientOf(t, f)
	ws, err := c.Workspaces().Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Wait(t.Context()); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	for _, r := range f.requests("GetWorkspaceCommand") {
		if id := r.(*ctrlv1.GetWorkspaceCommandRequest).GetCommandId(); id != ws.CommandID() {
			t.Errorf("Wait read command %s, want %s", id, ws.CommandID())
		}
	}
	if ws.Last().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || ws.Command().GetStatus() != statusCompleted {
		t.Errorf("after Wait: %v, %v; want AVAILABLE and the completed command", ws.Last().GetState(), ws.Command())
	}

	got, err := c.Workspaces().Get(t.Context(), fakeWorkspaceID)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.Wait(t.Context()); err == nil {
		t.Error("Wait on a handle that sent no command = nil error, want one")
	}
}

func TestWorkspacesList(t *testing.T) {
	pages := map[string]*ctrlv1.ListWorkspacesResponse{
		"":   {Workspaces: []*ctrlv1.Workspace{{WorkspaceId: "ws-1"}, {WorkspaceId: "ws-2"}}, NextPageToken: "p2"},
		"p2": {Workspaces: []*ctrlv1.Workspace{{WorkspaceId: "ws-3"}}, NextPageToken: "p3"},
		"p3": {Workspaces: []*ctrlv1.Workspace{{WorkspaceId: "ws-4"}}},
	}
	f := newFakeCtrl(allWorkspaceCaps...).on("ListWorkspaces", func(_ context.Context, n int, req proto.Message) (proto.Message, error) {
		r := req.(*ctrlv1.ListWorkspacesRequest)
		if n == 2 {
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("store unavailable")) // a read is resent
		}
		if r.GetLabelSelector()["team"] != "ml" {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("filter lost"))
		}
		return pages[r.GetPageToken()], nil
	})
	c := clientOf(t, f)
	filter := &ctrlv1.ListWorkspacesRequest{LabelSelector: map[string]string{"team": "ml"}}
	var ids []string
	for ws, err := range c.Workspaces().List(t.Context(), filter) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ws.ID())
	}
	if !slices.Equal(ids, []string{"ws-1", "ws-2", "ws-3", "ws-4"}) {
		t.Errorf("List = %v, want ws-1 to ws-4", ids)
	}
	if filter.GetPageToken() != "" {
		t.Error("List changed the caller's filter")
	}
	// Breaking out of the loop reads no further page.
	before := f.count("ListWorkspaces")
	for ws, err := range c.Workspaces().List(t.Context(), filter) {
		if err != nil || ws.ID() != "ws-1" {
			t.Fatalf("first item = %v, %v", ws, err)
		}
		break
	}
	if n := f.count("ListWorkspaces") - before; n != 1 {
		t.Errorf("a loop that stopped after one item read %d pages, want 1", n)
	}
}

func TestWriteErrorMessage(t *testing.T) {
	err := &kibotos.WriteError{Procedure: "/kibotos.ctrl.v1.WorkspaceService/StopWorkspace", CommandID: "cmd-1", Err: connect.NewError(connect.CodeAborted, errors.New("moved"))}
	if got, want := err.Error(), "StopWorkspace (command ID cmd-1): aborted: moved"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if connect.CodeOf(fmt.Errorf("wrapped: %w", err)) != connect.CodeAborted {
		t.Error("connect.CodeOf does not read through WriteError")
	}
}
