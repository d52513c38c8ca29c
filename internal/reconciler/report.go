package reconciler

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// bounded returns rep with its texts within their bounds (a copy when one
// had to be cut), its failure reason one the API knows (else none: the
// default of the stage applies), its guest condition a known one (else
// none) and its network within its bounds (boundedNetwork).
func bounded(rep *nodev1.ExecutionReport) *nodev1.ExecutionReport {
	gm := nodewire.Cut(rep.GetGuestMessage(), nodewire.MaxGuestMessageBytes)
	fm := nodewire.Cut(rep.GetFailureMessage(), nodewire.MaxFailureMessageBytes)
	reason := rep.GetFailureReason()
	if _, ok := ctrlv1.FailureReason_value["FAILURE_REASON_"+reason]; !ok || reason == "UNSPECIFIED" {
		reason = ""
	}
	cond := rep.GetGuestCondition()
	if _, ok := ctrlv1.GuestCondition_name[cond]; !ok {
		cond = 0
	}
	net := boundedNetwork(rep.GetNetwork())
	if gm == rep.GetGuestMessage() && fm == rep.GetFailureMessage() && reason == rep.GetFailureReason() && cond == rep.GetGuestCondition() &&
		net == rep.GetNetwork() {
		return rep
	}
	out := proto.CloneOf(rep)
	out.GuestMessage, out.FailureMessage, out.FailureReason, out.GuestCondition = gm, fm, reason, cond
	out.Network = net
	return out
}

// outcome is how an observed report ends the in-flight command.
type outcome struct {
	done bool
	err  *fault.Error // nil: success
}

// derive sets the public state of a Workspace from its desired state and a
// report that answers the current generation, and says whether the in-flight
// command is done. policyChange says that command is a change of the
// network policy (UpdateWorkspaceNetworkPolicy on an AVAILABLE Workspace),
// which the running execution must confirm (policyChangeOutcome).
func derive(w *store.Workspace, pub *ctrlv1.Workspace, rep *nodev1.ExecutionReport, policyChange bool) outcome {
	st := rep.GetState()
	fail := func(state ctrlv1.WorkspaceState, fe *fault.Error) outcome {
		pub.State = state
		pub.HoldsExecution = rep.GetHoldsExecution()
		return outcome{done: true, err: fe}
	}
	reasonOr := func(def fault.Reason) fault.Reason {
		if r := rep.GetFailureReason(); r != "" {
			return fault.Reason(r)
		}
		return def
	}
	switch w.Power {
	case store.PowerRunning:
		switch st {
		case nodev1.ExecState_EXEC_STATE_RUNNING:
			pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, true
			pub.NetworkPolicyStatus = networkStatus(pub.GetNetworkPolicy(), rep.GetNetwork())
			if policyChange {
				return policyChangeOutcome(pub.GetNetworkPolicy(), rep.GetNetwork(), pub.GetNetworkPolicyStatus())
			}
			return outcome{done: true}
		case nodev1.ExecState_EXEC_STATE_FAILED, nodev1.ExecState_EXEC_STATE_STOPPED:
			return fail(ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, &fault.Error{
				Kind: fault.KindUnavailable, Reason: reasonOr(fault.ReasonExecutionFailed), Retryable: !rep.GetPermanent(), Stage: "start",
				Message: "the execution failed to start: " + rep.GetFailureMessage()})
		}
	case store.PowerStopped:
		switch st {
		case nodev1.ExecState_EXEC_STATE_STOPPED:
			pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, false
			return outcome{done: true}
		case nodev1.ExecState_EXEC_STATE_FAILED:
			return fail(ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, &fault.Error{
				Kind: fault.KindFailedPrecondition, Reason: reasonOr(fault.ReasonGuestWritebackFailed), Stage: "stop",
				Message: "the stop failed: " + rep.GetFailureMessage()})
		}
	case store.PowerDeleted:
		switch st {
		case nodev1.ExecState_EXEC_STATE_DELETED:
			pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, false
			return outcome{done: true}
		case nodev1.ExecState_EXEC_STATE_FAILED:
			return fail(ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, &fault.Error{
				Kind: fault.KindUnavailable, Reason: reasonOr(fault.ReasonExecutionFailed), Retryable: true, Stage: "delete",
				Message: "the delete failed: " + rep.GetFailureMessage()})
		}
	}
	pub.State = transitional(w)
	return outcome{}
}

// transitional is the state of a Workspace whose command is in flight.
func transitional(w *store.Workspace) ctrlv1.WorkspaceState {
	switch w.Power {
	case store.PowerStopped:
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
	case store.PowerDeleted:
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING
	}
	if w.Generation <= 1 {
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING
	}
	return ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
}

// applyReport folds one report of nodeID into the store (applyReports).
// It returns whether a command completed.
func (r *Reconciler) applyReport(ctx context.Context, nodeID string, epoch int64, rep *nodev1.ExecutionReport) (bool, error) {
	done, err := r.applyReports(ctx, nodeID, epoch, []*nodev1.ExecutionReport{rep})
	return len(done) > 0, err
}

// applyReports folds reports of nodeID into the store in one transaction,
// their texts cut to their bounds first (a Hello's executions come in
// chunks, so that a restart of ctrl, to which every node sends its full
// state, costs a transaction per chunk, not per execution). It returns
// the Workspaces whose command completed. Reports of a stream (epoch, its
// connection epoch; 0 for none) write only while that epoch is the node's
// stored one, checked in the transaction: a report a superseded stream
// still delivers — the node connected again, here or to another replica,
// and its Hello sent newer state — writes nothing (errSuperseded).
func (r *Reconciler) applyReports(ctx context.Context, nodeID string, epoch int64, reps []*nodev1.ExecutionReport) ([]string, error) {
	reps = slices.Clone(reps)
	for i := range reps {
		reps[i] = bounded(reps[i])
	}
	var done []string
	err := r.store.InTx(ctx, func(tx store.Tx) error {
		done = done[:0]
		if epoch != 0 {
			stored, err := tx.NodeEpoch(ctx, nodeID)
			if err != nil {
				return err
			}
			if stored != epoch {
				return errSuperseded
			}
		}
		for _, rep := range reps {
			completed, err := r.foldReport(ctx, tx, nodeID, rep)
			if err != nil {
				return err
			}
			if completed {
				done = append(done, rep.GetWorkspaceId())
			}
		}
		return nil
	})
	return done, err
}

// changing returns those of reps (reports of nodeID) that would change
// the store, found by folding them in a read-only transaction: one that
// changes nothing writes nothing there, one that would write fails (View
// refuses writes) and is kept, and so are those after it, since the failed
// write may have ended the transaction. When the View itself fails, all
// are kept, for the write to meet the store's error.
func (r *Reconciler) changing(ctx context.Context, nodeID string, reps []*nodev1.ExecutionReport) []*nodev1.ExecutionReport {
	var out []*nodev1.ExecutionReport
	err := r.store.View(ctx, func(tx store.Tx) error {
		out = out[:0]
		for i, rep := range reps {
			if completed, err := r.foldReport(ctx, tx, nodeID, bounded(rep)); err != nil || completed {
				out = append(out, reps[i:]...)
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return reps
	}
	return out
}

// foldReport folds one report (bounded) of nodeID into tx, and reports
// whether a command completed. A report that changes nothing of the
// Workspace — the execution as last reported, as a Hello after a restart
// of ctrl carries for every Workspace — writes nothing: the row's
// ObservedAt is when a report last changed it.
func (r *Reconciler) foldReport(ctx context.Context, tx store.Tx, nodeID string, rep *nodev1.ExecutionReport) (bool, error) {
	completed := false
	w, err := tx.GetWorkspace(ctx, rep.GetWorkspaceId())
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if w.NodeID != nodeID || !w.DeletedAt.IsZero() {
		return false, nil
	}
	pub, err := workspace.Decode(w)
	if err != nil {
		return false, err
	}
	before, orig := proto.CloneOf(pub), *w
	now := r.now()
	w.ObservedAt = now
	// The DNS configuration of the execution the report describes; none
	// reported (0) is an execution an earlier release started, or none.
	w.ExecDNSVersion = rep.GetNetwork().GetDnsConfigVersion()
	if m := rep.GetNetwork().GetMessage(); m != "" {
		red, err := redactSecrets(ctx, tx, pub.GetNetworkPolicy(), m)
		if err != nil {
			return false, err
		}
		if red != m {
			rep = proto.CloneOf(rep)
			rep.Network.Message = red
		}
	}
	if pub.GetWritableLayer() != nil {
		pub.WritableLayer.Exists = rep.GetLayerExists()
	}
	observe(pub, rep, now)

	switch {
	case rep.GetGuestExited() && rep.GetGeneration() == w.Generation && w.Power == store.PowerRunning && w.CommandID == "":
		// The guest powered itself off: a recorded guest-shutdown stop.
		if err := guestShutdown(ctx, tx, w, pub, now); err != nil {
			return false, err
		}
	case rep.GetGeneration() == w.Generation:
		w.ObservedGeneration = rep.GetGeneration()
		w.ObservedState = execState(rep.GetState())
		policyChange, err := changesPolicy(ctx, tx, w)
		if err != nil {
			return false, err
		}
		out := derive(w, pub, rep, policyChange)
		resize, err := resizeInFlight(ctx, tx, w)
		if err != nil {
			return false, err
		}
		if resize != nil {
			out = resizeOutcome(w, pub, rep, resize, out)
		}
		if out.err != nil {
			pub.Failure = out.err.Detail()
		}
		if pub.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			w.DeletedAt = now
			pub.DeletedAt = timestamppb.New(now)
			if err := tx.SetReferences(ctx, w.ID, nil); err != nil {
				return false, err
			}
			if err := r.workspaceGone(ctx, tx, pub, now); err != nil {
				return false, err
			}
		}
		if out.done && w.CommandID != "" {
			if err := complete(ctx, tx, w, pub, out.err, now); err != nil {
				return false, err
			}
			completed = true
		}
	case pub.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN:
		pub.State = workspace.Underlying(w)
	}
	if !completed && sameRow(&orig, w) && proto.Equal(before, pub) {
		return false, nil
	}
	if err := workspace.Save(w, pub, now); err != nil {
		return false, err
	}
	return completed, tx.UpdateWorkspace(ctx, w)
}

// sameRow reports whether b is a, its ObservedAt aside.
func sameRow(a, b *store.Workspace) bool {
	x, y := *a, *b
	x.ObservedAt, y.ObservedAt = time.Time{}, time.Time{}
	return reflect.DeepEqual(x, y)
}

// changesPolicy reports whether w's in-flight command is a change of its
// network policy.
func changesPolicy(ctx context.Context, tx store.Tx, w *store.Workspace) (bool, error) {
	if w.CommandID == "" {
		return false, nil
	}
	rec, err := tx.GetCommand(ctx, w.CommandID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return ctrlv1.WorkspaceCommandKind(rec.Kind) == ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_NETWORK_POLICY &&
		rec.Status == store.CommandProcessing, nil
}

// observe records the guest's condition a report carries, when it is
// another condition or message than the one recorded; an execution that
// ended takes the observation with it.
func observe(pub *ctrlv1.Workspace, rep *nodev1.ExecutionReport, now time.Time) {
	switch rep.GetState() {
	case nodev1.ExecState_EXEC_STATE_STOPPED, nodev1.ExecState_EXEC_STATE_DELETED:
		pub.GuestObservation = nil
		return
	}
	if c := rep.GetGuestCondition(); c != 0 {
		if cur := pub.GetGuestObservation(); cur.GetCondition() == ctrlv1.GuestCondition(c) && cur.GetMessage() == rep.GetGuestMessage() {
			// The same condition again: it keeps when it was first
			// observed (every report repeats it, a Hello for every
			// Workspace, and must not rewrite the row for a timestamp).
			return
		}
		at := rep.GetObservedAt()
		if at == nil {
			at = timestamppb.New(now)
		}
		pub.GuestObservation = &ctrlv1.GuestObservation{Condition: ctrlv1.GuestCondition(c), ObservedAt: at, Message: rep.GetGuestMessage()}
	}
}

// execState is the store's form of a reported execution state.
func execState(s nodev1.ExecState) store.ExecState {
	switch s {
	case nodev1.ExecState_EXEC_STATE_STARTING:
		return store.ExecStarting
	case nodev1.ExecState_EXEC_STATE_RUNNING:
		return store.ExecRunning
	case nodev1.ExecState_EXEC_STATE_STOPPED:
		return store.ExecStopped
	case nodev1.ExecState_EXEC_STATE_FAILED:
		return store.ExecFailed
	case nodev1.ExecState_EXEC_STATE_DELETED:
		return store.ExecDeleted
	}
	return store.ExecNone
}

// complete records the end of the Workspace's in-flight command: its error,
// or for stop and delete the final response that replays return.
func complete(ctx context.Context, tx store.Tx, w *store.Workspace, pub *ctrlv1.Workspace, fe *fault.Error, now time.Time) error {
	rec, err := tx.GetCommand(ctx, w.CommandID)
	w.CommandID = ""
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || rec.Status == store.CommandCompleted {
		return err
	}
	rec.Status, rec.CompletedAt = store.CommandCompleted, now
	if fe != nil {
		rec.ErrorCode, rec.ErrorDetail, err = fault.Encode(fe)
		if err != nil {
			return err
		}
	} else {
		switch ctrlv1.WorkspaceCommandKind(rec.Kind) {
		case ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP, ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_DELETE,
			ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_NETWORK_POLICY,
			ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_RESIZE_WRITABLE_LAYER:
			// StopWorkspaceResponse, DeleteWorkspaceResponse,
			// UpdateWorkspaceNetworkPolicyResponse and
			// ResizeWorkspaceWritableLayerResponse share this shape (workspace
			// = 1, command = 2): a replay answers the Workspace as the command
			// completed it.
			final := proto.Clone(pub).(*ctrlv1.Workspace)
			final.UpdatedAt = timestamppb.New(now)
			rec.Result, err = proto.Marshal(&ctrlv1.StopWorkspaceResponse{Workspace: final, Command: workspace.CommandMessage(rec)})
			if err != nil {
				return err
			}
		}
	}
	return tx.UpdateCommand(ctx, rec)
}

// saveRow writes pub into the row (with the deletion time the row has, if
// pub lacks it) and the row into the store.
func saveRow(ctx context.Context, tx store.Tx, w *store.Workspace, pub *ctrlv1.Workspace, now time.Time) error {
	if !w.DeletedAt.IsZero() && pub.GetDeletedAt() == nil {
		pub.DeletedAt = timestamppb.New(w.DeletedAt)
	}
	if err := workspace.Save(w, pub, now); err != nil {
		return err
	}
	return tx.UpdateWorkspace(ctx, w)
}

// guestShutdown records the stop of a Workspace whose guest powered itself
// off, under a reserved command ID.
func guestShutdown(ctx context.Context, tx store.Tx, w *store.Workspace, pub *ctrlv1.Workspace, now time.Time) error {
	id := fmt.Sprintf("guest-shutdown/%s/%d", w.ID, w.Generation)
	err := tx.InsertCommand(ctx, &store.Command{
		ID: id, Method: "ctrl/guest-shutdown", ObjectKind: workspace.ObjectKind, ObjectID: w.ID,
		Kind:      int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP),
		Initiator: int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_GUEST_SHUTDOWN),
		Status:    store.CommandProcessing, CreatedAt: now,
		Message: fmt.Sprintf("guest shutdown: the guest of generation %d powered itself off; "+
			"a forced stop releases its execution (no guest is left to write back)", w.Generation),
	})
	if errors.Is(err, store.ErrDuplicate) {
		return nil
	}
	if err != nil {
		return err
	}
	w.Power, w.ForceStop, w.CommandID = store.PowerStopped, true, id
	w.Generation++
	pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
	pub.Expiration, _ = workspace.ExpirationAfterStop(pub.GetExpiration(), nil)
	return nil
}

// resizeInFlight returns w's in-flight command when it is a writable layer
// resize (ResizeWorkspaceWritableLayer), else nil.
func resizeInFlight(ctx context.Context, tx store.Tx, w *store.Workspace) (*store.Command, error) {
	if w.CommandID == "" {
		return nil, nil
	}
	rec, err := tx.GetCommand(ctx, w.CommandID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if ctrlv1.WorkspaceCommandKind(rec.Kind) != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_RESIZE_WRITABLE_LAYER ||
		rec.Status != store.CommandProcessing {
		return nil, nil
	}
	return rec, nil
}

// resizeOutcome ends the writable layer resize rec on the node's report of
// its generation (desired STOPPED with the new capacity; out is what
// derive made of it). The node answers once it grew the layer offline,
// reporting STOPPED and the layer's capacity (layer_capacity_bytes), or
// FAILED when it could not.
//
//   - STOPPED with the layer at the target or more: success, and the
//     recorded capacity is the one reported. A layer that no longer exists
//     (none reported) keeps the target: the next start creates it so.
//   - STOPPED with a smaller layer (a node that did not grow it, or reports
//     no capacity for an existing layer), or FAILED: the command completes
//     with the failure (failed_precondition EXECUTION_FAILED, or
//     resource_exhausted CAPACITY_EXHAUSTED when the node says its storage
//     is full; stage resize_writable_layer; not retryable with this command
//     ID, a new one may succeed). A Workspace whose node holds no execution
//     stays STOPPED. The recorded capacity is restored to what the layer
//     really has: the node's layer_capacity_bytes, or, when it reports none,
//     the capacity before the resize (from the command's recorded
//     acceptance, see workspace.Service.ResizeWritableLayer).
func resizeOutcome(w *store.Workspace, pub *ctrlv1.Workspace, rep *nodev1.ExecutionReport, rec *store.Command, out outcome) outcome {
	if !out.done || pub.GetWritableLayer() == nil {
		return out
	}
	target, got := pub.GetWritableLayer().GetCapacityBytes(), rep.GetLayerCapacityBytes()
	stopped := rep.GetState() == nodev1.ExecState_EXEC_STATE_STOPPED
	if stopped && (got >= target || (got == 0 && !rep.GetLayerExists())) {
		if got != 0 {
			pub.WritableLayer.CapacityBytes = got
		}
		return out
	}
	restored := got
	if restored == 0 {
		before := &ctrlv1.ResizeWorkspaceWritableLayerResponse{}
		if proto.Unmarshal(rec.Result, before) == nil && before.GetWorkspace().GetWritableLayer().GetCapacityBytes() != 0 {
			restored = before.GetWorkspace().GetWritableLayer().GetCapacityBytes()
		} else {
			restored = target
		}
	}
	pub.WritableLayer.CapacityBytes = restored
	fe := &fault.Error{Kind: fault.KindFailedPrecondition, Reason: fault.ReasonExecutionFailed, Stage: workspace.ResizeStage}
	if stopped {
		fe.Message = fmt.Sprintf("the node did not grow the writable layer to %d bytes", target)
	} else {
		fe.Message = fmt.Sprintf("the node could not grow the writable layer to %d bytes", target)
		if m := rep.GetFailureMessage(); m != "" {
			fe.Message += ": " + m
		}
		if fault.Reason(rep.GetFailureReason()) == fault.ReasonCapacityExhausted {
			fe.Kind, fe.Reason = fault.KindResourceExhausted, fault.ReasonCapacityExhausted
		}
	}
	fe.Message += fmt.Sprintf("; the layer keeps %d bytes", restored)
	if !rep.GetHoldsExecution() {
		pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, false
		w.ObservedState = store.ExecStopped
	}
	return outcome{done: true, err: fe}
}
