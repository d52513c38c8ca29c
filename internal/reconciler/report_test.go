package reconciler

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

const (
	running  = store.PowerRunning
	stopped  = store.PowerStopped
	deleted  = store.PowerDeleted
	wsAvail  = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
	wsCreate = ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING
	wsStart  = ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
	wsStop   = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
	wsStoped = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
	wsDelete = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING
	wsGone   = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
	wsFailed = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
	wsUnk    = ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN
	exNone   = nodev1.ExecState_EXEC_STATE_UNSPECIFIED
	exStart  = nodev1.ExecState_EXEC_STATE_STARTING
	exRun    = nodev1.ExecState_EXEC_STATE_RUNNING
	exStop   = nodev1.ExecState_EXEC_STATE_STOPPED
	exFail   = nodev1.ExecState_EXEC_STATE_FAILED
	exDel    = nodev1.ExecState_EXEC_STATE_DELETED
)

// holds is what derive does to HoldsExecution.
type holds int

const (
	holdsKept     holds = iota // left as it was (the command is in flight)
	holdsNone                  // false: nothing held
	holdsOne                   // true: an execution runs
	holdsReported              // what the report says (a failure)
)

// TestDerive is the whole table of desired power × reported execution
// state, each with both reported holds_execution values: the public state,
// whether the in-flight command is done, at which stage it failed, and what
// becomes of holds_execution.
func TestDerive(t *testing.T) {
	for _, tc := range []struct {
		power      store.Power
		generation uint64
		exec       nodev1.ExecState
		state      ctrlv1.WorkspaceState
		done       bool
		failStage  string // "" when the command succeeds or is still in flight
		holds      holds
	}{
		// Desired RUNNING: AVAILABLE once running; a stopped or failed
		// execution fails the start; anything else is still on the way.
		{running, 1, exNone, wsCreate, false, "", holdsKept},
		{running, 1, exStart, wsCreate, false, "", holdsKept},
		{running, 2, exStart, wsStart, false, "", holdsKept},
		{running, 1, exRun, wsAvail, true, "", holdsOne},
		{running, 5, exRun, wsAvail, true, "", holdsOne},
		{running, 1, exStop, wsFailed, true, "start", holdsReported},
		{running, 1, exFail, wsFailed, true, "start", holdsReported},
		{running, 2, exFail, wsFailed, true, "start", holdsReported},
		{running, 2, exDel, wsStart, false, "", holdsKept},
		// Desired STOPPED.
		{stopped, 2, exNone, wsStop, false, "", holdsKept},
		{stopped, 2, exStart, wsStop, false, "", holdsKept},
		{stopped, 2, exRun, wsStop, false, "", holdsKept},
		{stopped, 2, exStop, wsStoped, true, "", holdsNone},
		{stopped, 2, exFail, wsFailed, true, "stop", holdsReported},
		{stopped, 2, exDel, wsStop, false, "", holdsKept},
		// Desired DELETED.
		{deleted, 3, exNone, wsDelete, false, "", holdsKept},
		{deleted, 3, exStart, wsDelete, false, "", holdsKept},
		{deleted, 3, exRun, wsDelete, false, "", holdsKept},
		{deleted, 3, exStop, wsDelete, false, "", holdsKept},
		{deleted, 3, exFail, wsFailed, true, "delete", holdsReported},
		{deleted, 3, exDel, wsGone, true, "", holdsNone},
	} {
		for _, repHolds := range []bool{false, true} {
			name := fmt.Sprintf("power=%d/gen=%d/%v/holds=%v", tc.power, tc.generation, tc.exec, repHolds)
			t.Run(name, func(t *testing.T) {
				w := &store.Workspace{ID: "ws-1", Power: tc.power, Generation: tc.generation}
				// Start from the opposite of the report, so that "kept" and
				// "reported" differ.
				pub := &ctrlv1.Workspace{WorkspaceId: "ws-1", HoldsExecution: !repHolds}
				out := derive(w, pub, &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: tc.generation,
					State: tc.exec, HoldsExecution: repHolds, FailureMessage: "boom"}, false)
				if pub.GetState() != tc.state {
					t.Errorf("state = %v, want %v", pub.GetState(), tc.state)
				}
				if out.done != tc.done {
					t.Errorf("done = %v, want %v", out.done, tc.done)
				}
				switch {
				case tc.failStage == "" && out.err != nil:
					t.Errorf("err = %v, want none", out.err)
				case tc.failStage != "" && out.err == nil:
					t.Errorf("err = nil, want a failure at stage %q", tc.failStage)
				case tc.failStage != "" && out.err.Stage != tc.failStage:
					t.Errorf("err.Stage = %q, want %q", out.err.Stage, tc.failStage)
				}
				want := map[holds]bool{holdsKept: !repHolds, holdsNone: false, holdsOne: true, holdsReported: repHolds}[tc.holds]
				if pub.GetHoldsExecution() != want {
					t.Errorf("holds_execution = %v, want %v", pub.GetHoldsExecution(), want)
				}
			})
		}
	}
}

// TestDeriveFailure: the failure of each stage — its kind, reason (the
// node's when it gives one), retryability and message.
func TestDeriveFailure(t *testing.T) {
	for _, tc := range []struct {
		name      string
		power     store.Power
		exec      nodev1.ExecState
		reason    string
		permanent bool
		want      *fault.Error
	}{
		{"start failed", running, exFail, "", false, &fault.Error{Kind: fault.KindUnavailable, Reason: fault.ReasonExecutionFailed,
			Retryable: true, Stage: "start", Message: "the execution failed to start: boom"}},
		{"start failed permanently", running, exFail, "EXECUTION_FAILED", true, &fault.Error{Kind: fault.KindUnavailable,
			Reason: fault.ReasonExecutionFailed, Retryable: false, Stage: "start", Message: "the execution failed to start: boom"}},
		{"start failed with the node's reason", running, exFail, "GUEST_UNRESPONSIVE", false, &fault.Error{Kind: fault.KindUnavailable,
			Reason: fault.ReasonGuestUnresponsive, Retryable: true, Stage: "start", Message: "the execution failed to start: boom"}},
		{"execution stopped while desired running", running, exStop, "", false, &fault.Error{Kind: fault.KindUnavailable,
			Reason: fault.ReasonExecutionFailed, Retryable: true, Stage: "start", Message: "the execution failed to start: boom"}},
		{"stop failed", stopped, exFail, "", false, &fault.Error{Kind: fault.KindFailedPrecondition,
			Reason: fault.ReasonGuestWritebackFailed, Stage: "stop", Message: "the stop failed: boom"}},
		{"stop failed with the node's reason", stopped, exFail, "GUEST_UNRESPONSIVE", false, &fault.Error{Kind: fault.KindFailedPrecondition,
			Reason: fault.ReasonGuestUnresponsive, Stage: "stop", Message: "the stop failed: boom"}},
		{"delete failed", deleted, exFail, "", false, &fault.Error{Kind: fault.KindUnavailable,
			Reason: fault.ReasonExecutionFailed, Retryable: true, Stage: "delete", Message: "the delete failed: boom"}},
		{"delete failed permanently is still retryable", deleted, exFail, "", true, &fault.Error{Kind: fault.KindUnavailable,
			Reason: fault.ReasonExecutionFailed, Retryable: true, Stage: "delete", Message: "the delete failed: boom"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &store.Workspace{ID: "ws-1", Power: tc.power, Generation: 2}
			out := derive(w, &ctrlv1.Workspace{}, &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: 2, State: tc.exec,
				FailureReason: tc.reason, FailureMessage: "boom", Permanent: tc.permanent}, false)
			if !out.done {
				t.Errorf("done = false, want true")
			}
			if diff := cmp.Diff(tc.want, out.err, protocmp.Transform()); diff != "" {
				t.Errorf("derive failure (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDeriveNetworkPolicyStatus: a running execution has applied a NONE
// policy; a PUBLIC_INTERNET one waits for a report of the node's network
// (TestNetworkStatus has the whole table); no other report changes the
// status.
func TestDeriveNetworkPolicyStatus(t *testing.T) {
	pending := &ctrlv1.NetworkPolicyStatus{State: ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING}
	applied := func(rev uint64) *ctrlv1.NetworkPolicyStatus {
		return &ctrlv1.NetworkPolicyStatus{AppliedRevision: rev, State: ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED}
	}
	for _, tc := range []struct {
		name   string
		power  store.Power
		exec   nodev1.ExecState
		policy *ctrlv1.NetworkPolicy
		want   *ctrlv1.NetworkPolicyStatus
	}{
		{"none applied when running", running, exRun, &ctrlv1.NetworkPolicy{Revision: 3, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, applied(3)},
		{"no policy applied when running", running, exRun, nil, applied(0)},
		{"public internet without a network report stays pending", running, exRun, &ctrlv1.NetworkPolicy{Revision: 2, Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET}, pending},
		{"starting stays pending", running, exStart, &ctrlv1.NetworkPolicy{Revision: 3, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, pending},
		{"failed start stays pending", running, exFail, &ctrlv1.NetworkPolicy{Revision: 3, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, pending},
		{"stopped untouched", stopped, exStop, &ctrlv1.NetworkPolicy{Revision: 3, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, pending},
		{"running while stopping untouched", stopped, exRun, &ctrlv1.NetworkPolicy{Revision: 3, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, pending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := &ctrlv1.Workspace{NetworkPolicy: tc.policy, NetworkPolicyStatus: proto.Clone(pending).(*ctrlv1.NetworkPolicyStatus)}
			derive(&store.Workspace{Power: tc.power, Generation: 2}, pub, &nodev1.ExecutionReport{Generation: 2, State: tc.exec}, false)
			if diff := cmp.Diff(tc.want, pub.GetNetworkPolicyStatus(), protocmp.Transform()); diff != "" {
				t.Errorf("network_policy_status (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTransitional: the state of a Workspace whose command is in flight.
func TestTransitional(t *testing.T) {
	for _, tc := range []struct {
		power      store.Power
		generation uint64
		want       ctrlv1.WorkspaceState
	}{
		{running, 0, wsCreate},
		{running, 1, wsCreate},
		{running, 2, wsStart},
		{running, 9, wsStart},
		{stopped, 1, wsStop},
		{stopped, 2, wsStop},
		{deleted, 1, wsDelete},
		{deleted, 4, wsDelete},
	} {
		if got := transitional(&store.Workspace{Power: tc.power, Generation: tc.generation}); got != tc.want {
			t.Errorf("transitional(power=%d, generation=%d) = %v, want %v", tc.power, tc.generation, got, tc.want)
		}
	}
}

// TestObserve: the guest observation follows the report's condition, dated
// by the node (or by ctrl when the node gives no time); an execution that
// ended takes it away; a report without a condition leaves it.
func TestObserve(t *testing.T) {
	now := t0
	at := timestamppb.New(t0.Add(-time.Second))
	old := &ctrlv1.GuestObservation{Condition: ctrlv1.GuestCondition_GUEST_CONDITION_READY, ObservedAt: timestamppb.New(t0.Add(-time.Hour))}
	const (
		ready   = ctrlv1.GuestCondition_GUEST_CONDITION_READY
		booting = ctrlv1.GuestCondition_GUEST_CONDITION_BOOTING
		unresp  = ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE
	)
	for _, tc := range []struct {
		name string
		rep  *nodev1.ExecutionReport
		want *ctrlv1.GuestObservation
	}{
		{"stopped clears", &nodev1.ExecutionReport{State: exStop, GuestCondition: int32(ready)}, nil},
		{"deleted clears", &nodev1.ExecutionReport{State: exDel}, nil},
		{"no condition keeps", &nodev1.ExecutionReport{State: exRun}, old},
		{"condition with the node's time", &nodev1.ExecutionReport{State: exRun, GuestCondition: int32(unresp), GuestMessage: "no answer", ObservedAt: at},
			&ctrlv1.GuestObservation{Condition: unresp, ObservedAt: at, Message: "no answer"}},
		{"condition without time is dated now", &nodev1.ExecutionReport{State: exStart, GuestCondition: int32(booting)},
			&ctrlv1.GuestObservation{Condition: booting, ObservedAt: timestamppb.New(now)}},
		{"failed execution keeps reporting", &nodev1.ExecutionReport{State: exFail, GuestCondition: int32(unresp), ObservedAt: at},
			&ctrlv1.GuestObservation{Condition: unresp, ObservedAt: at}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := &ctrlv1.Workspace{GuestObservation: proto.Clone(old).(*ctrlv1.GuestObservation)}
			observe(pub, tc.rep, now)
			if diff := cmp.Diff(tc.want, pub.GetGuestObservation(), protocmp.Transform()); diff != "" {
				t.Errorf("guest_observation (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExecState: every reported execution state has its stored form; an
// unknown one is "nothing reported".
func TestExecState(t *testing.T) {
	for in, want := range map[nodev1.ExecState]store.ExecState{
		exNone: store.ExecNone, exStart: store.ExecStarting, exRun: store.ExecRunning,
		exStop: store.ExecStopped, exFail: store.ExecFailed, exDel: store.ExecDeleted, 99: store.ExecNone,
	} {
		if got := execState(in); got != want {
			t.Errorf("execState(%v) = %v, want %v", in, got, want)
		}
	}
}

// TestApplyReport folds one report into a stored Workspace: the generation
// decides whether it counts, the derived state is saved, the in-flight
// command completes in the same transaction.
func TestApplyReport(t *testing.T) {
	const (
		kStart  = ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_START
		kStop   = ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP
		kDelete = ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_DELETE
	)
	type want struct {
		state      ctrlv1.WorkspaceState
		power      store.Power
		generation uint64
		observed   uint64
		exec       store.ExecState
		command    string // the row's in-flight command afterwards
		completed  bool   // applyReport says a command completed
		cmdCode    string // the seeded command's error code once completed ("" success)
		cmdDone    bool   // the seeded command is COMPLETED
		deleted    bool
		failure    ctrlv1.FailureReason
	}
	for _, tc := range []struct {
		name string
		row  row
		node string // the reporting node; "n1" when empty
		rep  *nodev1.ExecutionReport
		want want
	}{
		{"create completes when running",
			row{power: running, generation: 1, state: wsCreate, command: "c-1"},
			"", &nodev1.ExecutionReport{Generation: 1, State: exRun, HoldsExecution: true},
			want{state: wsAvail, power: running, generation: 1, observed: 1, exec: store.ExecRunning, completed: true, cmdDone: true}},
		{"create in progress",
			row{power: running, generation: 1, state: wsCreate, command: "c-1"},
			"", &nodev1.ExecutionReport{Generation: 1, State: exStart},
			want{state: wsCreate, power: running, generation: 1, observed: 1, exec: store.ExecStarting, command: "c-1"}},
		{"start fails",
			row{power: running, generation: 2, observed: 1, exec: store.ExecStopped, state: wsStart, command: "c-2", kind: kStart},
			"", &nodev1.ExecutionReport{Generation: 2, State: exFail, FailureMessage: "no layer"},
			want{state: wsFailed, power: running, generation: 2, observed: 2, exec: store.ExecFailed, completed: true, cmdDone: true,
				cmdCode: "unavailable", failure: ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED}},
		{"stale generation is only observed",
			row{power: stopped, generation: 3, observed: 2, exec: store.ExecRunning, state: wsStop, command: "c-3", kind: kStop},
			"", &nodev1.ExecutionReport{Generation: 2, State: exRun, HoldsExecution: true},
			want{state: wsStop, power: stopped, generation: 3, observed: 2, exec: store.ExecRunning, command: "c-3"}},
		{"stale generation brings UNKNOWN back to the underlying state",
			row{power: stopped, generation: 3, observed: 2, exec: store.ExecRunning, state: wsUnk, command: "c-3", kind: kStop},
			"", &nodev1.ExecutionReport{Generation: 2, State: exRun, HoldsExecution: true},
			want{state: wsStop, power: stopped, generation: 3, observed: 2, exec: store.ExecRunning, command: "c-3"}},
		{"current generation brings UNKNOWN back through derive",
			row{power: running, generation: 2, observed: 2, exec: store.ExecRunning, state: wsUnk},
			"", &nodev1.ExecutionReport{Generation: 2, State: exRun, HoldsExecution: true},
			want{state: wsAvail, power: running, generation: 2, observed: 2, exec: store.ExecRunning}},
		{"stop completes",
			row{power: stopped, generation: 3, observed: 2, exec: store.ExecRunning, state: wsStop, command: "c-3", kind: kStop},
			"", &nodev1.ExecutionReport{Generation: 3, State: exStop},
			want{state: wsStoped, power: stopped, generation: 3, observed: 3, exec: store.ExecStopped, completed: true, cmdDone: true}},
		{"delete completes",
			row{power: deleted, generation: 4, observed: 3, exec: store.ExecStopped, state: wsDelete, command: "c-4", kind: kDelete},
			"", &nodev1.ExecutionReport{Generation: 4, State: exDel},
			want{state: wsGone, power: deleted, generation: 4, observed: 4, exec: store.ExecDeleted, completed: true, cmdDone: true, deleted: true}},
		{"report from another node is ignored",
			row{power: running, generation: 1, state: wsCreate, command: "c-1"},
			"n2", &nodev1.ExecutionReport{Generation: 1, State: exRun, HoldsExecution: true},
			want{state: wsCreate, power: running, generation: 1, command: "c-1"}},
		{"guest powered off: a recorded stop",
			row{power: running, generation: 2, observed: 2, exec: store.ExecRunning, state: wsAvail},
			"", &nodev1.ExecutionReport{Generation: 2, State: exStop, GuestExited: true},
			want{state: wsStop, power: stopped, generation: 3, observed: 2, exec: store.ExecRunning, command: "guest-shutdown/ws-1/2"}},
		{"guest powered off during a command: a failed start",
			row{power: running, generation: 2, observed: 1, exec: store.ExecStopped, state: wsStart, command: "c-2", kind: kStart},
			"", &nodev1.ExecutionReport{Generation: 2, State: exStop, GuestExited: true},
			want{state: wsFailed, power: running, generation: 2, observed: 2, exec: store.ExecStopped, completed: true, cmdDone: true,
				cmdCode: "unavailable", failure: ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, st, _ := newTest(t, Config{})
			tc.row.id, tc.row.node = "ws-1", "n1"
			seed(t, st, t0, tc.row)
			node := tc.node
			if node == "" {
				node = "n1"
			}
			rep := proto.Clone(tc.rep).(*nodev1.ExecutionReport)
			rep.WorkspaceId = "ws-1"
			completed, err := r.applyReport(t.Context(), node, 0, rep)
			if err != nil {
				t.Fatalf("applyReport = %v", err)
			}
			w, pub := load(t, st, "ws-1")
			got := want{state: pub.GetState(), power: w.Power, generation: w.Generation, observed: w.ObservedGeneration,
				exec: w.ObservedState, command: w.CommandID, completed: completed, deleted: !w.DeletedAt.IsZero(),
				failure: pub.GetFailure().GetReason()}
			if tc.row.command != "" {
				c := loadCommand(t, st, tc.row.command)
				got.cmdDone, got.cmdCode = c.Status == store.CommandCompleted, c.ErrorCode
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("after the report (-want +got):\n%s", diff)
			}
			if w.State != int32(pub.GetState()) {
				t.Errorf("state column = %d, document says %v", w.State, pub.GetState())
			}
		})
	}
}

// TestApplyReportGuestShutdownCommand: the stop of a guest that powered
// itself off is recorded under its reserved ID with the GUEST_SHUTDOWN
// initiator, once per generation.
func TestApplyReportGuestShutdownCommand(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 2, observed: 2, exec: store.ExecRunning, state: wsAvail})
	rep := &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: 2, State: exStop, GuestExited: true}
	if _, err := r.applyReport(t.Context(), "n1", 0, rep); err != nil {
		t.Fatal(err)
	}
	c := loadCommand(t, st, "guest-shutdown/ws-1/2")
	if c.Initiator != int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_GUEST_SHUTDOWN) || c.Status != store.CommandProcessing ||
		c.Kind != int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP) || c.ObjectID != "ws-1" {
		t.Errorf("guest-shutdown command = %+v", c)
	}
	if m, want := workspace.CommandMessage(c).GetMessage(), "guest shutdown: the guest of generation 2 powered itself off; "+
		"a forced stop releases its execution (no guest is left to write back)"; m != want {
		t.Errorf("guest-shutdown message = %q, want %q", m, want)
	}
	w, _ := load(t, st, "ws-1")
	if !w.ForceStop {
		t.Errorf("ForceStop = false, want a forced stop")
	}
	// The same report again: generation 2 is no longer current, nothing
	// more happens.
	if _, err := r.applyReport(t.Context(), "n1", 0, rep); err != nil {
		t.Fatal(err)
	}
	if w2, _ := load(t, st, "ws-1"); w2.Generation != 3 || w2.CommandID != "guest-shutdown/ws-1/2" {
		t.Errorf("after a repeated report: generation %d, command %q; want 3, guest-shutdown/ws-1/2", w2.Generation, w2.CommandID)
	}
}

// TestReportUnchangedWritesNothing: a report that changes nothing of its
// Workspace — what a Hello after a restart of ctrl carries for every
// execution, the guest's condition observed again included — writes
// nothing (updated_at, the row's ObservedAt and the guest observation's
// observed_at, when the condition was first observed, stay);
// one that changes it is written. A Hello's executions are applied in
// chunks, each command they complete completed.
func TestReportUnchangedWritesNothing(t *testing.T) {
	r, st, clock := newTest(t, Config{})
	nc := connectNode(t, r, hello("n1", 65536, 32000, "pool-a", workspace.DefaultTemplate))
	// As kibotos-node reports: the guest's condition, observed now.
	run := func(id string) *nodev1.ExecutionReport {
		return &nodev1.ExecutionReport{WorkspaceId: id, Generation: 1, State: nodev1.ExecState_EXEC_STATE_RUNNING, HoldsExecution: true,
			LayerExists: true, GuestCondition: int32(ctrlv1.GuestCondition_GUEST_CONDITION_READY), ObservedAt: timestamppb.New(clock.Now())}
	}
	seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 1, command: "c-1", state: wsCreate})
	clock.Set(t0.Add(time.Second))
	if err := r.report(t.Context(), nc, run("ws-1")); err != nil {
		t.Fatal(err)
	}
	w1, pub1 := load(t, st, "ws-1")
	if pub1.GetState() != wsAvail || !w1.ObservedAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("after the first report: %v, observed at %v", pub1.GetState(), w1.ObservedAt)
	}
	clock.Set(t0.Add(time.Minute))
	if err := r.report(t.Context(), nc, run("ws-1")); err != nil {
		t.Fatal(err)
	}
	w2, pub2 := load(t, st, "ws-1")
	if !bytes.Equal(w1.Doc, w2.Doc) || !w2.UpdatedAt.Equal(w1.UpdatedAt) || !w2.ObservedAt.Equal(w1.ObservedAt) ||
		!pub2.GetGuestObservation().GetObservedAt().AsTime().Equal(t0.Add(time.Second)) {
		t.Errorf("an unchanged report wrote: updated %v → %v, observed %v → %v", pub1.GetUpdatedAt().AsTime(), pub2.GetUpdatedAt().AsTime(),
			w1.ObservedAt, w2.ObservedAt)
	}
	changed := run("ws-1")
	changed.GuestCondition, changed.ObservedAt = int32(ctrlv1.GuestCondition_GUEST_CONDITION_DISK_PRESSURE), timestamppb.New(t0.Add(time.Minute))
	if err := r.report(t.Context(), nc, changed); err != nil {
		t.Fatal(err)
	}
	if w3, pub3 := load(t, st, "ws-1"); !w3.ObservedAt.Equal(t0.Add(time.Minute)) || pub3.GetGuestObservation() == nil {
		t.Errorf("a changed report: observed at %v, guest observation %v", w3.ObservedAt, pub3.GetGuestObservation())
	}

	// A Hello with 150 executions, each completing its create.
	var reps []*nodev1.ExecutionReport
	for i := range 150 {
		id := fmt.Sprintf("ws-h%03d", i)
		seed(t, st, t0, row{id: id, node: "n1", power: running, generation: 1, command: "c-" + id, state: wsCreate})
		reps = append(reps, run(id))
	}
	if err := r.helloReports(t.Context(), nc, reps); err != nil {
		t.Fatal(err)
	}
	for _, rep := range reps {
		if c := loadCommand(t, st, "c-"+rep.GetWorkspaceId()); c.Status != store.CommandCompleted {
			t.Fatalf("%s: command %v after the Hello, want completed", rep.GetWorkspaceId(), c.Status)
		}
	}
}

// writeCounter counts the store's write transactions.
type writeCounter struct {
	store.Store
	writes atomic.Int64
}

func (c *writeCounter) InTx(ctx context.Context, fn func(store.Tx) error) error {
	c.writes.Add(1)
	return c.Store.InTx(ctx, fn)
}

// TestHelloUnchangedOpensNoWrite: a Hello whose executions are as last
// reported (every node's after a restart of ctrl) opens no write
// transaction; one whose chunk holds a changed execution writes that one,
// and only it.
func TestHelloUnchangedOpensNoWrite(t *testing.T) {
	_, st, clock := newTest(t, Config{})
	wc := &writeCounter{Store: st}
	r := New(Config{Store: wc, Now: clock.Now})
	nc := connectNode(t, r, hello("n1", 65536, 32000, "pool-a", workspace.DefaultTemplate))
	var reps []*nodev1.ExecutionReport
	for i := range 150 {
		id := fmt.Sprintf("ws-%03d", i)
		seed(t, st, t0, row{id: id, node: "n1", power: running, generation: 1, observed: 1, exec: 1, state: wsAvail})
		reps = append(reps, &nodev1.ExecutionReport{WorkspaceId: id, Generation: 1, State: nodev1.ExecState_EXEC_STATE_RUNNING,
			HoldsExecution: true, LayerExists: true})
	}
	// The executions reported once: the rows are as last reported.
	if err := r.helloReports(t.Context(), nc, reps); err != nil {
		t.Fatal(err)
	}
	before := map[string]*store.Workspace{}
	for _, rep := range reps {
		before[rep.GetWorkspaceId()], _ = load(t, st, rep.GetWorkspaceId())
	}
	clock.Set(t0.Add(time.Minute))
	wc.writes.Store(0)
	if err := r.helloReports(t.Context(), nc, reps); err != nil {
		t.Fatal(err)
	}
	if n := wc.writes.Load(); n != 0 {
		t.Errorf("an unchanged Hello of %d executions opened %d write transactions, want 0", len(reps), n)
	}
	reps[70] = proto.CloneOf(reps[70])
	reps[70].GuestCondition, reps[70].ObservedAt = int32(ctrlv1.GuestCondition_GUEST_CONDITION_DISK_PRESSURE), timestamppb.New(clock.Now())
	if err := r.helloReports(t.Context(), nc, reps); err != nil {
		t.Fatal(err)
	}
	if n := wc.writes.Load(); n != 1 {
		t.Errorf("a Hello with one changed execution opened %d write transactions, want 1", n)
	}
	for i, rep := range reps {
		w, pub := load(t, st, rep.GetWorkspaceId())
		switch wrote := !w.UpdatedAt.Equal(before[w.ID].UpdatedAt); {
		case i == 70 && (!wrote || pub.GetGuestObservation() == nil):
			t.Errorf("%s, changed: updated at %v, guest observation %v", w.ID, w.UpdatedAt, pub.GetGuestObservation())
		case i != 70 && wrote:
			t.Errorf("%s, unchanged, was written at %v", w.ID, w.UpdatedAt)
		}
	}
}

// TestResyncTakesTurns: a node's resync (its Hello applied, its full state
// built) waits for a token while every one is taken, counting as heard
// meanwhile (the wait is ctrl's, not the node's silence), and goes on once
// one is free.
func TestResyncTakesTurns(t *testing.T) {
	r, _, clock := newTest(t, Config{})
	h := hello("n1", 65536, 32000, "pool-a", workspace.DefaultTemplate)
	nc := connectNode(t, r, h)
	for range cap(r.resyncs) {
		r.resyncs <- struct{}{}
	}
	type result struct {
		full *nodev1.ConnectResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		full, err := r.resync(t.Context(), nc, h)
		done <- result{full, err}
	}()
	clock.Set(t0.Add(time.Minute))
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		seen := nc.lastSeen
		r.mu.Unlock()
		if seen.Equal(t0.Add(time.Minute)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a node waiting for its resync was last heard at %v, want %v", seen, t0.Add(time.Minute))
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case res := <-done:
		t.Fatalf("the resync ran with every token taken: %v", res.err)
	default:
	}
	<-r.resyncs
	select {
	case res := <-done:
		if res.err != nil || !res.full.GetDesired().GetFull() {
			t.Fatalf("resync = %v, %v; want the full state", res.full, res.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the resync did not go on once a token was free")
	}
}
