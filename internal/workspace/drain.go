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
// rules refuse, is left running as it is: nothing is written for it. The
// stops already recorded under these IDs are found again and not repeated,
// so a resend of the drain changes nothing. After the commit the caller
// kicks the reconciler, which sends the stops to the node (NodeService's
// Changed hook does: Reconciler.FleetChanged); waiters of a superseded
// command see it at their next re-read of the store.
func (s *Service) StopForDrain(ctx context.Context, tx store.Tx, nodeID, drainCommandID string) error {
	on, err := tx.WorkspacesOnNode(ctx, nodeID)
	if err != nil {
		return err
	}
	now := s.now()
	for _, w := range on {
		if w.Power != store.PowerRunning {
			continue // stopping or deleting already, or stopped
		}
		id := DrainStopCommandID(drainCommandID, w.ID)
		if err := tx.LockCommand(ctx, id); err != nil {
			return err
		}
		if _, err := tx.GetCommand(ctx, id); err == nil {
			continue // started by this drain already
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		rec := &store.Command{ID: id, Method: DrainMethod, ObjectKind: ObjectKind, ObjectID: w.ID,
			Kind:      int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP),
			Initiator: int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_NODE_DRAIN), CreatedAt: now,
			Message: nodewire.Cut(fmt.Sprintf("node drain: node %s is drained with stop_workspaces (command %s); "+
				"a normal stop, as StopWorkspace would (writeback first)", nodeID, drainCommandID), store.MaxCommandMessage)}
		pub, err := s.AdmitCtrlStop(ctx, tx, rec, false)
		if fe, ok := fault.As(err); ok && fe.Kind == fault.KindFailedPrecondition {
			continue // not AVAILABLE: the state rules refuse a stop now
		}
		if err != nil {
			return err
		}
		if rec.Result, err = proto.Marshal(&ctrlv1.StopWorkspaceResponse{Workspace: pub, Command: acceptance(rec)}); err != nil {
			return err
		}
		if err := tx.InsertCommand(ctx, rec); err != nil {
			return err
		}
	}
	return nil
}
