package api_test

import (
	"fmt"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// configEnv is a server with a node (8192 MiB, 4000 millicores, 100 GiB of
// storage) running the fake runtime, on SQLite or PostgreSQL.
func configEnv(t *testing.T, pg bool) (ctrltest.Clients, *agenttest.Runtime) {
	rt := agenttest.New()
	e := ctrltest.New(t, ctrltest.Options{Postgres: pg, Runtime: rt})
	c := e.Clients(e.HTTP)
	waitNode(t, c)
	return c, rt
}

func forDialects(t *testing.T, f func(t *testing.T, pg bool)) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			t.Parallel()
			f(t, pg)
		})
	}
}

// availableWS creates a Workspace and waits until it runs.
func availableWS(t *testing.T, c ctrltest.Clients, id string) *ctrlv1.Workspace {
	t.Helper()
	w, _ := createWS(t, c, id)
	if cmd := waitCommand(t, c, id); cmd.GetError() != nil {
		t.Fatalf("create %s: %v", id, cmd.GetError())
	}
	return waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
}

func setMemory(t *testing.T, c ctrltest.Clients, cid, ws string, rev uint64, mib uint32) (*ctrlv1.Workspace, error) {
	r, err := c.Workspace.UpdateWorkspaceMemory(t.Context(), connect.NewRequest(&ctrlv1.UpdateWorkspaceMemoryRequest{
		Metadata: md(cid), WorkspaceId: ws, ExpectedRevision: rev, MemoryMib: mib}))
	if err != nil {
		return nil, err
	}
	return r.Msg.GetWorkspace(), nil
}

func setCPU(t *testing.T, c ctrltest.Clients, cid, ws string, rev uint64, millis uint32) (*ctrlv1.Workspace, error) {
	r, err := c.Workspace.UpdateWorkspaceCpu(t.Context(), connect.NewRequest(&ctrlv1.UpdateWorkspaceCpuRequest{
		Metadata: md(cid), WorkspaceId: ws, ExpectedRevision: rev, CpuMillis: millis}))
	if err != nil {
		return nil, err
	}
	return r.Msg.GetWorkspace(), nil
}

func resize(t *testing.T, c ctrltest.Clients, cid, ws string, capacity uint64) (*ctrlv1.ResizeWorkspaceWritableLayerResponse, error) {
	r, err := c.Workspace.ResizeWorkspaceWritableLayer(t.Context(), connect.NewRequest(&ctrlv1.ResizeWorkspaceWritableLayerRequest{
		Metadata: md(cid), WorkspaceId: ws, CapacityBytes: capacity}))
	if err != nil {
		return nil, err
	}
	return r.Msg, nil
}

func startWS(t *testing.T, c ctrltest.Clients, cid string, w *ctrlv1.Workspace) *ctrlv1.StartWorkspaceResponse {
	t.Helper()
	r, err := c.Workspace.StartWorkspace(t.Context(), connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md(cid),
		WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: w.GetExpiration().GetRevision()}))
	if err != nil {
		t.Fatalf("StartWorkspace(%s) = %v", cid, err)
	}
	return r.Msg
}

// TestWorkspaceResourcesWire: UpdateWorkspaceMemory and UpdateWorkspaceCpu
// over the wire: refused on a running Workspace (STATE_CONFLICT with
// observed_workspace), recorded on a stopped one with the shared revision,
// aborted on a stale revision, invalid_argument naming the field; the next
// start runs with the new values.
func TestWorkspaceResourcesWire(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		c, rt := configEnv(t, pg)
		w := availableWS(t, c, "res-create")
		id := w.GetWorkspaceId()
		_, err := setMemory(t, c, "res-running", id, 1, 512)
		d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
		if d.GetObservedWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			t.Fatalf("observed_workspace = %v", d.GetObservedWorkspace())
		}
		if _, err := stopWS(c, t, "res-stop", w, false); err != nil {
			t.Fatal(err)
		}
		got, err := setMemory(t, c, "res-mem", id, 1, 512)
		if err != nil || got.GetResources().GetMemoryMib() != 512 || got.GetResourcesRevision() != 2 {
			t.Fatalf("UpdateWorkspaceMemory = %v, %v", got, err)
		}
		_, err = setCPU(t, c, "res-cpu-stale", id, 1, 2000)
		d = wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
		if d.GetObservedWorkspace().GetResourcesRevision() != 2 || d.GetField() != "expected_revision" {
			t.Fatalf("aborted detail = %v", d)
		}
		for _, tc := range []struct {
			err   error
			field string
		}{
			{func() error { _, err := setMemory(t, c, "res-bad", id, 2, 0); return err }(), "memory_mib"},
			{func() error { _, err := setMemory(t, c, "res-bad", id, 2, 1<<21); return err }(), "memory_mib"},
			{func() error { _, err := setCPU(t, c, "res-bad", id, 2, 0); return err }(), "cpu_millis"},
		} {
			if d := wantErr(t, tc.err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false); d.GetField() != tc.field {
				t.Fatalf("field = %q, want %q", d.GetField(), tc.field)
			}
		}
		got, err = setCPU(t, c, "res-cpu", id, 2, 2000)
		if err != nil || got.GetResources().GetCpuMillis() != 2000 || got.GetResourcesRevision() != 3 {
			t.Fatalf("UpdateWorkspaceCpu = %v, %v", got, err)
		}
		cmd, err := c.Workspace.GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: "res-cpu"}))
		if err != nil || cmd.Msg.GetCommand().GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_CPU ||
			cmd.Msg.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
			t.Fatalf("GetWorkspaceCommand(res-cpu) = %v, %v", cmd, err)
		}
		startWS(t, c, "res-start", got)
		if cmd := waitCommand(t, c, "res-start"); cmd.GetError() != nil {
			t.Fatalf("start: %v", cmd.GetError())
		}
		got = waitState(t, c, id, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
		if got.GetResources().GetMemoryMib() != 512 || got.GetResources().GetCpuMillis() != 2000 || rt.Starts[id] != 2 {
			t.Fatalf("after the start: %v, %d starts", got.GetResources(), rt.Starts[id])
		}
	})
}

// TestStartBeyondNodeCapacity: capacity is judged by the start, not by
// the update: memory (or CPU) beyond everything the Workspace's node offers
// is recorded, the start is accepted and then fails (resource_exhausted,
// CAPACITY_EXHAUSTED, stage placement) without reaching the node; the
// FAILED Workspace holds no execution, so a lower value is accepted and the
// next start runs.
func TestStartBeyondNodeCapacity(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		c, rt := configEnv(t, pg)
		w := availableWS(t, c, "cap-create")
		id := w.GetWorkspaceId()
		if _, err := stopWS(c, t, "cap-stop", w, false); err != nil {
			t.Fatal(err)
		}
		rev := uint64(1)
		for i, step := range []struct {
			mem, cpu uint32 // 0: unchanged
			ok       bool
		}{
			{mem: 16384, ok: false}, // the node offers 8192 MiB
			{mem: 8192, ok: true},
			{cpu: 4001, ok: false}, // and 4000 millicores
			{cpu: 4000, ok: true},
		} {
			var err error
			if step.mem != 0 {
				w, err = setMemory(t, c, fmt.Sprintf("cap-mem-%d", i), id, rev, step.mem)
			} else {
				w, err = setCPU(t, c, fmt.Sprintf("cap-cpu-%d", i), id, rev, step.cpu)
			}
			if err != nil {
				t.Fatalf("step %d: update = %v (capacity is not judged here)", i, err)
			}
			rev = w.GetResourcesRevision()
			starts := rt.Starts[id]
			cid := fmt.Sprintf("cap-start-%d", i)
			if st := startWS(t, c, cid, w); st.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING {
				t.Fatalf("step %d: start = %v, want accepted", i, st)
			}
			cmd := waitCommand(t, c, cid)
			if step.ok {
				if cmd.GetError() != nil {
					t.Fatalf("step %d: start failed: %v", i, cmd.GetError())
				}
				w = waitState(t, c, id, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
				if rt.Starts[id] != starts+1 {
					t.Fatalf("step %d: %d starts, want %d", i, rt.Starts[id], starts+1)
				}
				if _, err := stopWS(c, t, fmt.Sprintf("cap-stop-%d", i), w, false); err != nil {
					t.Fatal(err)
				}
				continue
			}
			d := cmd.GetError().GetDetail()
			if cmd.GetError().GetCode() != "resource_exhausted" || d.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED || d.GetStage() != "placement" {
				t.Fatalf("step %d: start command %v; want resource_exhausted CAPACITY_EXHAUSTED at placement", i, cmd)
			}
			w = getWS(t, c, id)
			if w.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED || w.GetHoldsExecution() ||
				w.GetFailure().GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED || rt.Starts[id] != starts {
				t.Fatalf("step %d: after the refused start: %v (%d starts, %d before)", i, w, rt.Starts[id], starts)
			}
		}
	})
}

// TestResizeWire: ResizeWorkspaceWritableLayer's refusals over the wire,
// each with its ErrorDetail: bad capacities (invalid_argument naming
// capacity_bytes, nothing recorded), smaller (invalid_argument, settled),
// beyond the node's storage (resource_exhausted, CAPACITY_EXHAUSTED), a
// running Workspace (failed_precondition with observed_workspace); equal is
// a plain success without a command.
func TestResizeWire(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		c, _ := configEnv(t, pg)
		w := availableWS(t, c, "rw-create")
		id := w.GetWorkspaceId()
		capacity := w.GetWritableLayer().GetCapacityBytes()
		_, err := resize(t, c, "rw-running", id, capacity*2)
		if d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true); d.GetObservedWorkspace().GetWorkspaceId() != id {
			t.Fatalf("observed_workspace = %v", d.GetObservedWorkspace())
		}
		if _, err := stopWS(c, t, "rw-stop", w, false); err != nil {
			t.Fatal(err)
		}
		for _, bad := range []uint64{0, capacity + 1, 1 << 19} {
			_, err := resize(t, c, "rw-bad", id, bad)
			if d := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false); d.GetField() != "capacity_bytes" {
				t.Fatalf("resize(%d): field %q", bad, d.GetField())
			}
		}
		_, err = resize(t, c, "rw-smaller", id, capacity-1<<20)
		if d := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, true); d.GetField() != "capacity_bytes" {
			t.Fatalf("smaller: field %q", d.GetField())
		}
		_, err = resize(t, c, "rw-huge", id, 200<<30) // the node has 100 GiB
		if d := wantErr(t, err, connect.CodeResourceExhausted, ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, true); d.GetField() != "capacity_bytes" {
			t.Fatalf("beyond: field %q", d.GetField())
		}
		res, err := resize(t, c, "rw-equal", id, capacity)
		if err != nil || res.GetCommand() != nil || res.GetWorkspace().GetWritableLayer().GetCapacityBytes() != capacity {
			t.Fatalf("equal = %v, %v; want the workspace without a command", res, err)
		}
		_, err = c.Workspace.GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: "rw-equal"}))
		wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
	})
}
