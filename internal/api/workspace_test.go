package api_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

func wsEnv(t *testing.T, o ctrltest.Options) (*ctrltest.Env, ctrltest.Clients, *agenttest.Runtime) {
	rt := agenttest.New()
	o.Runtime = rt
	e := ctrltest.New(t, o)
	return e, e.Clients(e.HTTP), rt
}

func createWS(t testing.TB, c ctrltest.Clients, id string) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand) {
	t.Helper()
	r, err := c.Workspace.CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md(id), Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500}, Labels: map[string]string{"t": "x"},
	}))
	if err != nil {
		t.Fatalf("CreateWorkspace(%s) = %v", id, err)
	}
	return r.Msg.GetWorkspace(), r.Msg.GetCommand()
}

// waitCommand polls GetWorkspaceCommand until the command completes.
func waitCommand(t testing.TB, c ctrltest.Clients, id string) *ctrlv1.WorkspaceCommand {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r, err := c.Workspace.GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: id}))
		if err != nil {
			t.Fatalf("GetWorkspaceCommand(%s) = %v", id, err)
		}
		if r.Msg.GetCommand().GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
			return r.Msg.GetCommand()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("command %s did not complete", id)
	return nil
}

func getWS(t *testing.T, c ctrltest.Clients, id string) *ctrlv1.Workspace {
	t.Helper()
	r, err := c.Workspace.GetWorkspace(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return r.Msg.GetWorkspace()
}

func waitState(t *testing.T, c ctrltest.Clients, id string, want ctrlv1.WorkspaceState) *ctrlv1.Workspace {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var w *ctrlv1.Workspace
	for time.Now().Before(deadline) {
		if w = getWS(t, c, id); w.GetState() == want {
			return w
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("workspace %s is %v, want %v", id, w.GetState(), want)
	return nil
}

func stopWS(c ctrltest.Clients, t *testing.T, cid string, w *ctrlv1.Workspace, force bool) (*ctrlv1.StopWorkspaceResponse, error) {
	mode := ctrlv1.StopMode_STOP_MODE_UNSPECIFIED
	if force {
		mode = ctrlv1.StopMode_STOP_MODE_FORCE
	}
	r, err := c.Workspace.StopWorkspace(t.Context(), connect.NewRequest(&ctrlv1.StopWorkspaceRequest{
		Metadata: md(cid), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: w.GetExpiration().GetRevision(), Mode: mode}))
	if err != nil {
		return nil, err
	}
	return r.Msg, nil
}

func TestWorkspaceLifecycle(t *testing.T) {
	t.Parallel()
	_, c, rt := wsEnv(t, ctrltest.Options{})
	ctx := t.Context()
	w, cmd := createWS(t, c, "life-create")
	if w.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING || cmd.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING {
		t.Fatalf("create returned %v / %v, want CREATING / PROCESSING", w.GetState(), cmd.GetStatus())
	}
	if w.GetExpiration().GetRevision() != 1 {
		t.Fatalf("expiration revision at creation = %d, want 1", w.GetExpiration().GetRevision())
	}
	// Replaying the creation returns the acceptance again.
	again, _ := createWS(t, c, "life-create")
	if again.GetWorkspaceId() != w.GetWorkspaceId() || again.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING {
		t.Fatalf("replayed create = %v", again)
	}
	done := waitCommand(t, c, "life-create")
	if done.GetError() != nil || done.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_CREATE || done.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_CALLER {
		t.Fatalf("create command = %v", done)
	}
	w = getWS(t, c, w.GetWorkspaceId())
	if w.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || !w.GetHoldsExecution() ||
		w.GetPlacement().GetNodeId() != "node-1" || w.GetGuestObservation().GetCondition() != ctrlv1.GuestCondition_GUEST_CONDITION_READY ||
		!w.GetWritableLayer().GetExists() {
		t.Fatalf("after create: %v", w)
	}
	if rt.Starts[w.GetWorkspaceId()] != 1 {
		t.Fatalf("started %d times, want 1", rt.Starts[w.GetWorkspaceId()])
	}

	// Normal stop waits for completion.
	stop, err := stopWS(c, t, "life-stop", w, false)
	if err != nil {
		t.Fatal(err)
	}
	if stop.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || stop.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
		t.Fatalf("stop returned %v / %v", stop.GetWorkspace().GetState(), stop.GetCommand().GetStatus())
	}
	if rt.Running(w.GetWorkspaceId()) {
		t.Fatal("the execution still runs after stop")
	}
	replay, err := stopWS(c, t, "life-stop", w, false)
	if err != nil || replay.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Fatalf("replayed stop = %v, %v", replay, err)
	}
	// A second stop (new ID) of a stopped workspace is refused.
	_, err = stopWS(c, t, "life-stop-2", w, false)
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)

	// Start.
	st, err := c.Workspace.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("life-start"), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1}))
	if err != nil || st.Msg.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING {
		t.Fatalf("start = %v, %v", st, err)
	}
	if c := waitCommand(t, c, "life-start"); c.GetError() != nil {
		t.Fatalf("start failed: %v", c.GetError())
	}
	waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)

	// Labels on a running workspace.
	lr, err := c.Workspace.UpdateWorkspaceLabels(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceLabelsRequest{Metadata: md("life-labels"), WorkspaceId: w.GetWorkspaceId(), ExpectedRevision: 1, Labels: map[string]string{"new": "1"}}))
	if err != nil || lr.Msg.GetWorkspace().GetLabelsRevision() != 2 {
		t.Fatalf("labels = %v, %v", lr, err)
	}
	list, err := c.Workspace.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{LabelSelector: map[string]string{"new": "1"}}))
	if err != nil || len(list.Msg.GetWorkspaces()) != 1 {
		t.Fatalf("list by label = %v, %v", list, err)
	}

	// Delete waits and leaves a DELETED workspace, omitted from lists by default.
	del, err := c.Workspace.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("life-delete"), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1}))
	if err != nil || del.Msg.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED || del.Msg.GetWorkspace().GetDeletedAt() == nil {
		t.Fatalf("delete = %v, %v", del, err)
	}
	if s := rt.Status(w.GetWorkspaceId()); s.Running || s.LayerExists {
		t.Fatalf("runtime still holds the workspace: %+v", s)
	}
	list, _ = c.Workspace.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
	if len(list.Msg.GetWorkspaces()) != 0 {
		t.Fatalf("deleted workspace listed by default")
	}
	list, _ = c.Workspace.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{IncludeDeleted: true}))
	if len(list.Msg.GetWorkspaces()) != 1 {
		t.Fatalf("include_deleted lists %d", len(list.Msg.GetWorkspaces()))
	}
	_, err = c.Workspace.UpdateWorkspaceLabels(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceLabelsRequest{Metadata: md("life-labels-2"), WorkspaceId: w.GetWorkspaceId(), ExpectedRevision: 2}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
	_, err = c.Workspace.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("life-delete-2"), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
}

func TestWritebackFailureAndForce(t *testing.T) {
	t.Parallel()
	_, c, rt := wsEnv(t, ctrltest.Options{})
	ctx := t.Context()
	w, _ := createWS(t, c, "wb-create")
	waitCommand(t, c, "wb-create")
	rt.FailWriteback[w.GetWorkspaceId()] = true

	_, err := stopWS(c, t, "wb-stop", w, false)
	d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_GUEST_WRITEBACK_FAILED, true)
	if d.GetStage() != "stop" {
		t.Fatalf("stage = %q", d.GetStage())
	}
	got := getWS(t, c, w.GetWorkspaceId())
	if got.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED || !got.GetHoldsExecution() || got.GetFailure().GetReason() != ctrlv1.FailureReason_FAILURE_REASON_GUEST_WRITEBACK_FAILED {
		t.Fatalf("after failed writeback: %v", got)
	}
	if !rt.Running(w.GetWorkspaceId()) {
		t.Fatal("the execution must still be held")
	}
	// A FAILED workspace holding its execution refuses start and a normal stop...
	_, err = c.Workspace.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("wb-start"), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
	_, err = stopWS(c, t, "wb-stop-2", w, false)
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
	// ...and FORCE releases it, keeping the layer.
	res, err := stopWS(c, t, "wb-force", w, true)
	if err != nil || res.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || res.GetWorkspace().GetHoldsExecution() {
		t.Fatalf("force = %v, %v", res, err)
	}
	if s := rt.Status(w.GetWorkspaceId()); s.Running || !s.LayerExists {
		t.Fatalf("after force: %+v", s)
	}
	// A STOPPED workspace refuses FORCE too.
	_, err = stopWS(c, t, "wb-force-2", w, true)
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
}

func TestStartFailureThenStart(t *testing.T) {
	t.Parallel()
	_, c, rt := wsEnv(t, ctrltest.Options{})
	ctx := t.Context()
	// Fail the very first start: the workspace ID is not known before
	// creation, so fail every start until the flag is cleared.
	rt.Gate = make(chan struct{})
	w, _ := createWS(t, c, "sf-create")
	rt.FailStart[w.GetWorkspaceId()] = true
	close(rt.Gate)
	cmd := waitCommand(t, c, "sf-create")
	if cmd.GetError().GetDetail().GetReason() != ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED || !cmd.GetError().GetDetail().GetCommandSettled() {
		t.Fatalf("failed create command = %v", cmd)
	}
	got := getWS(t, c, w.GetWorkspaceId())
	if got.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED || got.GetHoldsExecution() {
		t.Fatalf("after failed start: %v", got)
	}
	// FAILED without an execution refuses FORCE and accepts start.
	_, err := stopWS(c, t, "sf-force", w, true)
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
	delete(rt.FailStart, w.GetWorkspaceId())
	if _, err := c.Workspace.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("sf-start"), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1})); err != nil {
		t.Fatal(err)
	}
	if c := waitCommand(t, c, "sf-start"); c.GetError() != nil {
		t.Fatalf("start: %v", c.GetError())
	}
	waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
}

func TestGuestShutdownIsRecorded(t *testing.T) {
	t.Parallel()
	_, c, rt := wsEnv(t, ctrltest.Options{})
	w, _ := createWS(t, c, "gs-create")
	waitCommand(t, c, "gs-create")
	rt.GuestExits(w.GetWorkspaceId())
	got := waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if got.GetHoldsExecution() {
		t.Fatalf("stopped workspace holds its execution")
	}
	cmd := waitCommand(t, c, fmt.Sprintf("guest-shutdown/%s/1", w.GetWorkspaceId()))
	if cmd.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_GUEST_SHUTDOWN || cmd.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP || cmd.GetError() != nil {
		t.Fatalf("guest-shutdown command = %v", cmd)
	}
}

func TestExpirationRevisionChecked(t *testing.T) {
	t.Parallel()
	_, c, _ := wsEnv(t, ctrltest.Options{})
	ctx := t.Context()
	w, _ := createWS(t, c, "er-create")
	waitCommand(t, c, "er-create")
	_, err := c.Workspace.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Metadata: md("er-stop"), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 9}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH, true)
	_, err = c.Workspace.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("er-del"), WorkspaceId: w.GetWorkspaceId()}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH, true)
	// A stop that carries an expiration commits it in its admission (the
	// rules are tested in internal/workspace): the revision moves.
	deadline := time.Now().Add(time.Hour)
	r, err := c.Workspace.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Metadata: md("er-stop-exp"), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1,
		Expiration: &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, Deadline: timestamppbNew(deadline)}}))
	if err != nil || r.Msg.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || r.Msg.GetWorkspace().GetExpiration().GetRevision() != 2 {
		t.Fatalf("stop = %v, %v", r, err)
	}
	_, err = c.Workspace.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("er-start"), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH, true)
}

func TestCreateWorkspaceBadInput(t *testing.T) {
	t.Parallel()
	_, c, _ := wsEnv(t, ctrltest.Options{NodeMemoryMiB: 1024, NodeCPUMillis: 2000})
	ctx := t.Context()
	waitNode(t, c)
	tests := []struct {
		name  string
		req   *ctrlv1.CreateWorkspaceRequest
		code  connect.Code
		field string
	}{
		{"no resources", &ctrlv1.CreateWorkspaceRequest{}, connect.CodeInvalidArgument, "resources"},
		{"zero memory", &ctrlv1.CreateWorkspaceRequest{Resources: &ctrlv1.Resources{CpuMillis: 1}}, connect.CodeInvalidArgument, "resources.memory_mib"},
		{"zero cpu", &ctrlv1.CreateWorkspaceRequest{Resources: &ctrlv1.Resources{MemoryMib: 64}}, connect.CodeInvalidArgument, "resources.cpu_millis"},
		{"not whole MiB", &ctrlv1.CreateWorkspaceRequest{Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}, WritableLayerCapacityBytes: 64<<20 + 1}, connect.CodeInvalidArgument, "writable_layer_capacity_bytes"},
		{"unknown template", &ctrlv1.CreateWorkspaceRequest{Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}, TemplateId: "nope"}, connect.CodeInvalidArgument, "template_id"},
		{"memory above capacity", &ctrlv1.CreateWorkspaceRequest{Resources: &ctrlv1.Resources{MemoryMib: 4096, CpuMillis: 100}}, connect.CodeResourceExhausted, "resources"},
		{"cpu above capacity", &ctrlv1.CreateWorkspaceRequest{Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 3000}}, connect.CodeResourceExhausted, "resources"},
		{"past deadline", &ctrlv1.CreateWorkspaceRequest{Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100},
			Expiration: &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP, Deadline: timestamppbNew(time.Now().Add(-time.Minute))}}, connect.CodeInvalidArgument, "expiration.deadline"},
	}
	for i, tt := range tests {
		tt.req.Metadata = md(fmt.Sprintf("bad-ws-%d", i))
		_, err := c.Workspace.CreateWorkspace(ctx, connect.NewRequest(tt.req))
		if connect.CodeOf(err) != tt.code {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.code)
			continue
		}
		if d := wantDetail(t, err); d.GetField() != tt.field {
			t.Errorf("%s: field = %q, want %q", tt.name, d.GetField(), tt.field)
		}
	}
	list, _ := c.Workspace.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{IncludeDeleted: true}))
	if n := len(list.Msg.GetWorkspaces()); n != 1 { // the probe of waitNode
		t.Fatalf("%d workspaces besides the probe: refused requests half-created some", n-1)
	}
	for name, req := range map[string]*ctrlv1.ListWorkspacesRequest{
		"unspecified state":  {States: []ctrlv1.WorkspaceState{0}},
		"unknown state":      {States: []ctrlv1.WorkspaceState{42}},
		"repeated state":     {States: []ctrlv1.WorkspaceState{3, 3}},
		"states and deleted": {States: []ctrlv1.WorkspaceState{3}, IncludeDeleted: true},
		"unknown condition":  {GuestCondition: 42},
	} {
		_, err := c.Workspace.ListWorkspaces(ctx, connect.NewRequest(req))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("ListWorkspaces(%s) = %v, want invalid_argument", name, err)
		}
	}
}

// waitNode waits until the node agent is connected (its capacity is known).
func waitNode(t *testing.T, c ctrltest.Clients) {
	t.Helper()
	w, _ := createWS(t, c, "probe-node")
	waitCommand(t, c, "probe-node")
	if _, err := c.Workspace.DeleteWorkspace(t.Context(), connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("probe-node-del"), WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1})); err != nil {
		t.Fatal(err)
	}
}

func TestNodeSilenceTurnsUnknown(t *testing.T) {
	t.Parallel()
	rt := agenttest.New()
	e := ctrltest.New(t, ctrltest.Options{NodeGrace: 500 * time.Millisecond, WaitBound: 700 * time.Millisecond})
	c := e.Clients(e.HTTP)
	o := ctrltest.Options{Runtime: rt}
	stop := e.StartNode(t, "node-1", o)
	w, _ := createWS(t, c, "silent-create")
	waitCommand(t, c, "silent-create")
	stop()
	waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN)
	// A stop while the node is away times out retryably and goes on.
	_, err := stopWS(c, t, "silent-stop", w, false)
	d := wantErr(t, err, connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT, false)
	if !d.GetRetryable() {
		t.Fatal("TIMED_OUT must be retryable")
	}
	_ = d
	e.StartNode(t, "node-1", o)
	if cmd := waitCommand(t, c, "silent-stop"); cmd.GetError() != nil {
		t.Fatalf("stop after the node came back: %v", cmd.GetError())
	}
	waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	// The resend with the same ID now returns the completed stop.
	res, err := stopWS(c, t, "silent-stop", w, false)
	if err != nil || res.GetWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Fatalf("resent stop = %v, %v", res, err)
	}
}

func timestamppbNew(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

func wantDetail(t *testing.T, err error) *ctrlv1.ErrorDetail {
	t.Helper()
	ce, ok := err.(*connect.Error)
	if !ok {
		t.Fatalf("%v is not a Connect error", err)
	}
	d, ok := kibotos.Detail(ce)
	if !ok {
		t.Fatalf("%v has no ErrorDetail", err)
	}
	return d
}

// TestRefusalsCarryObservedWorkspace: a refusal by state or by revision
// carries the Workspace as it was (ErrorDetail.observed_workspace), so a
// caller tells a revision conflict from a state that forbids the change
// (seed 003), and the replay of the recorded refusal carries it too.
func TestRefusalsCarryObservedWorkspace(t *testing.T) {
	t.Parallel()
	_, c, _ := wsEnv(t, ctrltest.Options{})
	ctx := t.Context()
	w, _ := createWS(t, c, "obs-create")
	waitCommand(t, c, "obs-create")
	if _, err := stopWS(c, t, "obs-stop", w, false); err != nil {
		t.Fatal(err)
	}
	id := w.GetWorkspaceId()
	for _, tc := range []struct {
		name   string
		call   func(cid string) error
		code   connect.Code
		reason ctrlv1.FailureReason
	}{
		{"stop a STOPPED workspace", func(cid string) error {
			_, err := c.Workspace.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Metadata: md(cid), WorkspaceId: id, ExpectedExpirationRevision: 1}))
			return err
		}, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT},
		{"start with a stale expiration revision", func(cid string) error {
			_, err := c.Workspace.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md(cid), WorkspaceId: id, ExpectedExpirationRevision: 7}))
			return err
		}, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH},
		{"labels with a stale revision", func(cid string) error {
			_, err := c.Workspace.UpdateWorkspaceLabels(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceLabelsRequest{Metadata: md(cid), WorkspaceId: id, ExpectedRevision: 5, Labels: map[string]string{"a": "b"}}))
			return err
		}, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cid := "obs-" + strings.ReplaceAll(tc.name, " ", "-")
			for _, attempt := range []string{"first", "replay"} {
				d := wantErr(t, tc.call(cid), tc.code, tc.reason, true)
				ow := d.GetObservedWorkspace()
				if ow.GetWorkspaceId() != id || ow.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED ||
					ow.GetExpiration().GetRevision() != 1 || ow.GetLabelsRevision() != 1 {
					t.Fatalf("%s: observed_workspace = %v, want %s STOPPED at expiration revision 1, labels revision 1", attempt, ow, id)
				}
			}
		})
	}
}
