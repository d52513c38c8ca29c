package reconciler

import (
	"context"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
)

// Helpers of the placement tests: placement itself weighs the reachable
// nodes (reachable), those connected to any replica.

// connected returns the connected nodes in ID order, without their usage,
// with their fleet state and overcommit ratios from the cached view.
func (r *Reconciler) connected() []candidate {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.nodes))
	for id := range r.nodes {
		ids = append(ids, id)
	}
	return r.candidates(ids)
}

// choose picks a node for pub among the connected ones (see pick); it is
// one decision of a decider (newDecider).
func (r *Reconciler) choose(ctx context.Context, tx store.Tx, pub *ctrlv1.Workspace) (*candidate, string, error) {
	d, err := r.newDecider(ctx, tx, r.connected())
	if err != nil {
		return nil, "", err
	}
	c, _, reason, err := d.decide(ctx, tx, pub)
	return c, reason, err
}
