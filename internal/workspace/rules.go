// Package workspace holds the rules of Workspaces: which command each state
// admits (the state machine of seed 000), how a create request is
// validated, and how a Workspace's expiration reacts to a stop. The rules are
// pure functions, table-tested; service.go applies them through the command
// engine and the store.
package workspace

import (
	"fmt"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
)

// Op is a command on a Workspace.
type Op int

// Operations.
const (
	OpStart Op = iota + 1
	OpStop
	OpForceStop
	OpDelete
	OpUpdateMaps   // labels or annotations
	OpUpdateConfig // memory, CPU, writable layer size, Volume binding
	OpUpdateNetworkPolicy
	OpUpdateExpiration
	OpRevokeDataPlane
	OpCreateDataPlaneSession
)

var opNames = map[Op]string{
	OpStart: "start", OpStop: "stop", OpForceStop: "forced stop", OpDelete: "delete",
	OpUpdateMaps: "label or annotation update", OpUpdateConfig: "configuration update",
	OpUpdateNetworkPolicy: "network policy update", OpUpdateExpiration: "expiration update",
	OpRevokeDataPlane: "data-plane revocation", OpCreateDataPlaneSession: "data-plane session",
}

func (o Op) String() string { return opNames[o] }

// Status is what admission needs to know of a Workspace.
type Status struct {
	State          ctrlv1.WorkspaceState
	HoldsExecution bool
	// DeletionBegan is true once a delete was admitted (a FAILED Workspace
	// whose delete failed keeps it).
	DeletionBegan bool
	// ForcePending is true while a forced stop is in flight.
	ForcePending bool
}

// Admit decides whether op is admitted on a Workspace in status s. It
// returns nil or a failed_precondition fault (reason STATE_CONFLICT).
func Admit(op Op, s Status) error {
	st := s.State
	ok := false
	switch op {
	case OpStart:
		// STOPPED, and a FAILED Workspace that holds no execution.
		ok = st == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED ||
			(st == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED && !s.HoldsExecution && !s.DeletionBegan)
	case OpStop:
		ok = st == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
	case OpForceStop:
		// AVAILABLE; while a normal stop is in flight (FORCE supersedes it);
		// a FAILED Workspace that still holds its execution, whatever it
		// failed at, unless its deletion began.
		ok = st == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE ||
			(st == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING && !s.ForcePending) ||
			(st == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED && s.HoldsExecution && !s.DeletionBegan)
	case OpDelete:
		// Any state but DELETING and DELETED; a FAILED Workspace whose
		// deletion began is finished by a new delete.
		ok = st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING && st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
	case OpUpdateMaps:
		ok = st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
	case OpUpdateConfig:
		// Only without an execution: STOPPED, or the FAILED a start may
		// resume from.
		ok = st == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED ||
			(st == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED && !s.HoldsExecution && !s.DeletionBegan)
	case OpUpdateNetworkPolicy:
		ok = st == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || st == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
	case OpUpdateExpiration, OpRevokeDataPlane, OpCreateDataPlaneSession:
		ok = st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING && st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
	}
	if ok {
		return nil
	}
	return fault.Precondition(fault.ReasonStateConflict, "%s is not accepted by a workspace in state %s%s",
		op, shortState(st), holdsNote(s))
}

func holdsNote(s Status) string {
	switch {
	case s.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
		return ""
	case s.DeletionBegan:
		return " whose deletion began (DeleteWorkspace finishes it)"
	case s.HoldsExecution:
		return " that still holds its execution (a FORCE stop releases it)"
	default:
		return " that holds no execution"
	}
}

func shortState(s ctrlv1.WorkspaceState) string {
	const p = "WORKSPACE_STATE_"
	n := s.String()
	if len(n) > len(p) {
		return n[len(p):]
	}
	return n
}

// DefaultTemplate is the template of a create that names none. The sizes
// of a create (writable layer bounds, vCPU rounding) are in
// internal/workspace/limits.
const DefaultTemplate = "default"

// CheckExpirationSpec validates an expiration a request sets. A policy needs
// a deadline in the future, at most MaxExpirationHorizon after now; no
// policy clears.
func CheckExpirationSpec(field string, e *ctrlv1.ExpirationSpec, now time.Time) error {
	if e == nil || e.GetPolicy() == ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED {
		if e.GetDeadline() != nil {
			return fault.Invalid(field+".deadline", "a deadline needs a policy (STOP or DELETE)")
		}
		return nil
	}
	if _, ok := ctrlv1.ExpirationPolicy_name[int32(e.GetPolicy())]; !ok {
		return fault.Invalid(field+".policy", "unknown expiration policy %d", e.GetPolicy())
	}
	if e.GetDeadline() == nil || !e.GetDeadline().IsValid() {
		return fault.Invalid(field+".deadline", "a policy needs a valid deadline")
	}
	if !e.GetDeadline().AsTime().After(now) {
		return fault.Invalid(field+".deadline", "the deadline must be in the future")
	}
	if e.GetDeadline().AsTime().After(now.Add(MaxExpirationHorizon)) {
		return fault.Invalid(field+".deadline", "the deadline must be at most %d days after now", MaxExpirationHorizon/(24*time.Hour))
	}
	return nil
}

// ExpirationAfterStop returns the expiration a Workspace keeps once a stop is
// admitted: the stop's own expiration when it carries one (committed in the
// stop admission); otherwise a STOP policy is consumed and a DELETE policy
// keeps constraining the stopped Workspace. changed reports whether the
// expiration revision must move.
func ExpirationAfterStop(cur *ctrlv1.Expiration, stop *ctrlv1.ExpirationSpec) (next *ctrlv1.Expiration, changed bool) {
	next = &ctrlv1.Expiration{Policy: cur.GetPolicy(), Deadline: cur.GetDeadline(), Revision: cur.GetRevision()}
	switch {
	case stop != nil:
		next.Policy, next.Deadline = stop.GetPolicy(), stop.GetDeadline()
		if stop.GetPolicy() == ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED {
			next.Deadline = nil
		}
	case cur.GetPolicy() == ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP:
		next.Policy, next.Deadline = ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED, nil
	}
	changed = next.GetPolicy() != cur.GetPolicy() || !next.GetDeadline().AsTime().Equal(cur.GetDeadline().AsTime()) ||
		(next.GetDeadline() == nil) != (cur.GetDeadline() == nil)
	if changed {
		next.Revision++
	}
	return next, changed
}

// CheckExpirationRevision is the CAS of stop, start and delete.
func CheckExpirationRevision(expected uint64, cur *ctrlv1.Expiration) error {
	if expected != cur.GetRevision() {
		return &fault.Error{Kind: fault.KindFailedPrecondition, Reason: fault.ReasonExpirationRevisionMismatch,
			Field:   "expected_expiration_revision",
			Message: fmt.Sprintf("expected expiration revision %d, current expiration revision is %d", expected, cur.GetRevision())}
	}
	return nil
}
