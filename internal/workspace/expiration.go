package workspace

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// MaxExpirationHorizon is how far ahead of the request a deadline may be:
// 3650 days (about ten years). A later one is invalid_argument.
const MaxExpirationHorizon = 3650 * 24 * time.Hour

// ExpirationTopic is the Notifier topic the admissions that may arm an
// expiration notify after their commit (CreateWorkspace, StopWorkspace and
// UpdateWorkspaceExpiration with an expiration): the expiration engine
// waits on it, then re-reads the store.
const ExpirationTopic = "expiration"

// ExpirationMethod is the method of the commands an expiration starts (the
// caller's procedures name the others).
const ExpirationMethod = "ctrl/expiration"

const updateExpirationMethod = "/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceExpiration"

// ExpirationCommandID is the ID of the command the expiration armed at
// revision rev of Workspace id starts: one per revision, so that the
// command table's unique key lets it fire once.
func ExpirationCommandID(id string, rev uint64) string {
	return fmt.Sprintf("expiration/%s/%d", id, rev)
}

// ArmedDeadline is the deadline of the expiration armed on pub, rounded up
// to the microsecond (the store's precision, so that it never falls due
// early), or the zero time when none is armed: no policy, or the Workspace
// is DELETED. Save keeps the store's query column equal to it.
func ArmedDeadline(pub *ctrlv1.Workspace) time.Time {
	e := pub.GetExpiration()
	if e.GetPolicy() == ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED || e.GetDeadline() == nil ||
		pub.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		return time.Time{}
	}
	d := e.GetDeadline().AsTime().UTC()
	if t := d.Truncate(time.Microsecond); !t.Equal(d) {
		return t.Add(time.Microsecond)
	}
	return d
}

// sameExpiration reports whether cur already says what spec sets.
func sameExpiration(cur *ctrlv1.Expiration, spec *ctrlv1.ExpirationSpec) bool {
	if spec.GetPolicy() == ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED {
		return cur.GetPolicy() == ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED && cur.GetDeadline() == nil
	}
	return cur.GetPolicy() == spec.GetPolicy() && cur.GetDeadline() != nil &&
		cur.GetDeadline().AsTime().Equal(spec.GetDeadline().AsTime())
}

// UpdateExpiration serves UpdateWorkspaceExpiration: it sets the expiration
// (policy STOP or DELETE with a deadline in the future, at most
// MaxExpirationHorizon ahead) or clears it (no expiration, or policy
// UNSPECIFIED), under CAS on expiration.revision. Refusals are
// failed_precondition with observed_workspace: a DELETING or DELETED
// Workspace (STATE_CONFLICT), then a revision other than expected_revision
// (EXPIRATION_REVISION_MISMATCH). Equal content keeps the revision; a change
// increments it. It completes at once (the command is recorded COMPLETED)
// and wakes the expiration engine.
func (s *Service) UpdateExpiration(ctx context.Context, req *ctrlv1.UpdateWorkspaceExpirationRequest) (*ctrlv1.UpdateWorkspaceExpirationResponse, error) {
	id := req.GetWorkspaceId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	spec := req.GetExpiration()
	defer s.Store.Notify(ExpirationTopic)
	return command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.UpdateWorkspaceExpirationRequest, *ctrlv1.UpdateWorkspaceExpirationResponse]{
		Method: updateExpirationMethod, ObjectKind: ObjectKind, ObjectID: id,
		CommandKind: int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_EXPIRATION), Request: req,
		NewResponse: func() *ctrlv1.UpdateWorkspaceExpirationResponse { return &ctrlv1.UpdateWorkspaceExpirationResponse{} },
		// Judged by the clock only when nothing is recorded: a resend
		// replays after the deadline passed.
		Prepare: func(context.Context) error { return CheckExpirationSpec("expiration", spec, s.now()) },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*ctrlv1.UpdateWorkspaceExpirationResponse, error) {
			w, pub, err := s.load(ctx, tx, id)
			if err != nil {
				return nil, err
			}
			if err := Admit(OpUpdateExpiration, status(w, pub)); err != nil {
				return nil, observed(err, pub)
			}
			if err := CheckExpirationRevision(req.GetExpectedRevision(), pub.GetExpiration()); err != nil {
				fe, _ := fault.As(err)
				c := *fe
				c.Field = "expected_revision"
				return nil, observed(&c, pub)
			}
			if !sameExpiration(pub.GetExpiration(), spec) {
				next := &ctrlv1.Expiration{Revision: pub.GetExpiration().GetRevision() + 1}
				if spec.GetPolicy() != ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED {
					next.Policy, next.Deadline = spec.GetPolicy(), spec.GetDeadline()
				}
				pub.Expiration = next
				if err := Save(w, pub, s.now()); err != nil {
					return nil, err
				}
				if err := tx.UpdateWorkspace(ctx, w); err != nil {
					return nil, err
				}
			}
			return &ctrlv1.UpdateWorkspaceExpirationResponse{Workspace: pub}, nil
		},
	})
}

// Firing is what FireExpiration did.
type Firing int

// Firings.
const (
	// FiringNone: nothing armed was due (no expiration, a later deadline,
	// or its revision fired or changed meanwhile); nothing written.
	FiringNone Firing = iota
	// FiringStarted: the stop or delete was admitted, its command is
	// PROCESSING and the reconciler carries it out.
	FiringStarted
	// FiringConsumed: a STOP policy on a Workspace that holds nothing to
	// stop (STOPPED, FAILED) was consumed with no stop; its command is
	// COMPLETED.
	FiringConsumed
	// FiringWaits: due, but the Workspace is between states (CREATING,
	// STARTING, STOPPING, DELETING); nothing written, to be tried again
	// once its state settles.
	FiringWaits
)

func (f Firing) String() string {
	switch f {
	case FiringStarted:
		return "started"
	case FiringConsumed:
		return "consumed"
	case FiringWaits:
		return "waits"
	}
	return "none"
}

// expirationMessage is the message of the command expiration exp starts:
// "expiration: the STOP deadline 2026-01-02T03:04:05Z passed; " and what.
func expirationMessage(exp *ctrlv1.Expiration, what string) string {
	return fmt.Sprintf("expiration: the %s deadline %s passed; %s", strings.TrimPrefix(exp.GetPolicy().String(), "EXPIRATION_POLICY_"),
		exp.GetDeadline().AsTime().UTC().Format(time.RFC3339Nano), what)
}

// FireExpiration carries out the expiration of Workspace id if one is
// armed and due, in one transaction that moves expiration.revision and
// records the command ExpirationCommandID(id, armed revision) (kind STOP or
// DELETE, initiator EXPIRATION). The deterministic ID and the command
// table's unique key make each armed revision fire at most once, whoever
// calls (several replicas, a restarted ctrl); a caller's change that moved
// the revision first leaves nothing to fire, and a firing that moved it
// first makes the caller's expected_expiration_revision fail.
//
// What the firing does, judged as a caller's StopWorkspace or
// DeleteWorkspace would be (the same Admit on the same status; an UNKNOWN
// Workspace is judged on the state under it):
//
//   - STOP: a Workspace a normal stop is admitted on (AVAILABLE) is
//     stopped as StopWorkspace without an expiration would (a normal stop:
//     writeback first), which consumes the policy. On a STOPPED or FAILED
//     Workspace the policy is consumed with no stop (the command completes
//     at once; a FORCE stop of a FAILED Workspace that holds its execution
//     stays the caller's decision). CREATING, STARTING, STOPPING and
//     DELETING wait until the state settles.
//   - DELETE: the Workspace is deleted as DeleteWorkspace would (in every
//     state but DELETING, which waits, and DELETED, which has nothing
//     armed); the policy is consumed.
//
// It returns the command's ID when it wrote one.
func (s *Service) FireExpiration(ctx context.Context, id string) (Firing, string, error) {
	var (
		firing Firing
		cmdID  string
	)
	err := s.Store.InTx(ctx, func(tx store.Tx) error {
		firing, cmdID = FiringNone, ""
		w, pub, err := s.load(ctx, tx, id)
		if err != nil {
			return err
		}
		now := s.now()
		due := ArmedDeadline(pub)
		if due.IsZero() || now.Before(due) {
			return nil
		}
		exp := pub.GetExpiration()
		rec := &store.Command{
			ID: ExpirationCommandID(id, exp.GetRevision()), Method: ExpirationMethod, ObjectKind: ObjectKind, ObjectID: id,
			Kind:      int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP),
			Initiator: int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_EXPIRATION),
			Status:    store.CommandCompleted, CreatedAt: now, CompletedAt: now,
		}
		if err := tx.LockCommand(ctx, rec.ID); err != nil {
			return err
		}
		if _, err := tx.GetCommand(ctx, rec.ID); err == nil {
			return nil // fired already (the revision moved with it)
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		st := status(w, pub)
		var t transition
		switch exp.GetPolicy() {
		case ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP:
			switch {
			case Admit(OpStop, st) == nil:
				t = stopTransition(id, 0, false, nil) // consumes the STOP policy
				rec.Message = expirationMessage(exp, "a normal stop, as StopWorkspace would (writeback first)")
			case st.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || st.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
				rec.Message = expirationMessage(exp, "the workspace was "+strings.TrimPrefix(st.State.String(), "WORKSPACE_STATE_")+
					": the policy is consumed without a stop")
				pub.Expiration = &ctrlv1.Expiration{Revision: exp.GetRevision() + 1}
				if err := Save(w, pub, now); err != nil {
					return err
				}
				if err := tx.UpdateWorkspace(ctx, w); err != nil {
					return err
				}
				if rec.Result, err = proto.Marshal(&ctrlv1.StopWorkspaceResponse{Workspace: pub, Command: CommandMessage(rec)}); err != nil {
					return err
				}
				if err := tx.InsertCommand(ctx, rec); err != nil {
					return err
				}
				firing, cmdID = FiringConsumed, rec.ID
				return nil
			default:
				firing = FiringWaits
				return nil
			}
		case ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE:
			if Admit(OpDelete, st) != nil {
				firing = FiringWaits
				return nil
			}
			rec.Kind = int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_DELETE)
			rec.Message = expirationMessage(exp, "deleted as DeleteWorkspace would")
			t = deleteTransition(id, 0)
			del := t.apply
			t.apply = func(tx store.Tx, w *store.Workspace, pub *ctrlv1.Workspace, now time.Time) error {
				if err := del(tx, w, pub, now); err != nil {
					return err
				}
				pub.Expiration = &ctrlv1.Expiration{Revision: exp.GetRevision() + 1} // consumed
				return nil
			}
		default:
			return nil
		}
		t.ctrl = true
		admitted, err := s.admit(ctx, tx, rec, t)
		if err != nil {
			return err
		}
		// StopWorkspaceResponse and DeleteWorkspaceResponse share this
		// shape; the reconciler replaces it with the final one.
		if rec.Result, err = proto.Marshal(&ctrlv1.StopWorkspaceResponse{Workspace: admitted, Command: acceptance(rec)}); err != nil {
			return err
		}
		rec.CompletedAt = time.Time{}
		if err := tx.InsertCommand(ctx, rec); err != nil {
			return err
		}
		firing, cmdID = FiringStarted, rec.ID
		return nil
	})
	if errors.Is(err, store.ErrDuplicate) {
		return FiringNone, "", nil // another replica fired it first
	}
	if err != nil {
		return FiringNone, "", err
	}
	if firing == FiringStarted || firing == FiringConsumed {
		// The admission may have superseded the Workspace's command in
		// flight: wake its waiters, and the reconciler.
		s.Store.Notify(store.WorkspaceTopic(id))
		if firing == FiringStarted {
			s.kick()
		}
	}
	return firing, cmdID, nil
}
