package cli

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// result is what one kibo run produced.
type result struct {
	code           int
	stdout, stderr string
}

// testEnv is a hermetic environment: no KIBO_* variables, an empty home
// directory, no terminal, unless the test sets them; the working directory is
// the process's.
func testEnv(t *testing.T) env {
	home := t.TempDir()
	return env{
		lookupEnv:  func(string) (string, bool) { return "", false },
		homeDir:    func() (string, error) { return home, nil },
		isTerminal: func(io.Writer) bool { return false },
		now:        time.Now,
		getwd:      os.Getwd,
	}
}

// kibo runs kibo in-process in a hermetic environment.
func kibo(t *testing.T, args ...string) result {
	t.Helper()
	return kiboWith(t, testEnv(t), "", args...)
}

func kiboWith(t *testing.T, e env, stdin string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), e, args, strings.NewReader(stdin), &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// want fails the test when r did not exit with code.
func (r result) want(t *testing.T, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	return r
}

// conn returns the connection flags of a ctrltest server.
func conn(e *ctrltest.Env) []string {
	return []string{"--endpoint", e.URL, "--ca", e.PKI.CA, "--cert", e.PKI.Operator, "--key", e.PKI.OperatorKey}
}

func args(prefix []string, rest ...string) []string {
	return append(append([]string(nil), prefix...), rest...)
}

var normalizers = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`eg-[a-z0-9]{20}`), "eg-XXXXXXXXXXXXXXXXXXXX"},
	{regexp.MustCompile(`rs-[a-z0-9]{20}`), "rs-XXXXXXXXXXXXXXXXXXXX"},
	{regexp.MustCompile(`ws-[a-z0-9]{20}`), "ws-XXXXXXXXXXXXXXXXXXXX"},
	{regexp.MustCompile(`cmd-[a-z0-9]{26}`), "cmd-XXXX"},
	{regexp.MustCompile(`\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})`), "TIME"},
}

// normalize replaces IDs (keeping their length, so tables stay aligned) and
// times, which change from run to run.
func normalize(s string) string {
	for _, n := range normalizers {
		s = n.re.ReplaceAllString(s, n.repl)
	}
	return s
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s mismatch (-want +got; go test -update rewrites it):\n%s", path, diff)
	}
}

// fake is a small ctrl server for what ctrltest cannot provoke: a server
// without a capability, scripted failures. It records every request.
type fake struct {
	ctrlv1connect.UnimplementedEgressServiceHandler
	ctrlv1connect.UnimplementedServerInfoServiceHandler

	URL  string
	CA   string
	caps []string

	ws *fakeWorkspaces

	mu       sync.Mutex
	paths    []string
	ids      []string // command IDs of CreateEgress, in order
	failures []error  // answers of CreateEgress, then success
}

func newFake(t *testing.T, caps ...string) *fake {
	t.Helper()
	f := &fake{caps: caps, ws: &fakeWorkspaces{}}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewServerInfoServiceHandler(f))
	mux.Handle(ctrlv1connect.NewEgressServiceHandler(f))
	mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(f.ws))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.paths = append(f.paths, r.URL.Path)
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	f.URL = srv.URL
	f.CA = filepath.Join(t.TempDir(), "ca.pem")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(f.CA, ca, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fake) conn() []string { return []string{"--endpoint", f.URL, "--ca", f.CA} }

// requests returns the paths of every request received.
func (f *fake) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.paths...)
}

// count returns how many requests of the procedure proc the server received.
func (f *fake) count(proc string) int {
	n := 0
	for _, p := range f.requests() {
		if p == proc {
			n++
		}
	}
	return n
}

func (f *fake) commandIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ids...)
}

func (f *fake) GetServerInfo(context.Context, *connect.Request[ctrlv1.GetServerInfoRequest]) (*connect.Response[ctrlv1.GetServerInfoResponse], error) {
	return connect.NewResponse(&ctrlv1.GetServerInfoResponse{SourceRevision: "fake", Capabilities: f.caps}), nil
}

func (f *fake) CreateEgress(_ context.Context, req *connect.Request[ctrlv1.CreateEgressRequest]) (*connect.Response[ctrlv1.CreateEgressResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids = append(f.ids, req.Msg.GetMetadata().GetCommandId())
	if n := len(f.ids); n <= len(f.failures) {
		return nil, f.failures[n-1]
	}
	return connect.NewResponse(&ctrlv1.CreateEgressResponse{Egress: &ctrlv1.Egress{
		EgressId: "eg-abcdefghijklmnopqrst", Spec: req.Msg.GetSpec(), Revision: 1, LabelsRevision: 1, AnnotationsRevision: 1,
		CreatedAt: timestamppb.Now(), UpdatedAt: timestamppb.Now(),
	}}), nil
}

// detailed is an error as ctrl returns it.
func detailed(code connect.Code, d *ctrlv1.ErrorDetail) *connect.Error {
	ce := connect.NewError(code, errors.New(d.GetMessage()))
	ed, err := connect.NewErrorDetail(d)
	if err != nil {
		panic(err)
	}
	ce.AddDetail(ed)
	return ce
}

// fakeWorkspaces accepts CreateWorkspace and answers GetWorkspaceCommand
// from a script of statuses, the last one repeated. GetWorkspace returns
// current; the state changes and the label and annotation updates record
// their requests and answer with the scripted failures first.
type fakeWorkspaces struct {
	ctrlv1connect.UnimplementedWorkspaceServiceHandler

	mu    sync.Mutex
	polls int
	// script is the status of each poll; its last entry repeats.
	script []ctrlv1.WorkspaceCommandStatus
	// failure is the error of the command once COMPLETED.
	failure *ctrlv1.CommandError
	// current is what GetWorkspace returns (an AVAILABLE Workspace when
	// nil).
	current *ctrlv1.Workspace
	// fail are the answers of each method (by name), in order, before it
	// succeeds.
	fail map[string][]error
	// got are the requests of the state changes and updates, in order.
	got []proto.Message
}

const fakeWorkspaceID = "ws-abcdefghijklmnopqrst"

func (f *fakeWorkspaces) CreateWorkspace(_ context.Context, req *connect.Request[ctrlv1.CreateWorkspaceRequest]) (*connect.Response[ctrlv1.CreateWorkspaceResponse], error) {
	if err := f.record("CreateWorkspace", req.Msg); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.CreateWorkspaceResponse{
		Workspace: &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, Resources: req.Msg.GetResources()},
		Command:   f.command(req.Msg.GetMetadata().GetCommandId(), ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING),
	}), nil
}

func (f *fakeWorkspaces) GetWorkspace(context.Context, *connect.Request[ctrlv1.GetWorkspaceRequest]) (*connect.Response[ctrlv1.GetWorkspaceResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ws := f.current
	if ws == nil {
		ws = &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE}
	}
	return connect.NewResponse(&ctrlv1.GetWorkspaceResponse{Workspace: proto.CloneOf(ws)}), nil
}

// record records a request of method and returns its scripted failure, if
// one is left.
func (f *fakeWorkspaces) record(method string, req proto.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, proto.Clone(req))
	if errs := f.fail[method]; len(errs) > 0 {
		f.fail[method] = errs[1:]
		return errs[0]
	}
	return nil
}

// requests returns the requests recorded.
func (f *fakeWorkspaces) requests() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), f.got...)
}

func (f *fakeWorkspaces) workspace() *ctrlv1.Workspace {
	return &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE}
}

func (f *fakeWorkspaces) StopWorkspace(_ context.Context, req *connect.Request[ctrlv1.StopWorkspaceRequest]) (*connect.Response[ctrlv1.StopWorkspaceResponse], error) {
	if err := f.record("StopWorkspace", req.Msg); err != nil {
		return nil, err
	}
	ws := f.workspace()
	ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
	return connect.NewResponse(&ctrlv1.StopWorkspaceResponse{Workspace: ws, Command: f.command(req.Msg.GetMetadata().GetCommandId(), completed)}), nil
}

func (f *fakeWorkspaces) StartWorkspace(_ context.Context, req *connect.Request[ctrlv1.StartWorkspaceRequest]) (*connect.Response[ctrlv1.StartWorkspaceResponse], error) {
	if err := f.record("StartWorkspace", req.Msg); err != nil {
		return nil, err
	}
	ws := f.workspace()
	ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
	return connect.NewResponse(&ctrlv1.StartWorkspaceResponse{Workspace: ws, Command: f.command(req.Msg.GetMetadata().GetCommandId(), processing)}), nil
}

func (f *fakeWorkspaces) DeleteWorkspace(_ context.Context, req *connect.Request[ctrlv1.DeleteWorkspaceRequest]) (*connect.Response[ctrlv1.DeleteWorkspaceResponse], error) {
	if err := f.record("DeleteWorkspace", req.Msg); err != nil {
		return nil, err
	}
	ws := f.workspace()
	ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
	return connect.NewResponse(&ctrlv1.DeleteWorkspaceResponse{Workspace: ws, Command: f.command(req.Msg.GetMetadata().GetCommandId(), completed)}), nil
}

func (f *fakeWorkspaces) UpdateWorkspaceLabels(_ context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceLabelsRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceLabelsResponse], error) {
	if err := f.record("UpdateWorkspaceLabels", req.Msg); err != nil {
		return nil, err
	}
	ws := f.workspace()
	ws.Labels, ws.LabelsRevision = req.Msg.GetLabels(), req.Msg.GetExpectedRevision()+1
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceLabelsResponse{Workspace: ws}), nil
}

func (f *fakeWorkspaces) UpdateWorkspaceAnnotations(_ context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceAnnotationsResponse], error) {
	if err := f.record("UpdateWorkspaceAnnotations", req.Msg); err != nil {
		return nil, err
	}
	ws := f.workspace()
	ws.Annotations, ws.AnnotationsRevision = req.Msg.GetAnnotations(), req.Msg.GetExpectedRevision()+1
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceAnnotationsResponse{Workspace: ws}), nil
}

func (f *fakeWorkspaces) ListWorkspaces(_ context.Context, req *connect.Request[ctrlv1.ListWorkspacesRequest]) (*connect.Response[ctrlv1.ListWorkspacesResponse], error) {
	if err := f.record("ListWorkspaces", req.Msg); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.ListWorkspacesResponse{Workspaces: []*ctrlv1.Workspace{f.workspace(), {WorkspaceId: "ws-bbbbbbbbbbbbbbbbbbbb"}}}), nil
}

func (f *fakeWorkspaces) GetWorkspaceCommand(_ context.Context, req *connect.Request[ctrlv1.GetWorkspaceCommandRequest]) (*connect.Response[ctrlv1.GetWorkspaceCommandResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.polls++
	st := f.script[min(f.polls, len(f.script))-1]
	return connect.NewResponse(&ctrlv1.GetWorkspaceCommandResponse{Command: f.command(req.Msg.GetCommandId(), st)}), nil
}

func (f *fakeWorkspaces) pollCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.polls
}

func (f *fakeWorkspaces) command(id string, st ctrlv1.WorkspaceCommandStatus) *ctrlv1.WorkspaceCommand {
	c := &ctrlv1.WorkspaceCommand{
		CommandId: id, WorkspaceId: fakeWorkspaceID, Status: st,
		Kind: ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_CREATE, Initiator: ctrlv1.CommandInitiator_COMMAND_INITIATOR_CALLER,
	}
	if st == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
		c.Error = f.failure
	}
	return c
}

// UpdateWorkspaceNetworkPolicy records the request and answers with the
// Workspace holding the policy at expected_revision+1, APPLIED, and a
// completed command.
func (f *fakeWorkspaces) UpdateWorkspaceNetworkPolicy(_ context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceNetworkPolicyRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceNetworkPolicyResponse], error) {
	if err := f.record("UpdateWorkspaceNetworkPolicy", req.Msg); err != nil {
		return nil, err
	}
	ws := f.workspace()
	ws.NetworkPolicy = proto.CloneOf(req.Msg.GetNetworkPolicy())
	ws.NetworkPolicy.Revision = req.Msg.GetExpectedRevision() + 1
	ws.NetworkPolicyStatus = &ctrlv1.NetworkPolicyStatus{AppliedRevision: ws.NetworkPolicy.Revision, State: ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED}
	for _, r := range req.Msg.GetNetworkPolicy().GetEgresses() {
		ws.NetworkPolicyStatus.Egresses = append(ws.NetworkPolicyStatus.Egresses, &ctrlv1.EgressStatus{EgressId: r.GetEgressId(), AppliedRevision: 1})
	}
	c := f.command(req.Msg.GetMetadata().GetCommandId(), completed)
	c.Kind = ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_NETWORK_POLICY
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceNetworkPolicyResponse{Workspace: ws, Command: c}), nil
}
