package workspace_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/workspace"
	"github.com/kibotos/kibotos/internal/workspace/limits"
)

const (
	gib            = uint64(1 << 30)
	nodeStorage    = 10 * gib // the largest node's StorageBytes in these tests
	postgresURLEnv = "KIBOTOS_TEST_POSTGRES_URL"
)

// openStore opens a fresh SQLite or PostgreSQL store (the PostgreSQL one is
// skipped without KIBOTOS_TEST_POSTGRES_URL, and fails in CI).
func openStore(t *testing.T, pg bool) store.Store {
	t.Helper()
	if !pg {
		st, err := sqlite.Open(context.Background(), t.TempDir()+"/ctrl.db")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	url := os.Getenv(postgresURLEnv)
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set; CI must run the PostgreSQL tests", postgresURLEnv)
		}
		t.Skipf("%s is not set: skipping PostgreSQL test", postgresURLEnv)
	}
	st, cleanup, err := pgtest.Open(context.Background(), url, postgres.Open)
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	t.Cleanup(func() {
		if err := cleanup(); err != nil {
			t.Errorf("drop test schema: %v", err)
		}
	})
	return st
}

// configService returns a Service on a fresh store of either dialect,
// without a reconciler (tests play the node by writing the store). The
// largest node offers 4096 MiB, 4000 millicores and nodeStorage bytes.
func configService(t *testing.T, pg bool) (*workspace.Service, store.Store) {
	t.Helper()
	st := openStore(t, pg)
	return &workspace.Service{
		Engine: &command.Engine{Store: st}, Store: st, Pages: paging.NewCodec([]byte("0123456789abcdef0123456789abcdef")),
		Templates: func(id string) (string, bool) { return "v1", id == workspace.DefaultTemplate },
		MaxCapacity: func() workspace.Capacity {
			return workspace.Capacity{MemoryMiB: 4096, CPUMillis: 4000, StorageBytes: nodeStorage}
		},
		WaitBound: 50 * time.Millisecond,
	}, st
}

// dialects runs f on SQLite and on PostgreSQL, each with its own Service.
func dialects(t *testing.T, f func(t *testing.T, s *workspace.Service, st store.Store)) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			t.Parallel()
			s, st := configService(t, pg)
			f(t, s, st)
		})
	}
}

func memReq(cid, ws string, expected uint64, mib uint32) *ctrlv1.UpdateWorkspaceMemoryRequest {
	return &ctrlv1.UpdateWorkspaceMemoryRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid}, WorkspaceId: ws,
		ExpectedRevision: expected, MemoryMib: mib}
}

func cpuReq(cid, ws string, expected uint64, millis uint32) *ctrlv1.UpdateWorkspaceCpuRequest {
	return &ctrlv1.UpdateWorkspaceCpuRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid}, WorkspaceId: ws,
		ExpectedRevision: expected, CpuMillis: millis}
}

func resizeReq(cid, ws string, c uint64) *ctrlv1.ResizeWorkspaceWritableLayerRequest {
	return &ctrlv1.ResizeWorkspaceWritableLayerRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid}, WorkspaceId: ws, CapacityBytes: c}
}

// stoppedWS creates a Workspace and plays a node that stopped it on
// node-1; layer says whether its writable layer exists.
func stoppedWS(t *testing.T, s *workspace.Service, st store.Store, cid string, layer bool) string {
	t.Helper()
	ws := create(t, s, cid).GetWorkspaceId()
	stopped(t, st, ws)
	edit(t, st, ws, func(_ *store.Workspace, pub *ctrlv1.Workspace) { pub.WritableLayer.Exists = layer })
	return ws
}

func commandRecord(t *testing.T, st store.Store, id string) *store.Command {
	t.Helper()
	var rec *store.Command
	if err := st.View(t.Context(), func(tx store.Tx) error {
		var err error
		rec, err = tx.GetCommand(t.Context(), id)
		return err
	}); err != nil {
		t.Fatalf("GetCommand(%s) = %v", id, err)
	}
	return rec
}

// wantRefusal checks a settled refusal of kind and reason, with the
// Workspace observed when the kind calls for it.
func wantRefusal(t *testing.T, what string, err error, kind fault.Kind, reason fault.Reason, field string) {
	t.Helper()
	fe, ok := fault.As(err)
	if !ok || fe.Kind != kind || fe.Reason != reason || fe.Field != field {
		t.Fatalf("%s = %v, want %v (%s) on %q", what, err, kind, reason, field)
	}
	if !fe.Settled {
		t.Errorf("%s: the refusal is not settled (recorded with the command ID)", what)
	}
	if obs := kind == fault.KindFailedPrecondition || kind == fault.KindAborted; obs != (fe.ObservedWorkspace != nil) {
		t.Errorf("%s: observed_workspace %v, want it set: %v", what, fe.ObservedWorkspace, obs)
	}
}

// The states a configuration update refuses, and those it admits, as the
// reconciler leaves them.
var (
	configRefused = []struct {
		name string
		set  func(w *store.Workspace, pub *ctrlv1.Workspace)
	}{
		{"CREATING", func(*store.Workspace, *ctrlv1.Workspace) {}},
		{"STARTING", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, w.Generation, w.ObservedGeneration, w.ObservedState = ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING, 3, 2, store.ExecStopped
		}},
		{"AVAILABLE", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, pub.HoldsExecution, w.ObservedGeneration, w.ObservedState, w.CommandID = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, true, w.Generation, store.ExecRunning, ""
		}},
		{"STOPPING", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, pub.HoldsExecution, w.Power = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING, true, store.PowerStopped
		}},
		{"FAILED holding its execution", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, pub.HoldsExecution, w.ObservedState, w.ObservedGeneration, w.CommandID = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, true, store.ExecFailed, w.Generation, ""
		}},
		{"FAILED whose deletion began", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, w.Power, w.ObservedState, w.ObservedGeneration, w.CommandID = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, store.PowerDeleted, store.ExecFailed, w.Generation, ""
		}},
		{"DELETING", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, w.Power = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING, store.PowerDeleted
		}},
		{"DELETED", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, w.Power, w.ObservedState, w.ObservedGeneration = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, store.PowerDeleted, store.ExecDeleted, w.Generation
		}},
		{"UNKNOWN, running underneath", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, pub.HoldsExecution, w.ObservedGeneration, w.ObservedState, w.CommandID = ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN, true, w.Generation, store.ExecRunning, ""
		}},
	}
	configAdmitted = []struct {
		name string
		set  func(w *store.Workspace, pub *ctrlv1.Workspace)
	}{
		{"STOPPED", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, false
			w.Power, w.ObservedGeneration, w.ObservedState, w.CommandID = store.PowerStopped, w.Generation, store.ExecStopped, ""
		}},
		// The FAILED a start may resume from: its start failed (placement
		// or node), and it holds no execution.
		{"FAILED without an execution", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, pub.HoldsExecution, w.ObservedState, w.ObservedGeneration, w.CommandID = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, false, store.ExecFailed, w.Generation, ""
		}},
		{"UNKNOWN, stopped underneath", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN, false
			w.Power, w.ObservedGeneration, w.ObservedState, w.CommandID = store.PowerStopped, w.Generation, store.ExecStopped, ""
		}},
	}
)

// TestUpdateResourcesStates: memory and CPU are accepted only by a
// Workspace that holds no execution (STOPPED, the FAILED a start may resume
// from, and an UNKNOWN one whose node last reported it so); every other
// state is failed_precondition (STATE_CONFLICT) with observed_workspace,
// and nothing changes.
func TestUpdateResourcesStates(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		for i, tc := range configRefused {
			ws := create(t, s, fmt.Sprintf("refused-%d", i)).GetWorkspaceId()
			edit(t, st, ws, tc.set)
			w0, _ := row(t, st, ws)
			_, err := s.UpdateMemory(t.Context(), memReq(fmt.Sprintf("refused-mem-%d", i), ws, 1, 128))
			wantRefusal(t, "UpdateMemory("+tc.name+")", err, fault.KindFailedPrecondition, fault.ReasonStateConflict, "")
			_, err = s.UpdateCPU(t.Context(), cpuReq(fmt.Sprintf("refused-cpu-%d", i), ws, 1, 2000))
			wantRefusal(t, "UpdateCPU("+tc.name+")", err, fault.KindFailedPrecondition, fault.ReasonStateConflict, "")
			unchanged(t, st, ws, w0)
		}
		for i, tc := range configAdmitted {
			ws := create(t, s, fmt.Sprintf("admitted-%d", i)).GetWorkspaceId()
			edit(t, st, ws, tc.set)
			res, err := s.UpdateMemory(t.Context(), memReq(fmt.Sprintf("admitted-mem-%d", i), ws, 1, 128))
			if err != nil || res.GetWorkspace().GetResources().GetMemoryMib() != 128 || res.GetWorkspace().GetResourcesRevision() != 2 {
				t.Fatalf("UpdateMemory(%s) = %v, %v; want 128 MiB at revision 2", tc.name, res, err)
			}
			res2, err := s.UpdateCPU(t.Context(), cpuReq(fmt.Sprintf("admitted-cpu-%d", i), ws, 2, 2000))
			if err != nil || res2.GetWorkspace().GetResources().GetCpuMillis() != 2000 || res2.GetWorkspace().GetResourcesRevision() != 3 {
				t.Fatalf("UpdateCPU(%s) = %v, %v; want 2000 millicores at revision 3", tc.name, res2, err)
			}
		}
	})
}

// TestUpdateResourcesRevision: the same value keeps resources_revision, a
// different one increments it by one; it is configuration for the next
// execution only (no generation, no command left for the node); the
// command is recorded COMPLETED by the caller with its kind; a replay
// answers the first result.
func TestUpdateResourcesRevision(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		ws := stoppedWS(t, s, st, "rev-create", true)
		w0, _ := row(t, st, ws)
		for _, step := range []struct {
			cid     string
			mem     uint32 // 0: a CPU update
			cpu     uint32
			rev     uint64 // expected_revision sent
			wantRev uint64
		}{
			{"rev-mem-same", 64, 0, 1, 1}, // created with 64 MiB: equal
			{"rev-cpu-same", 0, 100, 1, 1},
			{"rev-mem", 512, 0, 1, 2},
			{"rev-mem-again", 512, 0, 2, 2},
			{"rev-cpu", 0, 1500, 2, 3},
			{"rev-cpu-again", 0, 1500, 3, 3},
			{"rev-mem-back", 64, 0, 3, 4},
		} {
			var (
				pub *ctrlv1.Workspace
				err error
			)
			if step.mem != 0 {
				var res *ctrlv1.UpdateWorkspaceMemoryResponse
				res, err = s.UpdateMemory(t.Context(), memReq(step.cid, ws, step.rev, step.mem))
				pub = res.GetWorkspace()
			} else {
				var res *ctrlv1.UpdateWorkspaceCpuResponse
				res, err = s.UpdateCPU(t.Context(), cpuReq(step.cid, ws, step.rev, step.cpu))
				pub = res.GetWorkspace()
			}
			if err != nil || pub.GetResourcesRevision() != step.wantRev {
				t.Fatalf("%s = revision %d, %v; want revision %d", step.cid, pub.GetResourcesRevision(), err, step.wantRev)
			}
			_, stored := row(t, st, ws)
			if stored.GetResourcesRevision() != step.wantRev || !proto.Equal(stored.GetResources(), pub.GetResources()) {
				t.Fatalf("%s: stored %v at revision %d, answered %v", step.cid, stored.GetResources(), stored.GetResourcesRevision(), pub.GetResources())
			}
			rec := commandRecord(t, st, step.cid)
			kind, proc := ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_CPU, ctrlv1connect.WorkspaceServiceUpdateWorkspaceCpuProcedure
			if step.mem != 0 {
				kind, proc = ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_MEMORY, ctrlv1connect.WorkspaceServiceUpdateWorkspaceMemoryProcedure
			}
			c, err := s.GetCommand(t.Context(), &ctrlv1.GetWorkspaceCommandRequest{CommandId: step.cid})
			if err != nil || c.GetKind() != kind || c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED ||
				c.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_CALLER || c.GetError() != nil || c.GetWorkspaceId() != ws || rec.Method != proc {
				t.Fatalf("%s: command %v (method %q), %v; want %v COMPLETED by the caller through %s", step.cid, c, rec.Method, err, kind, proc)
			}
		}
		// Configuration only: nothing for a node to do.
		w, pub := row(t, st, ws)
		if w.Generation != w0.Generation || w.Power != w0.Power || w.CommandID != "" || w.ObservedGeneration != w0.ObservedGeneration ||
			pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
			t.Fatalf("after the updates: generation %d→%d, power %v→%v, command %q, state %v; want the node's work untouched",
				w0.Generation, w.Generation, w0.Power, w.Power, w.CommandID, pub.GetState())
		}
		// A replay answers the first result, though the revision moved on.
		res, err := s.UpdateMemory(t.Context(), memReq("rev-mem", ws, 1, 512))
		if err != nil || res.GetWorkspace().GetResourcesRevision() != 2 || res.GetWorkspace().GetResources().GetMemoryMib() != 512 {
			t.Fatalf("replay = %v, %v; want the first answer (512 MiB, revision 2)", res, err)
		}
		if _, pub := row(t, st, ws); pub.GetResourcesRevision() != 4 || pub.GetResources().GetMemoryMib() != 64 {
			t.Fatalf("the replay changed the workspace: %v revision %d", pub.GetResources(), pub.GetResourcesRevision())
		}
		// The same ID with other input is already_exists.
		_, err = s.UpdateMemory(t.Context(), memReq("rev-mem", ws, 4, 1024))
		wantFault(t, "UpdateMemory(reused ID)", err, fault.KindAlreadyExists, command.IDField)
		_, err = s.UpdateCPU(t.Context(), cpuReq("rev-mem", ws, 1, 512))
		wantFault(t, "UpdateCPU(ID of a memory update)", err, fault.KindAlreadyExists, command.IDField)
		// Capacity is judged by the later start: more than any node offers
		// (4096 MiB, 4000 millicores) is recorded.
		if res, err := s.UpdateMemory(t.Context(), memReq("rev-mem-huge", ws, 4, 65536)); err != nil || res.GetWorkspace().GetResources().GetMemoryMib() != 65536 {
			t.Fatalf("UpdateMemory(65536 MiB) = %v, %v; want it recorded", res, err)
		}
		if res, err := s.UpdateCPU(t.Context(), cpuReq("rev-cpu-huge", ws, 5, 64000)); err != nil || res.GetWorkspace().GetResources().GetCpuMillis() != 64000 {
			t.Fatalf("UpdateCPU(64000) = %v, %v; want it recorded", res, err)
		}
	})
}

// TestUpdateResourcesCAS: expected_revision must equal resources_revision
// (0 included): a mismatch is aborted (REVISION_MISMATCH) with
// observed_workspace and changes nothing, even for the value already
// stored. Memory and CPU share the revision: of a memory and a CPU change
// against the same revision, one lands and the other is aborted, also when
// they race.
func TestUpdateResourcesCAS(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		ws := stoppedWS(t, s, st, "cas-create", true)
		w0, _ := row(t, st, ws)
		for _, exp := range []uint64{0, 2, 99} {
			_, err := s.UpdateMemory(t.Context(), memReq(fmt.Sprintf("cas-mem-%d", exp), ws, exp, 128))
			wantRefusal(t, fmt.Sprintf("UpdateMemory(expected %d)", exp), err, fault.KindAborted, fault.ReasonRevisionMismatch, "expected_revision")
			if fe, _ := fault.As(err); fe.ObservedWorkspace.GetResourcesRevision() != 1 {
				t.Errorf("observed resources_revision %d, want 1", fe.ObservedWorkspace.GetResourcesRevision())
			}
			_, err = s.UpdateCPU(t.Context(), cpuReq(fmt.Sprintf("cas-cpu-%d", exp), ws, exp, 100)) // the stored value
			wantRefusal(t, fmt.Sprintf("UpdateCPU(expected %d)", exp), err, fault.KindAborted, fault.ReasonRevisionMismatch, "expected_revision")
			unchanged(t, st, ws, w0)
		}
		// The refusal is the recorded result of its ID.
		_, err := s.UpdateMemory(t.Context(), memReq("cas-mem-2", ws, 2, 128))
		wantRefusal(t, "replayed refusal", err, fault.KindAborted, fault.ReasonRevisionMismatch, "expected_revision")

		// Sequential: memory lands, CPU against the same revision does not.
		if _, err := s.UpdateMemory(t.Context(), memReq("cas-mem-lands", ws, 1, 256)); err != nil {
			t.Fatal(err)
		}
		_, err = s.UpdateCPU(t.Context(), cpuReq("cas-cpu-late", ws, 1, 2000))
		wantRefusal(t, "UpdateCPU after a memory change", err, fault.KindAborted, fault.ReasonRevisionMismatch, "expected_revision")
		if _, pub := row(t, st, ws); pub.GetResources().GetCpuMillis() != 100 || pub.GetResources().GetMemoryMib() != 256 || pub.GetResourcesRevision() != 2 {
			t.Fatalf("after the conflict: %v at revision %d; want 256 MiB, 100 millicores, revision 2", pub.GetResources(), pub.GetResourcesRevision())
		}

		// Racing: one of each against revision 2, many times over.
		for i := range 10 {
			_, pub := row(t, st, ws)
			rev := pub.GetResourcesRevision()
			var (
				wg           sync.WaitGroup
				memErr, cErr error
			)
			wg.Go(func() {
				_, memErr = s.UpdateMemory(t.Context(), memReq(fmt.Sprintf("race-mem-%d", i), ws, rev, uint32(300+i)))
			})
			wg.Go(func() {
				_, cErr = s.UpdateCPU(t.Context(), cpuReq(fmt.Sprintf("race-cpu-%d", i), ws, rev, uint32(3000+i)))
			})
			wg.Wait()
			if (memErr == nil) == (cErr == nil) {
				t.Fatalf("race %d: memory %v, CPU %v; want exactly one to land", i, memErr, cErr)
			}
			loser := memErr
			if loser == nil {
				loser = cErr
			}
			wantRefusal(t, fmt.Sprintf("race %d loser", i), loser, fault.KindAborted, fault.ReasonRevisionMismatch, "expected_revision")
			_, after := row(t, st, ws)
			if after.GetResourcesRevision() != rev+1 {
				t.Fatalf("race %d: revision %d, want %d", i, after.GetResourcesRevision(), rev+1)
			}
			if memErr == nil && after.GetResources().GetMemoryMib() != uint32(300+i) || cErr == nil && after.GetResources().GetCpuMillis() != uint32(3000+i) {
				t.Fatalf("race %d: stored %v, which is not the winner's", i, after.GetResources())
			}
			if memErr != nil && after.GetResources().GetMemoryMib() == uint32(300+i) || cErr != nil && after.GetResources().GetCpuMillis() == uint32(3000+i) {
				t.Fatalf("race %d: stored %v, which has the loser's value", i, after.GetResources())
			}
		}
	})
}

// TestUpdateResourcesInvalid: zero, below the sandbox's 16 MiB and beyond
// the documented bounds (1 TiB, 1024 vCPUs) are invalid_argument naming
// the field; nothing is recorded (the ID stays free) and nothing changes.
// The bounds themselves are accepted.
func TestUpdateResourcesInvalid(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		ws := stoppedWS(t, s, st, "inv-create", true)
		w0, _ := row(t, st, ws)
		for _, tc := range []struct {
			name  string
			call  func() error
			field string
		}{
			{"memory 0", func() error { _, err := s.UpdateMemory(t.Context(), memReq("inv", ws, 1, 0)); return err }, "memory_mib"},
			{"memory 15", func() error { _, err := s.UpdateMemory(t.Context(), memReq("inv", ws, 1, 15)); return err }, "memory_mib"},
			{"memory above 1 TiB", func() error {
				_, err := s.UpdateMemory(t.Context(), memReq("inv", ws, 1, workspace.MaxMemoryMiB+1))
				return err
			}, "memory_mib"},
			{"memory max uint32", func() error { _, err := s.UpdateMemory(t.Context(), memReq("inv", ws, 1, 1<<32-1)); return err }, "memory_mib"},
			{"cpu 0", func() error { _, err := s.UpdateCPU(t.Context(), cpuReq("inv", ws, 1, 0)); return err }, "cpu_millis"},
			{"cpu above 1024 vCPUs", func() error {
				_, err := s.UpdateCPU(t.Context(), cpuReq("inv", ws, 1, workspace.MaxCPUMillis+1))
				return err
			}, "cpu_millis"},
			{"memory without workspace", func() error { _, err := s.UpdateMemory(t.Context(), memReq("inv", "", 1, 64)); return err }, "workspace_id"},
			{"cpu without workspace", func() error { _, err := s.UpdateCPU(t.Context(), cpuReq("inv", "", 1, 64)); return err }, "workspace_id"},
			{"bad command ID", func() error { _, err := s.UpdateMemory(t.Context(), memReq("-bad", ws, 1, 64)); return err }, command.IDField},
			{"reserved command ID", func() error {
				_, err := s.UpdateCPU(t.Context(), cpuReq("expiration/x", ws, 1, 64))
				return err
			}, command.IDField},
		} {
			err := tc.call()
			wantFault(t, tc.name, err, fault.KindInvalidArgument, tc.field)
			if fe, ok := fault.As(err); ok && fe.Settled {
				t.Errorf("%s: the refusal is settled", tc.name)
			}
			unchanged(t, st, ws, w0)
		}
		if recorded(t, s, "inv") {
			t.Fatal("an invalid request recorded its command ID")
		}
		// Not found is decided: recorded.
		_, err := s.UpdateMemory(t.Context(), memReq("inv-missing", "ws-nosuchworkspace", 1, 64))
		wantRefusal(t, "UpdateMemory(unknown workspace)", err, fault.KindNotFound, fault.ReasonNotFound, "")
		// The bounds are accepted.
		for i, m := range []uint32{workspace.MinMemoryMiB, workspace.MaxMemoryMiB} {
			if _, err := s.UpdateMemory(t.Context(), memReq(fmt.Sprintf("bound-mem-%d", i), ws, uint64(1+i), m)); err != nil {
				t.Fatalf("UpdateMemory(%d MiB) = %v", m, err)
			}
		}
		for i, c := range []uint32{1, workspace.MaxCPUMillis} {
			if _, err := s.UpdateCPU(t.Context(), cpuReq(fmt.Sprintf("bound-cpu-%d", i), ws, uint64(3+i), c)); err != nil {
				t.Fatalf("UpdateCPU(%d) = %v", c, err)
			}
		}
	})
}

// TestResizeInvalid: capacity_bytes is required, a whole number of MiB, at
// least the smallest layer: otherwise invalid_argument, nothing recorded,
// nothing changed. Smaller than the current capacity is invalid_argument
// too (decided on the Workspace, so recorded).
func TestResizeInvalid(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		ws := stoppedWS(t, s, st, "rinv-create", true)
		w0, _ := row(t, st, ws)
		for _, tc := range []struct {
			name  string
			req   *ctrlv1.ResizeWorkspaceWritableLayerRequest
			field string
		}{
			{"absent", resizeReq("rinv", ws, 0), "capacity_bytes"},
			{"not whole MiB", resizeReq("rinv", ws, 2*gib+1), "capacity_bytes"},
			{"half a MiB", resizeReq("rinv", ws, limits.MiB/2), "capacity_bytes"},
			{"below the smallest layer", resizeReq("rinv", ws, limits.MinCapacityBytes-limits.MiB), "capacity_bytes"},
			{"no workspace", resizeReq("rinv", "", 2*gib), "workspace_id"},
			{"bad command ID", resizeReq("-rinv", ws, 2*gib), command.IDField},
		} {
			_, err := s.ResizeWritableLayer(t.Context(), tc.req)
			wantFault(t, tc.name, err, fault.KindInvalidArgument, tc.field)
			if fe, ok := fault.As(err); ok && fe.Settled {
				t.Errorf("%s: the refusal is settled", tc.name)
			}
			unchanged(t, st, ws, w0)
		}
		_, err := s.ResizeWritableLayer(t.Context(), resizeReq("host-memory/x", ws, 2*gib))
		wantFault(t, "reserved command ID", err, fault.KindInvalidArgument, command.IDField)
		if recorded(t, s, "rinv") {
			t.Fatal("an invalid request recorded its command ID")
		}
		for _, c := range []uint64{gib - limits.MiB, limits.MinCapacityBytes} {
			cid := fmt.Sprintf("rinv-smaller-%d", c)
			_, err := s.ResizeWritableLayer(t.Context(), resizeReq(cid, ws, c))
			wantRefusal(t, fmt.Sprintf("Resize(%d, smaller)", c), err, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "capacity_bytes")
			unchanged(t, st, ws, w0)
		}
	})
}

// TestResizeEqual: a target equal to the current capacity is a plain
// success that opens no command: the Workspace without a command, nothing
// changed, GetWorkspaceCommand does not know the ID; a resend replays the
// same answer and the ID cannot be reused for another request.
func TestResizeEqual(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		ws := stoppedWS(t, s, st, "eq-create", true)
		w0, _ := row(t, st, ws)
		res, err := s.ResizeWritableLayer(t.Context(), resizeReq("eq", ws, gib))
		if err != nil || res.GetCommand() != nil || res.GetWorkspace().GetWritableLayer().GetCapacityBytes() != gib {
			t.Fatalf("Resize(equal) = %v, %v; want the workspace and no command", res, err)
		}
		unchanged(t, st, ws, w0)
		_, err = s.GetCommand(t.Context(), &ctrlv1.GetWorkspaceCommandRequest{CommandId: "eq"})
		wantFault(t, "GetWorkspaceCommand(equal resize)", err, fault.KindNotFound, "")
		again, err := s.ResizeWritableLayer(t.Context(), resizeReq("eq", ws, gib))
		if err != nil || !proto.Equal(again, res) {
			t.Fatalf("replay = %v, %v; want %v", again, err, res)
		}
		_, err = s.ResizeWritableLayer(t.Context(), resizeReq("eq", ws, 2*gib))
		wantFault(t, "Resize(reused ID)", err, fault.KindAlreadyExists, command.IDField)
		unchanged(t, st, ws, w0)
	})
}

// TestResizeStates: the same state rule as UpdateWorkspaceMemory, equal
// capacity included; a resize still in flight on the Workspace refuses
// another (failed_precondition, CONFLICT).
func TestResizeStates(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		for i, tc := range configRefused {
			ws := create(t, s, fmt.Sprintf("rstate-%d", i)).GetWorkspaceId()
			edit(t, st, ws, tc.set)
			w0, _ := row(t, st, ws)
			for _, c := range []uint64{2 * gib, gib} {
				_, err := s.ResizeWritableLayer(t.Context(), resizeReq(fmt.Sprintf("rstate-%d-%d", i, c), ws, c))
				wantRefusal(t, fmt.Sprintf("Resize(%s, %d)", tc.name, c), err, fault.KindFailedPrecondition, fault.ReasonStateConflict, "")
			}
			unchanged(t, st, ws, w0)
		}
		for i, tc := range configAdmitted {
			ws := create(t, s, fmt.Sprintf("radm-create-%d", i)).GetWorkspaceId()
			edit(t, st, ws, tc.set) // no layer yet: the capacity is only recorded
			res, err := s.ResizeWritableLayer(t.Context(), resizeReq(fmt.Sprintf("radm-%d", i), ws, 2*gib))
			if err != nil || res.GetWorkspace().GetWritableLayer().GetCapacityBytes() != 2*gib {
				t.Fatalf("Resize(%s) = %v, %v", tc.name, res, err)
			}
		}
		// In flight.
		s.WaitBound = time.Millisecond
		ws := stoppedWS(t, s, st, "rflight-create", true)
		_, err := s.ResizeWritableLayer(t.Context(), resizeReq("rflight-1", ws, 2*gib))
		wantFault(t, "Resize(node silent)", err, fault.KindUnavailable, "")
		w0, _ := row(t, st, ws)
		for _, c := range []uint64{2 * gib, 3 * gib} {
			_, err = s.ResizeWritableLayer(t.Context(), resizeReq(fmt.Sprintf("rflight-2-%d", c), ws, c))
			wantRefusal(t, "Resize(another in flight)", err, fault.KindFailedPrecondition, fault.ReasonConflict, "workspace_id")
		}
		unchanged(t, st, ws, w0)
	})
}

// TestResizeRecordsOnly: a Workspace whose layer does not exist yet only
// records the capacity: the command completes at once (kind
// RESIZE_WRITABLE_LAYER, by the caller) and nothing goes to a node.
func TestResizeRecordsOnly(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		s.WaitBound = time.Hour // an answer that waited would fail the test by its timeout
		ws := stoppedWS(t, s, st, "ronly-create", false)
		w0, _ := row(t, st, ws)
		res, err := s.ResizeWritableLayer(t.Context(), resizeReq("ronly", ws, 3*gib))
		if err != nil {
			t.Fatal(err)
		}
		c := res.GetCommand()
		if c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED || c.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_RESIZE_WRITABLE_LAYER ||
			c.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_CALLER || c.GetError() != nil || c.GetCompletedAt() == nil {
			t.Fatalf("command = %v; want a completed resize by the caller", c)
		}
		w, pub := row(t, st, ws)
		if pub.GetWritableLayer().GetCapacityBytes() != 3*gib || pub.GetWritableLayer().GetExists() || w.Generation != w0.Generation ||
			w.CommandID != "" || w.Power != w0.Power || pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
			t.Fatalf("after the resize: %v, generation %d→%d, command %q", pub.GetWritableLayer(), w0.Generation, w.Generation, w.CommandID)
		}
		if got, err := s.GetCommand(t.Context(), &ctrlv1.GetWorkspaceCommandRequest{CommandId: "ronly"}); err != nil || !proto.Equal(got, c) {
			t.Fatalf("GetWorkspaceCommand = %v, %v; want %v", got, err, c)
		}
		if rec := commandRecord(t, st, "ronly"); rec.Method != ctrlv1connect.WorkspaceServiceResizeWorkspaceWritableLayerProcedure {
			t.Fatalf("method %q", rec.Method)
		}
	})
}

// TestResizeCapacity: beyond what the placement can hold is
// resource_exhausted (CAPACITY_EXHAUSTED, field capacity_bytes), recorded,
// nothing changed. A placed Workspace's growth (target - current) is
// judged against the free bytes of its node's pool (PoolFree); without the
// hook, without a placement, or when the pool's capacity is unknown, the
// target is judged against the largest node's storage.
func TestResizeCapacity(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		var asked []string
		pool := func(free uint64, known bool) func(context.Context, store.Tx, string) (uint64, bool, error) {
			return func(_ context.Context, tx store.Tx, node string) (uint64, bool, error) {
				if tx == nil {
					return 0, false, fmt.Errorf("no transaction")
				}
				asked = append(asked, node)
				return free, known, nil
			}
		}
		for i, tc := range []struct {
			name     string
			hook     func(context.Context, store.Tx, string) (uint64, bool, error)
			placed   bool
			target   uint64
			ok       bool
			askedFor string
		}{
			{"growth = free", pool(gib, true), true, 2 * gib, true, "node-1"},
			{"growth > free", pool(gib, true), true, 2*gib + limits.MiB, false, "node-1"},
			{"pool free beyond the largest node", pool(100*gib, true), true, 50 * gib, true, "node-1"},
			{"nothing free", pool(0, true), true, gib + limits.MiB, false, "node-1"},
			{"pool unknown, within the largest node", pool(0, false), true, nodeStorage, true, "node-1"},
			{"pool unknown, beyond the largest node", pool(100*gib, false), true, nodeStorage + limits.MiB, false, "node-1"},
			{"no hook, within", nil, true, nodeStorage, true, ""},
			{"no hook, beyond", nil, true, nodeStorage + limits.MiB, false, ""},
			{"not placed, within", pool(0, true), false, nodeStorage, true, ""},
			{"not placed, beyond", pool(100*gib, true), false, 11 * gib, false, ""},
		} {
			s.PoolFree, asked = tc.hook, nil
			ws := create(t, s, fmt.Sprintf("rcap-create-%d", i)).GetWorkspaceId()
			if tc.placed {
				stopped(t, st, ws) // on node-1, layer absent: a success only records
			} else {
				edit(t, st, ws, configAdmitted[1].set) // FAILED at placement
			}
			w0, _ := row(t, st, ws)
			res, err := s.ResizeWritableLayer(t.Context(), resizeReq(fmt.Sprintf("rcap-%d", i), ws, tc.target))
			if tc.ok {
				if err != nil || res.GetWorkspace().GetWritableLayer().GetCapacityBytes() != tc.target {
					t.Fatalf("%s: Resize = %v, %v; want accepted", tc.name, res, err)
				}
			} else {
				wantRefusal(t, tc.name, err, fault.KindResourceExhausted, fault.ReasonCapacityExhausted, "capacity_bytes")
				unchanged(t, st, ws, w0)
			}
			if want := []string{tc.askedFor}; (tc.askedFor == "") != (len(asked) == 0) || (len(asked) > 0 && asked[0] != want[0]) {
				t.Fatalf("%s: PoolFree asked for %q, want %q", tc.name, asked, tc.askedFor)
			}
		}
	})
}

// finishResize completes an opened resize as the reconciler does when the
// node reports: the generation observed STOPPED, the command COMPLETED with
// fe or with the final response.
func finishResize(t *testing.T, st store.Store, ws, cid string, fe *fault.Error) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(t.Context(), ws)
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		rec, err := tx.GetCommand(t.Context(), cid)
		if err != nil {
			return err
		}
		w.CommandID, w.ObservedGeneration, w.ObservedState = "", w.Generation, store.ExecStopped
		pub.WritableLayer.Exists = true
		rec.Status, rec.CompletedAt = store.CommandCompleted, now
		if fe != nil {
			if rec.ErrorCode, rec.ErrorDetail, err = fault.Encode(fe); err != nil {
				return err
			}
		} else if rec.Result, err = proto.Marshal(&ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: pub, Command: workspace.CommandMessage(rec)}); err != nil {
			return err
		}
		if err := tx.UpdateCommand(t.Context(), rec); err != nil {
			return err
		}
		if err := workspace.Save(w, pub, now); err != nil {
			return err
		}
		return tx.UpdateWorkspace(t.Context(), w)
	})
	if err != nil {
		t.Fatal(err)
	}
	st.Notify(store.WorkspaceTopic(ws))
}

// waitOpened waits until the Workspace's in-flight command is cid.
func waitOpened(t *testing.T, st store.Store, ws, cid string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if w, _ := row(t, st, ws); w.CommandID == cid {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("command %s was not opened", cid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestResizeWaitsForNode: a Workspace whose layer exists gets a new
// generation desired STOPPED with the new capacity, and the call returns
// once the node completed the command (inside the request), with the
// Workspace and the completed command; a resend replays that answer. The
// command is visible while it runs.
func TestResizeWaitsForNode(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		s.WaitBound = time.Minute
		kicks := 0
		var mu sync.Mutex
		s.Kick = func() { mu.Lock(); kicks++; mu.Unlock() }
		ws := stoppedWS(t, s, st, "rwait-create", true)
		edit(t, st, ws, func(w *store.Workspace, _ *ctrlv1.Workspace) { w.ForceStop = true }) // stopped by FORCE
		w0, _ := row(t, st, ws)
		type result struct {
			res *ctrlv1.ResizeWorkspaceWritableLayerResponse
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := s.ResizeWritableLayer(t.Context(), resizeReq("rwait", ws, 2*gib))
			done <- result{res, err}
		}()
		waitOpened(t, st, ws, "rwait")
		w, pub := row(t, st, ws)
		if w.Generation != w0.Generation+1 || w.Power != store.PowerStopped || w.ForceStop || pub.GetWritableLayer().GetCapacityBytes() != 2*gib ||
			pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
			t.Fatalf("opened: generation %d→%d, power %v, force %v, capacity %d, state %v",
				w0.Generation, w.Generation, w.Power, w.ForceStop, pub.GetWritableLayer().GetCapacityBytes(), pub.GetState())
		}
		mu.Lock()
		if kicks == 0 {
			t.Error("the reconciler was not woken")
		}
		mu.Unlock()
		c, err := s.GetCommand(t.Context(), &ctrlv1.GetWorkspaceCommandRequest{CommandId: "rwait"})
		if err != nil || c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING ||
			c.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_RESIZE_WRITABLE_LAYER || c.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_CALLER {
			t.Fatalf("command while in flight = %v, %v", c, err)
		}
		select {
		case r := <-done:
			t.Fatalf("the resize returned before the node answered: %v, %v", r.res, r.err)
		case <-time.After(50 * time.Millisecond):
		}
		finishResize(t, st, ws, "rwait", nil)
		var r result
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the resize did not return when the command completed")
		}
		if r.err != nil || r.res.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED ||
			r.res.GetWorkspace().GetWritableLayer().GetCapacityBytes() != 2*gib {
			t.Fatalf("Resize = %v, %v; want the completed command and the new capacity", r.res, r.err)
		}
		again, err := s.ResizeWritableLayer(t.Context(), resizeReq("rwait", ws, 2*gib))
		if err != nil || !proto.Equal(again, r.res) {
			t.Fatalf("replay = %v, %v; want %v", again, err, r.res)
		}
	})
}

// TestResizeTimeout: past the bound the answer is a retryable unavailable
// (TIMED_OUT), not settled: the command goes on, GetWorkspaceCommand shows
// it, and resending the same ID waits again. A failure the node reports is
// the command's recorded result: every resend returns it, settled.
func TestResizeTimeout(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		ws := stoppedWS(t, s, st, "rto-create", true)
		for range 2 {
			_, err := s.ResizeWritableLayer(t.Context(), resizeReq("rto", ws, 2*gib))
			fe, ok := fault.As(err)
			if !ok || fe.Kind != fault.KindUnavailable || fe.Reason != fault.ReasonTimedOut || !fe.Retryable || fe.Settled ||
				!strings.Contains(fe.Message, "GetWorkspaceCommand") {
				t.Fatalf("Resize past the bound = %+v; want a retryable unavailable TIMED_OUT, not settled", err)
			}
		}
		c, err := s.GetCommand(t.Context(), &ctrlv1.GetWorkspaceCommandRequest{CommandId: "rto"})
		if err != nil || c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING {
			t.Fatalf("GetWorkspaceCommand = %v, %v; want PROCESSING", c, err)
		}
		finishResize(t, st, ws, "rto", &fault.Error{Kind: fault.KindFailedPrecondition, Reason: fault.ReasonExecutionFailed,
			Stage: workspace.ResizeStage, Message: "the node could not grow the writable layer"})
		for range 2 {
			_, err = s.ResizeWritableLayer(t.Context(), resizeReq("rto", ws, 2*gib))
			wantFault(t, "Resize after the node failed it", err, fault.KindFailedPrecondition, "")
			if fe, _ := fault.As(err); fe == nil || !fe.Settled || fe.Stage != workspace.ResizeStage {
				t.Fatalf("replayed failure = %+v; want the recorded one, settled", err)
			}
		}
		c, err = s.GetCommand(t.Context(), &ctrlv1.GetWorkspaceCommandRequest{CommandId: "rto"})
		if err != nil || c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED || c.GetError().GetCode() != "failed_precondition" {
			t.Fatalf("GetWorkspaceCommand = %v, %v; want COMPLETED with the failure", c, err)
		}
	})
}

// TestResizeSupersededByStart: a start admitted while a resize waits for
// the node supersedes it (as a newer command does): the resize answers
// failed_precondition (CONFLICT), the start goes on.
func TestResizeSupersededByStart(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		s.WaitBound = time.Minute
		ws := stoppedWS(t, s, st, "rsup-create", true)
		done := make(chan error, 1)
		go func() {
			_, err := s.ResizeWritableLayer(t.Context(), resizeReq("rsup", ws, 2*gib))
			done <- err
		}()
		waitOpened(t, st, ws, "rsup")
		if _, err := s.Start(t.Context(), &ctrlv1.StartWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "rsup-start"},
			WorkspaceId: ws, ExpectedExpirationRevision: 1}); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if fe, ok := fault.As(err); !ok || fe.Kind != fault.KindFailedPrecondition || fe.Reason != fault.ReasonConflict {
				t.Fatalf("superseded resize = %v; want failed_precondition CONFLICT", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the superseded resize did not return")
		}
	})
}

// FuzzConfigBounds: the validators of UpdateWorkspaceMemory,
// UpdateWorkspaceCpu and ResizeWorkspaceWritableLayer accept exactly the
// documented ranges and name the field they refuse. Seed corpus in
// testdata/fuzz/FuzzConfigBounds.
func FuzzConfigBounds(f *testing.F) {
	f.Add(uint32(16), uint32(1), uint64(16<<20))
	f.Add(uint32(0), uint32(0), uint64(0))
	f.Fuzz(func(t *testing.T, mem, cpu uint32, capacity uint64) {
		check := func(name string, err error, ok bool, field string) {
			if (err == nil) != ok {
				t.Fatalf("%s: %v, want accepted %v", name, err, ok)
			}
			if err != nil {
				if fe, isFault := fault.As(err); !isFault || fe.Kind != fault.KindInvalidArgument || fe.Field != field {
					t.Fatalf("%s: %v, want invalid_argument on %s", name, err, field)
				}
			}
		}
		check(fmt.Sprint("memory ", mem), workspace.CheckMemory("memory_mib", mem), mem >= 16 && mem <= 1<<20, "memory_mib")
		check(fmt.Sprint("cpu ", cpu), workspace.CheckCPU("cpu_millis", cpu), cpu >= 1 && cpu <= 1024000, "cpu_millis")
		check(fmt.Sprint("capacity ", capacity), workspace.CheckLayerCapacity("capacity_bytes", capacity),
			capacity%(1<<20) == 0 && capacity >= 16<<20, "capacity_bytes")
	})
}
