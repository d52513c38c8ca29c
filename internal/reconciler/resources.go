package reconciler

import (
	"context"
	"errors"
	"fmt"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// beyondNode says why the resources demanded (memory in MiB, CPU in
// millicores) exceed everything node capacity c has (its memory times its
// overcommit ratio, effectiveCapacity), "" when they fit.
func beyondNode(node string, c workspace.Capacity, memoryMiB, cpuMillis uint64) string {
	switch {
	case c.MemoryMiB == 0 && c.CPUMillis == 0:
		return "" // capacity unknown: the node judges
	case memoryMiB > c.MemoryMiB:
		return fmt.Sprintf("node %q, which holds this workspace's writable layer, offers %d MiB of memory; the workspace requests %d MiB", node, c.MemoryMiB, memoryMiB)
	case cpuMillis > c.CPUMillis:
		return fmt.Sprintf("node %q, which holds this workspace's writable layer, offers %d millicores; the workspace requests %d", node, c.CPUMillis, cpuMillis)
	}
	return ""
}

// refuseOversized fails the pending start of a placed Workspace whose
// resources (changed by UpdateWorkspaceMemory or UpdateWorkspaceCpu while
// it was stopped: capacity is judged by the start, seed 000) exceed all
// that its node offers: the start could never run there, and its writable
// layer keeps the Workspace on that node. The start completes at once like
// a placement that found no room (resource_exhausted, CAPACITY_EXHAUSTED,
// stage placement) and the Workspace is FAILED holding no execution, which
// admits a lower value and a new start. It reports whether it failed the
// start (then w must not be pushed). Other pending Workspaces cost one
// decode and no store access.
func (r *Reconciler) refuseOversized(ctx context.Context, w *store.Workspace) (bool, error) {
	if w.NodeID == "" || w.Power != store.PowerRunning || w.CommandID == "" || w.ObservedGeneration >= w.Generation {
		return false, nil
	}
	r.mu.Lock()
	c := r.effectiveCapacity(w.NodeID)
	r.mu.Unlock()
	pub, err := workspace.Decode(w)
	if err != nil {
		return false, nil // push logs the row that does not decode
	}
	res := pub.GetResources()
	if beyondNode(w.NodeID, c, uint64(res.GetMemoryMib()), uint64(res.GetCpuMillis())) == "" {
		return false, nil
	}
	failed := false
	err = r.store.InTx(ctx, func(tx store.Tx) error {
		failed = false
		w, err := tx.GetWorkspace(ctx, w.ID)
		if err != nil {
			return err
		}
		if w.NodeID == "" || w.Power != store.PowerRunning || w.CommandID == "" || w.ObservedGeneration >= w.Generation {
			return nil
		}
		rec, err := tx.GetCommand(ctx, w.CommandID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if ctrlv1.WorkspaceCommandKind(rec.Kind) != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_START {
			return nil
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		res := pub.GetResources()
		reason := beyondNode(w.NodeID, c, uint64(res.GetMemoryMib()), uint64(res.GetCpuMillis()))
		if reason == "" {
			return nil
		}
		now := r.now()
		fe := placementFailure(reason + "; lower it (UpdateWorkspaceMemory, UpdateWorkspaceCpu) and start again")
		pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, false
		pub.Failure = fe.Detail()
		w.ObservedGeneration, w.ObservedState = w.Generation, store.ExecFailed
		if err := complete(ctx, tx, w, pub, fe, now); err != nil {
			return err
		}
		failed = true
		return saveRow(ctx, tx, w, pub, now)
	})
	if err != nil || !failed {
		return false, err
	}
	r.store.Notify(store.WorkspaceTopic(w.ID))
	return true, nil
}
