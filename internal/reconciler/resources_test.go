package reconciler

import (
	"context"
	"os"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/workspace"
)

// dialects runs f with a Reconciler (loop not running, fake clock at t0)
// on SQLite and on PostgreSQL (skipped without KIBOTOS_TEST_POSTGRES_URL,
// failed in CI).
func dialects(t *testing.T, f func(t *testing.T, r *Reconciler, st store.Store)) {
	t.Run("sqlite", func(t *testing.T) {
		r, st, _ := newTest(t, Config{})
		f(t, r, st)
	})
	t.Run("postgres", func(t *testing.T) {
		url := os.Getenv("KIBOTOS_TEST_POSTGRES_URL")
		if url == "" {
			if os.Getenv("CI") == "true" {
				t.Fatal("KIBOTOS_TEST_POSTGRES_URL is not set; CI must run the PostgreSQL tests")
			}
			t.Skip("KIBOTOS_TEST_POSTGRES_URL is not set: skipping PostgreSQL test")
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
		clock := &fakeClock{now: t0}
		f(t, New(Config{Store: st, Now: clock.Now}), st)
	})
}

func TestBeyondNode(t *testing.T) {
	c := workspace.Capacity{MemoryMiB: 1024, CPUMillis: 2000}
	for _, tc := range []struct {
		c        workspace.Capacity
		mem, cpu uint64
		want     string // a part of the reason, "" when it fits
	}{
		{c, 1024, 2000, ""},
		{c, 16, 1, ""},
		{c, 1025, 2000, "offers 1024 MiB of memory; the workspace requests 1025 MiB"},
		{c, 1024, 2001, "offers 2000 millicores; the workspace requests 2001"},
		{workspace.Capacity{}, 1 << 20, 1 << 20, ""}, // unknown: the node judges
	} {
		got := beyondNode("n1", tc.c, tc.mem, tc.cpu)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("beyondNode(%v, %d MiB, %d millicores) = %q, want %q", tc.c, tc.mem, tc.cpu, got, tc.want)
		}
	}
}

// TestRefuseOversized: the pending start of a placed Workspace whose memory
// or CPU exceed all its node offers fails at once (resource_exhausted,
// CAPACITY_EXHAUSTED, stage placement) and leaves it FAILED holding no
// execution; a start that fits, a command that is not a start, an unplaced
// Workspace and a node of unknown capacity are left alone.
func TestRefuseOversized(t *testing.T) {
	dialects(t, func(t *testing.T, r *Reconciler, st store.Store) {
		connectNode(t, r, hello("n1", 1024, 400, "pool-a", workspace.DefaultTemplate))
		kStart := ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_START
		kPolicy := ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_NETWORK_POLICY
		for _, tc := range []struct {
			name    string
			row     row
			refused bool
		}{
			{"memory beyond the node", row{node: "n1", power: running, generation: 3, observed: 2, exec: store.ExecStopped, state: wsStart, memMiB: 2048, kind: kStart}, true},
			{"CPU beyond the node (500 of 400)", row{node: "n1", power: running, generation: 3, observed: 2, exec: store.ExecStopped, state: wsStart, memMiB: 1024, kind: kStart}, true},
			{"not a start", row{node: "n1", power: running, generation: 3, observed: 2, exec: store.ExecRunning, state: wsAvail, memMiB: 2048, kind: kPolicy}, false},
			{"not placed", row{power: running, generation: 3, observed: 2, exec: store.ExecStopped, state: wsStart, memMiB: 2048, kind: kStart}, false},
			{"node of unknown capacity", row{node: "n9", power: running, generation: 3, observed: 2, exec: store.ExecStopped, state: wsStart, memMiB: 2048, kind: kStart}, false},
			{"already observed", row{node: "n1", power: running, generation: 3, observed: 3, exec: store.ExecRunning, state: wsAvail, memMiB: 2048, kind: kStart}, false},
		} {
			id := "ws-" + strings.ReplaceAll(tc.name, " ", "-")
			tc.row.id, tc.row.command = id, "c-"+id
			seed(t, st, t0, tc.row)
			w0, _ := load(t, st, id)
			refused, err := r.refuseOversized(t.Context(), w0)
			if err != nil || refused != tc.refused {
				t.Fatalf("%s: refuseOversized = %v, %v; want %v", tc.name, refused, err, tc.refused)
			}
			w, pub := load(t, st, id)
			c := loadCommand(t, st, tc.row.command)
			if !tc.refused {
				if string(w.Doc) != string(w0.Doc) || w.ObservedGeneration != w0.ObservedGeneration || c.Status != store.CommandProcessing {
					t.Fatalf("%s: the workspace or its command changed", tc.name)
				}
				continue
			}
			if pub.GetState() != wsFailed || pub.GetHoldsExecution() || w.CommandID != "" || w.ObservedGeneration != w.Generation || w.ObservedState != store.ExecFailed ||
				pub.GetFailure().GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED || pub.GetFailure().GetStage() != "placement" {
				t.Fatalf("%s: state %v holds %v command %q observed %d/%d exec %v failure %v", tc.name, pub.GetState(), pub.GetHoldsExecution(),
					w.CommandID, w.ObservedGeneration, w.Generation, w.ObservedState, pub.GetFailure())
			}
			if c.Status != store.CommandCompleted || c.ErrorCode != "resource_exhausted" {
				t.Fatalf("%s: command %v %q; want COMPLETED resource_exhausted", tc.name, c.Status, c.ErrorCode)
			}
			if got := workspace.Underlying(w); got != wsFailed {
				t.Fatalf("%s: underlying state %v, want FAILED (what a silent node's Workspace shows)", tc.name, got)
			}
		}
	})
}

// resizeRow is a STOPPED Workspace on n1 whose 1 GiB layer exists, with a
// resize to 2 GiB in flight at generation 3, as the admission leaves it
// (the acceptance recording the Workspace as the resize found it).
func seedResize(t *testing.T, st store.Store, id string, exec store.ExecState) {
	t.Helper()
	seed(t, st, t0, row{id: id, node: "n1", power: stopped, generation: 3, observed: 2, exec: exec, state: wsStoped,
		command: "c-" + id, kind: ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_RESIZE_WRITABLE_LAYER})
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(t.Context(), id)
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		before := proto.CloneOf(pub)
		before.WritableLayer.Exists = true
		rec, err := tx.GetCommand(t.Context(), "c-"+id)
		if err != nil {
			return err
		}
		if rec.Result, err = proto.Marshal(&ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: before}); err != nil {
			return err
		}
		if err := tx.UpdateCommand(t.Context(), rec); err != nil {
			return err
		}
		pub.WritableLayer = &ctrlv1.WritableLayer{CapacityBytes: 2 << 30, Exists: true}
		if err := workspace.Save(w, pub, t0); err != nil {
			return err
		}
		return tx.UpdateWorkspace(t.Context(), w)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestApplyReportResize: the node's report of a resize's generation
// completes it. STOPPED with the layer at the target (or beyond) is a
// success recording the reported capacity, with the final response for
// replays; a smaller layer, or FAILED, completes it with the failure while
// a Workspace whose node holds no execution stays STOPPED, and the recorded
// capacity is the one the layer really has: reported, or the one before the
// resize when the node reports none.
func TestApplyReportResize(t *testing.T) {
	const (
		before = uint64(1 << 30)
		target = uint64(2 << 30)
	)
	dialects(t, func(t *testing.T, r *Reconciler, st store.Store) {
		for _, tc := range []struct {
			name     string
			rep      *nodev1.ExecutionReport
			state    ctrlv1.WorkspaceState
			capacity uint64
			code     string // "" for success
			reason   ctrlv1.FailureReason
			message  string // a part of the failure's message
		}{
			{"grown", &nodev1.ExecutionReport{State: exStop, LayerExists: true, LayerCapacityBytes: target},
				wsStoped, target, "", 0, ""},
			{"grown beyond", &nodev1.ExecutionReport{State: exStop, LayerExists: true, LayerCapacityBytes: target + 1<<20},
				wsStoped, target + 1<<20, "", 0, ""},
			{"layer gone: created at the target by the next start", &nodev1.ExecutionReport{State: exStop},
				wsStoped, target, "", 0, ""},
			{"not grown", &nodev1.ExecutionReport{State: exStop, LayerExists: true, LayerCapacityBytes: before},
				wsStoped, before, "failed_precondition", ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED, "did not grow"},
			{"capacity not reported", &nodev1.ExecutionReport{State: exStop, LayerExists: true},
				wsStoped, before, "failed_precondition", ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED, "keeps 1073741824 bytes"},
			{"failed", &nodev1.ExecutionReport{State: exFail, LayerExists: true, LayerCapacityBytes: before, FailureMessage: "resize2fs: bad"},
				wsStoped, before, "failed_precondition", ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED, "resize2fs: bad"},
			{"failed, partly grown", &nodev1.ExecutionReport{State: exFail, LayerExists: true, LayerCapacityBytes: before + 1<<20},
				wsStoped, before + 1<<20, "failed_precondition", ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED, "keeps 1074790400 bytes"},
			{"failed without capacity", &nodev1.ExecutionReport{State: exFail, LayerExists: true},
				wsStoped, before, "failed_precondition", ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED, "could not grow"},
			{"storage full", &nodev1.ExecutionReport{State: exFail, LayerExists: true, LayerCapacityBytes: before, FailureReason: "CAPACITY_EXHAUSTED"},
				wsStoped, before, "resource_exhausted", ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, "could not grow"},
			{"failed holding an execution", &nodev1.ExecutionReport{State: exFail, HoldsExecution: true, LayerExists: true, LayerCapacityBytes: before},
				wsFailed, before, "failed_precondition", ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED, "could not grow"},
		} {
			id := "ws-" + strings.NewReplacer(" ", "-", ",", "", ":", "").Replace(tc.name)
			seedResize(t, st, id, store.ExecStopped)
			rep := proto.CloneOf(tc.rep)
			rep.WorkspaceId, rep.Generation = id, 3
			completed, err := r.applyReport(t.Context(), "n1", 0, rep)
			if err != nil || !completed {
				t.Fatalf("%s: applyReport = %v, %v; want the command completed", tc.name, completed, err)
			}
			w, pub := load(t, st, id)
			c := loadCommand(t, st, "c-"+id)
			if pub.GetState() != tc.state || pub.GetWritableLayer().GetCapacityBytes() != tc.capacity || w.CommandID != "" ||
				c.Status != store.CommandCompleted || c.ErrorCode != tc.code {
				t.Fatalf("%s: state %v capacity %d command %q; recorded %v %q; want %v, %d, completed %q",
					tc.name, pub.GetState(), pub.GetWritableLayer().GetCapacityBytes(), w.CommandID, c.Status, c.ErrorCode, tc.state, tc.capacity, tc.code)
			}
			if tc.state == wsStoped && (pub.GetHoldsExecution() || w.ObservedState != store.ExecStopped || workspace.Underlying(w) != wsStoped) {
				t.Fatalf("%s: holds %v, observed %v, underlying %v; want a STOPPED workspace", tc.name, pub.GetHoldsExecution(), w.ObservedState, workspace.Underlying(w))
			}
			if tc.code == "" {
				final := &ctrlv1.ResizeWorkspaceWritableLayerResponse{}
				if err := proto.Unmarshal(c.Result, final); err != nil || final.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED ||
					final.GetWorkspace().GetWritableLayer().GetCapacityBytes() != tc.capacity || final.GetWorkspace().GetState() != wsStoped {
					t.Fatalf("%s: final response %v, %v", tc.name, final, err)
				}
				continue
			}
			fe := fault.Decode(c.ErrorCode, c.ErrorDetail)
			if fe.Reason.Enum() != tc.reason || fe.Stage != workspace.ResizeStage || fe.Retryable || !strings.Contains(fe.Message, tc.message) {
				t.Fatalf("%s: failure %+v; want %v at %s containing %q", tc.name, fe, tc.reason, workspace.ResizeStage, tc.message)
			}
			if pub.GetFailure().GetStage() != workspace.ResizeStage {
				t.Fatalf("%s: the Workspace's failure is %v", tc.name, pub.GetFailure())
			}
		}

		// A report of an earlier generation does not end the resize.
		seedResize(t, st, "ws-stale", store.ExecStopped)
		if completed, err := r.applyReport(t.Context(), "n1", 0, &nodev1.ExecutionReport{WorkspaceId: "ws-stale", Generation: 2, State: exStop,
			LayerExists: true, LayerCapacityBytes: before}); err != nil || completed {
			t.Fatalf("stale report: %v, %v", completed, err)
		}
		if w, pub := load(t, st, "ws-stale"); w.CommandID != "c-ws-stale" || pub.GetWritableLayer().GetCapacityBytes() != target {
			t.Fatalf("stale report changed the resize: command %q capacity %d", w.CommandID, pub.GetWritableLayer().GetCapacityBytes())
		}
	})
}

// TestPassRefusesOversizedStart: a pass fails such a start instead of
// pushing it to the node.
func TestPassRefusesOversizedStart(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	nc := connectNode(t, r, hello("n1", 1024, 4000, "", workspace.DefaultTemplate))
	seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 3, observed: 2, exec: store.ExecStopped, state: wsStart,
		memMiB: 4096, command: "c-1", kind: ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_START})
	if err := r.pass(t.Context()); err != nil {
		t.Fatalf("pass = %v", err)
	}
	if len(nc.send) != 0 {
		t.Fatalf("%d messages sent, want none", len(nc.send))
	}
	if _, pub := load(t, st, "ws-1"); pub.GetState() != wsFailed || pub.GetFailure().GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED {
		t.Fatalf("after the pass: %v, failure %v", pub.GetState(), pub.GetFailure())
	}
}
