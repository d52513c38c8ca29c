package reconciler

import (
	"context"
	"errors"
	"sort"

	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/lease"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// drainRules applies the standing rule of each drain with stop_workspaces:
// while a node stays DRAINING with the option, a Workspace on it that is
// AVAILABLE and desired RUNNING (CREATING or STARTING when the drain came,
// or started since) gets the drain's normal stop
// (workspace.StopForDrainRule). The nodes come from the cached fleet.View,
// so a pass with no node draining so costs nothing; a draining node costs
// one read of its Workspaces per pass, and a write transaction only when
// one of them is due. The transaction reads the node's record again and
// does nothing when the rule ended meanwhile (CancelNodeDrain, IsolateNode,
// DrainNode without the option); the stop's command ID is derived from the
// drain's and the Workspace's generation, so a second try — this loop's
// next pass or another replica's — finds it recorded and stops nothing.
// The transaction checks the fleet lease first (Config.Fence).
func (r *Reconciler) drainRules(ctx context.Context) error {
	type rule struct{ node, drain string }
	var rules []rule
	r.mu.Lock()
	for id, rec := range r.fleetView().Nodes {
		if rec.State == fleet.StateDraining && rec.DrainStopsWorkspaces && rec.DrainCommandID != "" {
			rules = append(rules, rule{id, rec.DrainCommandID})
		}
	}
	r.mu.Unlock()
	if len(rules) == 0 {
		return nil
	}
	sort.Slice(rules, func(i, j int) bool { return rules[i].node < rules[j].node })
	svc := &workspace.Service{Now: r.clock}
	var errs []error
	for _, ru := range rules {
		if !r.leads() {
			break // the fleet lease moved on: its holder applies the rules
		}
		var due bool
		if err := r.store.View(ctx, func(tx store.Tx) error {
			on, err := tx.WorkspacesOnNode(ctx, ru.node)
			due = workspace.DrainRuleDue(on)
			return err
		}); err != nil {
			errs = append(errs, err)
			continue
		}
		if !due {
			continue
		}
		var stopped []string
		ended := false
		err := r.store.InTx(ctx, func(tx store.Tx) error {
			stopped, ended = nil, false
			if err := r.fenced(ctx, tx); err != nil {
				return err
			}
			_, rec, err := fleet.GetRecord(ctx, tx, ru.node)
			switch {
			case errors.Is(err, store.ErrNotFound):
				ended = true
				return nil
			case err != nil:
				return err
			case rec.State != fleet.StateDraining || !rec.DrainStopsWorkspaces || rec.DrainCommandID != ru.drain:
				ended = true
				return nil
			}
			stopped, err = svc.StopForDrainRule(ctx, tx, ru.node, ru.drain)
			return err
		})
		if errors.Is(err, lease.ErrNotHeld) {
			break // the fleet lease moved on: nothing of this unit committed
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ended {
			r.mu.Lock()
			r.fleet.stale = true
			r.mu.Unlock()
			continue
		}
		for _, ws := range stopped {
			r.store.Notify(store.WorkspaceTopic(ws))
			r.log.Info("node drain: stopping a workspace that became AVAILABLE on a node draining with stop_workspaces",
				"node_id", ru.node, "workspace_id", ws, "drain_command_id", ru.drain)
		}
	}
	return errors.Join(errs...)
}
