package workspace

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
)

// DrainMethod is the method of the stops a drain with stop_workspaces
// starts (the caller's procedures name the others).
const DrainMethod = "ctrl/node-drain"

// DrainStopCommandID is the ID of the stop that the drain recorded under
// drainCommandID starts for Workspace id: "<drain command ID>#stop/<id>".
// The '#' is never in a caller's command ID, so it collides with none, and
// the drain's own ID makes a resend find the stops it started.
func DrainStopCommandID(drainCommandID, id string) string {
	return drainCommandID + "#stop/" + id
}

// DrainRuleStopCommandID is the ID of the stop that the standing rule of
// the drain recorded under drainCommandID starts for Workspace id, seen
// AVAILABLE at generation gen: "<drain command ID>#stop/<id>/<gen>". A
// Workspace ID holds no '/', so it collides with no DrainStopCommandID;
// each stop bumps the generation and a Workspace is stopped only while
// desired RUNNING, so two stops of one Workspace in one drain never share
// a generation, while every try at the same one (a second pass, another
// replica) derives the same ID and the commands table keeps one.
func DrainRuleStopCommandID(drainCommandID, id string, gen uint64) string {
	return fmt.Sprintf("%s#stop/%s/%d", drainCommandID, id, gen)
}

// StopForDrain starts, inside tx, a normal stop of every Workspace on
// nodeID desired RUNNING that a caller's StopWorkspace would stop now
// (AVAILABLE, or UNKNOWN over AVAILABLE): the same admission
// (AdmitCtrlStop: the command in flight superseded, a STOP expiration
// consumed, writeback first on the node), under the command ID
// DrainStopCommandID(drainCommandID, workspace), kind STOP, initiator
// NODE_DRAIN. It is DrainNode's stop_workspaces (NodeService, the hook
// fleet.Service.StopWorkspaces).
//
// A Workspace already stopping (desired STOPPED or DELETED) is left alone;
// one between states (CREATING, STARTING) or FAILED, whose stop the state
// rules refuse, is left for now: nothing is written for it, and the
// reconciler stops it once it is AVAILABLE (StopForDrainRule). The stops
// already recorded under these IDs are found again and not repeated, so a
// resend of the drain changes nothing. After the commit the caller kicks
// the reconciler, which sends the stops to the node (NodeService's Changed
// hook does: Reconciler.FleetChanged); waiters of a superseded command see
// it at their next re-read of the store.
func (s *Service) StopForDrain(ctx context.Context, tx store.Tx, nodeID, drainCommandID string) error {
	_, err := s.stopForDrain(ctx, tx, nodeID, drainCommandID, false)
	return err
}

// StopForDrainRule is the standing rule of a drain with stop_workspaces,
// which the reconciler applies while nodeID stays DRAINING with the option
// under drainCommandID (fleet.Record.DrainCommandID): inside tx, the same
// stop as StopForDrain of every Workspace on nodeID desired RUNNING and
// AVAILABLE (or UNKNOWN over AVAILABLE) now — one that was CREATING or
// STARTING at drain time, or was started since — under
// DrainRuleStopCommandID(drainCommandID, workspace, its generation). It
// returns the IDs of the Workspaces it stopped; a stop recorded already is
// not repeated. The caller checks the node's record in the same tx,
// notifies the Workspaces' topics and kicks the reconciler after the commit.
func (s *Service) StopForDrainRule(ctx context.Context, tx store.Tx, nodeID, drainCommandID string) ([]string, error) {
	return s.stopForDrain(ctx, tx, nodeID, drainCommandID, true)
}

// DrainRuleDue reports whether StopForDrainRule would try to stop one of
// ws (rows of one node, read outside a transaction): one desired RUNNING
// and AVAILABLE, or UNKNOWN over AVAILABLE. It lets the reconciler skip
// the write transaction when nothing is due.
func DrainRuleDue(ws []*store.Workspace) bool {
	for _, w := range ws {
		if stoppableForDrain(w) {
			return true
		}
	}
	return false
}

// stoppableForDrain: desired RUNNING and AVAILABLE (or UNKNOWN over
// AVAILABLE), the only state whose normal stop the state rules admit.
func stoppableForDrain(w *store.Workspace) bool {
	if w.Power != store.PowerRunning || !w.DeletedAt.IsZero() {
		return false
	}
	st := ctrlv1.WorkspaceState(w.State)
	if st == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
		st = Underlying(w)
	}
	return st == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
}

func (s *Service) stopForDrain(ctx context.Context, tx store.Tx, nodeID, drainCommandID string, rule bool) ([]string, error) {
	on, err := tx.WorkspacesOnNode(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	now := s.now()
	var stopped []string
	for _, w := range on {
		if w.Power != store.PowerRunning {
			continue // stopping or deleting already, or stopped
		}
		id := DrainStopCommandID(drainCommandID, w.ID)
		what := "drained with stop_workspaces"
		if rule {
			if !stoppableForDrain(w) {
				continue // not AVAILABLE yet: a later pass
			}
			id = DrainRuleStopCommandID(drainCommandID, w.ID, w.Generation)
			what = "draining with stop_workspaces, and the workspace became AVAILABLE on it"
		}
		if err := tx.LockCommand(ctx, id); err != nil {
			return nil, err
		}
		if _, err := tx.GetCommand(ctx, id); err == nil {
			continue // started by this drain already
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		rec := &store.Command{ID: id, Method: DrainMethod, ObjectKind: ObjectKind, ObjectID: w.ID,
			Kind:      int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP),
			Initiator: int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_NODE_DRAIN), CreatedAt: now,
			Message: nodewire.Cut(fmt.Sprintf("node drain: node %s is %s (command %s); "+
				"a normal stop, as StopWorkspace would (writeback first)", nodeID, what, drainCommandID), store.MaxCommandMessage)}
		pub, err := s.AdmitCtrlStop(ctx, tx, rec, false)
		if fe, ok := fault.As(err); ok && fe.Kind == fault.KindFailedPrecondition {
			continue // not AVAILABLE: the state rules refuse a stop now
		}
		if err != nil {
			return nil, err
		}
		if rec.Result, err = proto.Marshal(&ctrlv1.StopWorkspaceResponse{Workspace: pub, Command: acceptance(rec)}); err != nil {
			return nil, err
		}
		if err := tx.InsertCommand(ctx, rec); err != nil {
			return nil, err
		}
		stopped = append(stopped, w.ID)
	}
	return stopped, nil
}
