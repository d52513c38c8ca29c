package cli

import (
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
)

var getWorkspacePath = ctrlv1connect.WorkspaceServiceGetWorkspaceProcedure

// labeled is the Workspace the fake returns to the map commands.
func labeled() *ctrlv1.Workspace {
	return &ctrlv1.Workspace{
		WorkspaceId: fakeWorkspaceID, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE,
		Labels: map[string]string{"a": "1", "b": "2"}, LabelsRevision: 7,
		Annotations: map[string]string{"note": "x"}, AnnotationsRevision: 3,
		Expiration: &ctrlv1.Expiration{Revision: 5},
	}
}

var (
	revisionMismatch = detailed(connect.CodeAborted, &ctrlv1.ErrorDetail{
		Reason: ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, CommandSettled: true, Message: "labels_revision is 8, not 7",
	})
	unavailable = connect.NewError(connect.CodeUnavailable, errors.New("connection reset"))
)

// TestMapEdits: KEY=VALUE and KEY- edit the map read once before the first
// attempt; --replace and --clear send the map given. An aborted write is
// never followed by a second read: GetWorkspace is called at most once.
func TestMapEdits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		args      []string
		fail      []error
		code      int
		gets      int                                    // GetWorkspace calls
		sent      []*ctrlv1.UpdateWorkspaceLabelsRequest // without metadata
		wantHint  bool
		annotated bool // the annotations command, not labels
	}{
		{
			name: "set and remove",
			args: []string{"a-", "c=3", "b=2"},
			gets: 1,
			sent: []*ctrlv1.UpdateWorkspaceLabelsRequest{{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 7, Labels: map[string]string{"b": "2", "c": "3"}}},
		},
		{
			name: "removing what is absent changes nothing",
			args: []string{"zzz-"},
			gets: 1,
			sent: []*ctrlv1.UpdateWorkspaceLabelsRequest{{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 7, Labels: map[string]string{"a": "1", "b": "2"}}},
		},
		{
			name: "edits with the revision given",
			args: []string{"c=3", "--expected-revision", "6"},
			gets: 1,
			sent: []*ctrlv1.UpdateWorkspaceLabelsRequest{{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 6, Labels: map[string]string{"a": "1", "b": "2", "c": "3"}}},
		},
		{
			name:     "aborted: no second read, no new revision, a hint",
			args:     []string{"c=3", "--retry"},
			fail:     []error{revisionMismatch},
			code:     10,
			gets:     1,
			sent:     []*ctrlv1.UpdateWorkspaceLabelsRequest{{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 7, Labels: map[string]string{"a": "1", "b": "2", "c": "3"}}},
			wantHint: true,
		},
		{
			name: "unknown result: resent as it was, not read again",
			args: []string{"c=3", "--retry"},
			fail: []error{unavailable, unavailable},
			gets: 1,
			sent: []*ctrlv1.UpdateWorkspaceLabelsRequest{
				{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 7, Labels: map[string]string{"a": "1", "b": "2", "c": "3"}},
				{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 7, Labels: map[string]string{"a": "1", "b": "2", "c": "3"}},
				{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 7, Labels: map[string]string{"a": "1", "b": "2", "c": "3"}},
			},
		},
		{
			name: "replace with a revision: no read",
			args: []string{"--replace", "x=1", "--expected-revision", "4"},
			sent: []*ctrlv1.UpdateWorkspaceLabelsRequest{{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 4, Labels: map[string]string{"x": "1"}}},
		},
		{
			name: "replace with current: one read",
			args: []string{"--replace", "x=1", "--expected-revision", "current"},
			gets: 1,
			sent: []*ctrlv1.UpdateWorkspaceLabelsRequest{{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 7, Labels: map[string]string{"x": "1"}}},
		},
		{
			name:     "replace with current, aborted",
			args:     []string{"--replace", "x=1", "--expected-revision", "current", "--retry"},
			fail:     []error{revisionMismatch},
			code:     10,
			gets:     1,
			sent:     []*ctrlv1.UpdateWorkspaceLabelsRequest{{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 7, Labels: map[string]string{"x": "1"}}},
			wantHint: true,
		},
		{
			name: "clear",
			args: []string{"--clear", "--expected-revision", "7"},
			sent: []*ctrlv1.UpdateWorkspaceLabelsRequest{{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 7}},
		},
		{
			name:      "annotations",
			args:      []string{"note-", "owner=ops@example.com"},
			gets:      1,
			annotated: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, capability.WorkspaceCreate)
			f.ws.current = labeled()
			method, what := "UpdateWorkspaceLabels", "labels"
			if tt.annotated {
				method, what = "UpdateWorkspaceAnnotations", "annotations"
			}
			f.ws.fail = map[string][]error{method: tt.fail}
			r := kibo(t, args(f.conn(), append([]string{"workspace", what, fakeWorkspaceID}, tt.args...)...)...).want(t, tt.code)
			if n := f.count(getWorkspacePath); n != tt.gets {
				t.Errorf("GetWorkspace called %d times, want %d", n, tt.gets)
			}
			if got := strings.Contains(r.stderr, "hint: the labels of workspace "+fakeWorkspaceID+" changed after kibo read them (labels_revision 7)"); got != tt.wantHint {
				t.Errorf("hint = %v, want %v; stderr:\n%s", got, tt.wantHint, r.stderr)
			}
			got := f.ws.requests()
			if tt.annotated {
				want := &ctrlv1.UpdateWorkspaceAnnotationsRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 3, Annotations: map[string]string{"owner": "ops@example.com"}}
				if len(got) != 1 {
					t.Fatalf("got %d requests", len(got))
				}
				if diff := cmp.Diff(want, got[0], protocmp.Transform(), protocmp.IgnoreFields(want, "metadata")); diff != "" {
					t.Errorf("request (-want +got):\n%s", diff)
				}
				return
			}
			if len(got) != len(tt.sent) {
				t.Fatalf("UpdateWorkspaceLabels received %d times, want %d", len(got), len(tt.sent))
			}
			id := got[0].(*ctrlv1.UpdateWorkspaceLabelsRequest).GetMetadata().GetCommandId()
			for i, w := range tt.sent {
				if diff := cmp.Diff(w, got[i], protocmp.Transform(), protocmp.IgnoreFields(w, "metadata")); diff != "" {
					t.Errorf("attempt %d (-want +got):\n%s", i+1, diff)
				}
				if c := got[i].(*ctrlv1.UpdateWorkspaceLabelsRequest).GetMetadata().GetCommandId(); c != id {
					t.Errorf("attempt %d carried command ID %q, want %q", i+1, c, id)
				}
			}
		})
	}
}

// TestMapEditsUsage: what the edits cannot mean is a usage error, and
// nothing is sent.
func TestMapEditsUsage(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.WorkspaceCreate)
	for _, a := range [][]string{
		{},
		{"--expected-revision", "1"},
		{"novalue"},
		{"=x"},
		{"-"},
		{"a=1", "a=2"},
		{"a=1", "a-"},
		{"a-", "a=1"},
		{"--replace", "a=1"},
		{"--replace", "--expected-revision", "1"},
		{"--replace", "a-", "--expected-revision", "1"},
		{"--clear"},
		{"--clear", "a=1", "--expected-revision", "1"},
		{"--clear", "--replace", "--expected-revision", "1"},
		{"a=1", "--expected-revision", "soon"},
	} {
		r := kibo(t, args(f.conn(), append([]string{"workspace", "labels", fakeWorkspaceID}, a...)...)...)
		if r.code != ExitUsage {
			t.Errorf("kibo workspace labels ID %s: exit %d, want 2\n%s", strings.Join(a, " "), r.code, r.stderr)
		}
	}
	kibo(t, args(f.conn(), "workspace", "labels")...).want(t, ExitUsage)
	if got := f.requests(); len(got) != 0 {
		t.Errorf("usage errors sent %v", got)
	}
}

// TestExpectedExpirationCurrent: "current" reads the expiration revision
// once before the first attempt, never after a failure; leaving the flag
// out is a usage error.
func TestExpectedExpirationCurrent(t *testing.T) {
	t.Parallel()
	mismatch := detailed(connect.CodeFailedPrecondition, &ctrlv1.ErrorDetail{
		Reason: ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH, CommandSettled: true, Message: "expiration revision is 6, not 5",
		ObservedWorkspace: &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, Expiration: &ctrlv1.Expiration{Revision: 6}},
	})
	tests := []struct {
		name   string
		op     string
		args   []string
		fail   []error
		code   int
		gets   int
		sends  int
		expect uint64
		hint   string
	}{
		{name: "stop current", op: "stop", args: []string{"--expected-expiration-revision", "current"}, gets: 1, sends: 1, expect: 5},
		{name: "stop number", op: "stop", args: []string{"--expected-expiration-revision", "9"}, sends: 1, expect: 9},
		{name: "start current", op: "start", args: []string{"--expected-expiration-revision", "current"}, gets: 1, sends: 1, expect: 5},
		{name: "delete current", op: "delete", args: []string{"--expected-expiration-revision", "current"}, gets: 1, sends: 1, expect: 5},
		{
			name: "mismatch: no second read", op: "stop", args: []string{"--expected-expiration-revision", "current", "--retry"},
			fail: []error{mismatch}, code: 9, gets: 1, sends: 1, expect: 5,
			hint: "hint: the expiration of workspace " + fakeWorkspaceID + " changed after kibo read it (revision 5)",
		},
		{
			name: "unknown results: same revision resent", op: "delete", args: []string{"--expected-expiration-revision", "current", "--retry"},
			fail: []error{unavailable, unavailable}, gets: 1, sends: 3, expect: 5,
		},
		{
			name: "mismatch of the revision given: no hint", op: "stop", args: []string{"--expected-expiration-revision", "5"},
			fail: []error{mismatch}, code: 9, sends: 1, expect: 5,
		},
	}
	methods := map[string]string{"stop": "StopWorkspace", "start": "StartWorkspace", "delete": "DeleteWorkspace"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, capability.WorkspaceCreate, capability.WorkspaceStart, capability.WorkspaceStop, capability.WorkspaceDelete)
			f.ws.current = labeled()
			f.ws.fail = map[string][]error{methods[tt.op]: tt.fail}
			r := kibo(t, args(f.conn(), append([]string{"workspace", tt.op, fakeWorkspaceID}, tt.args...)...)...).want(t, tt.code)
			if n := f.count(getWorkspacePath); n != tt.gets {
				t.Errorf("GetWorkspace called %d times, want %d", n, tt.gets)
			}
			got := f.ws.requests()
			if len(got) != tt.sends {
				t.Fatalf("%s received %d times, want %d", methods[tt.op], len(got), tt.sends)
			}
			for i, req := range got {
				rev := req.(interface{ GetExpectedExpirationRevision() uint64 }).GetExpectedExpirationRevision()
				if rev != tt.expect {
					t.Errorf("attempt %d: expected_expiration_revision %d, want %d", i+1, rev, tt.expect)
				}
			}
			if tt.hint == "" && strings.Contains(r.stderr, "hint:") || tt.hint != "" && !strings.Contains(r.stderr, tt.hint) {
				t.Errorf("stderr (want hint %q):\n%s", tt.hint, r.stderr)
			}
		})
	}

	f := newFake(t, capability.WorkspaceCreate, capability.WorkspaceStop)
	for _, a := range [][]string{
		{"workspace", "stop", fakeWorkspaceID},
		{"workspace", "stop", fakeWorkspaceID, "--expected-expiration-revision", "latest"},
		{"workspace", "stop", fakeWorkspaceID, "--expected-expiration-revision", "-1"},
		{"workspace", "delete", fakeWorkspaceID},
	} {
		kibo(t, args(f.conn(), a...)...).want(t, ExitUsage)
	}
	if got := f.requests(); len(got) != 0 {
		t.Errorf("usage errors sent %v", got)
	}
	// The read needs its capability too, checked before anything else.
	f = newFake(t, capability.WorkspaceStop)
	kibo(t, args(f.conn(), "workspace", "stop", fakeWorkspaceID, "--expected-expiration-revision", "current")...).want(t, ExitUnavailable)
	if diff := cmp.Diff([]string{infoPath}, f.requests()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

// TestAlreadyDoneHint: a state change refused because the Workspace is
// already where it leads explains itself and keeps the exit code.
func TestAlreadyDoneHint(t *testing.T) {
	t.Parallel()
	refused := func(st ctrlv1.WorkspaceState) error {
		return detailed(connect.CodeFailedPrecondition, &ctrlv1.ErrorDetail{
			Reason: ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, CommandSettled: true, Message: "not accepted in this state",
			ObservedWorkspace: &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID, State: st},
		})
	}
	for _, tt := range []struct {
		op, method string
		state      ctrlv1.WorkspaceState
		hint       string
	}{
		{"stop", "StopWorkspace", ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, "hint: workspace " + fakeWorkspaceID + " is already STOPPED; nothing to do\n"},
		{"start", "StartWorkspace", ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, "hint: workspace " + fakeWorkspaceID + " is already AVAILABLE; nothing to do\n"},
		{"delete", "DeleteWorkspace", ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, "hint: workspace " + fakeWorkspaceID + " is already DELETED; nothing to do\n"},
		{"stop", "StopWorkspace", ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, ""},
	} {
		f := newFake(t, capability.WorkspaceStart, capability.WorkspaceStop, capability.WorkspaceDelete)
		f.ws.fail = map[string][]error{tt.method: {refused(tt.state)}}
		r := kibo(t, args(f.conn(), "workspace", tt.op, fakeWorkspaceID, "--expected-expiration-revision", "1")...).want(t, 9)
		if !strings.HasPrefix(r.stderr, "command-id: ") || !strings.Contains(r.stderr, "error: failed_precondition STATE_CONFLICT") {
			t.Errorf("%s in %v: stderr:\n%s", tt.op, tt.state, r.stderr)
		}
		if tt.hint == "" && strings.Contains(r.stderr, "hint:") || !strings.HasSuffix(r.stderr, tt.hint) {
			t.Errorf("%s in %v: stderr does not end with %q:\n%s", tt.op, tt.state, tt.hint, r.stderr)
		}
	}
}
