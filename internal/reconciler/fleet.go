package reconciler

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// fleetReload is how often the loop reloads the fleet's records without
// being told (FleetChanged): what other replicas wrote reaches placement
// within it.
const fleetReload = time.Second

// fleetCache is the latest fleet.View the reconciler read. Placement
// filters and weighs candidates by it without reading any record; the one
// node a decision picks has its record read again inside the decision's
// transaction (placeable), so a stale view never places on a node that
// stopped being ACTIVE.
type fleetCache struct {
	view   *fleet.View
	loaded time.Time // by the monotonic wall clock, not Config.Now
	stale  bool      // reload at the next pass
}

// emptyView is the view before the first load: every node ACTIVE, the
// built-in defaults.
func emptyView() *fleet.View {
	return &fleet.View{Nodes: map[string]*fleet.Record{}, Defaults: fleet.BuiltinDefaults, Pools: map[string]uint64{}}
}

// loadFleet reads the fleet's records into the cache.
func (r *Reconciler) loadFleet(ctx context.Context) error {
	r.fleetLoads.Lock()
	defer r.fleetLoads.Unlock()
	var v *fleet.View
	if err := r.store.View(ctx, func(tx store.Tx) error {
		var err error
		v, err = fleet.Load(ctx, tx)
		return err
	}); err != nil {
		r.mu.Lock()
		r.fleet.stale = true
		r.mu.Unlock()
		return err
	}
	r.mu.Lock()
	r.fleet = fleetCache{view: v, loaded: time.Now()}
	r.mu.Unlock()
	return nil
}

// refreshFleet reloads the cache when it was marked stale, never loaded
// or, when aged, older than fleetReload.
func (r *Reconciler) refreshFleet(ctx context.Context, aged bool) error {
	r.mu.Lock()
	due := r.fleet.view == nil || r.fleet.stale || (aged && time.Since(r.fleet.loaded) >= fleetReload)
	r.mu.Unlock()
	if !due {
		return nil
	}
	return r.loadFleet(ctx)
}

// fleetView returns the cached view (never nil). Callers hold r.mu.
func (r *Reconciler) fleetView() *fleet.View {
	if r.fleet.view == nil {
		return emptyView()
	}
	return r.fleet.view
}

// FleetChanged reloads the fleet's records at once and wakes the loop: the
// hook NodeService calls after it committed a change of a node's state,
// overcommit, the defaults or a pool's capacity, so that the next
// placement honours it. A failed reload leaves the cache stale; the loop
// reloads it.
func (r *Reconciler) FleetChanged() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.loadFleet(ctx); err != nil {
		r.log.Warn("reload fleet records", "error", err.Error())
	}
	r.Kick()
}

// placeable reports, inside tx, whether node is still ACTIVE by its record
// (a node without one is). When it is not, the cache is marked stale.
func (r *Reconciler) placeable(ctx context.Context, tx store.Tx, node string) (bool, error) {
	_, rec, err := fleet.GetRecord(ctx, tx, node)
	switch {
	case err == nil && !rec.State.Placeable():
		r.mu.Lock()
		r.fleet.stale = true
		r.mu.Unlock()
		return false, nil
	case err == nil, errors.Is(err, store.ErrNotFound):
		return true, nil
	}
	return false, err
}

// EndKey ends what this ctrl holds open with the node key keyHash, already
// denied (store.DeniedNodeKey) in a transaction that committed: the node
// streams that came with it, and the data tunnels opened with it
// (Config.OnDenyNodeKey). RetireNode calls it after the commit that denies
// the retired node's key; DenyNodeKey is the denial and EndKey in one.
func (r *Reconciler) EndKey(keyHash []byte) {
	if len(keyHash) == 0 {
		return
	}
	if r.onDeny != nil {
		r.onDeny(keyHash)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, nc := range r.nodes {
		if bytes.Equal(nc.keyHash, keyHash) {
			nc.end(&fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied,
				Message: "the key of this certificate of node " + nc.id + " was revoked"})
			r.log.Warn("node key denied: stream ended", "node_id", nc.id)
		}
	}
}

// EndDataPlane ends the data-plane traffic this ctrl carries to node: its
// data tunnels close (Config.OnEndDataPlane), which ends every process
// stream, file transfer, port forward and log stream going through them.
// IsolateNode calls it after its commit; from then on the data plane
// refuses the node's Workspaces (internal/api), so the tunnels the node
// dials again carry nothing. The node's control stream stays: its
// Workspaces can still be stopped and deleted.
func (r *Reconciler) EndDataPlane(node string) {
	if r.onEndDataPlane != nil {
		r.onEndDataPlane(node)
	}
	r.log.Warn("data plane of node ended", "node_id", node)
}

// effectiveCapacity is node's capacity with its memory as placement
// accounts it: times the memory overcommit ratio that applies to it. Its
// CPU stays the real one: one Workspace never gets more than the node's
// CPU. Callers hold r.mu.
func (r *Reconciler) effectiveCapacity(node string) workspace.Capacity {
	c := r.caps[node]
	ratios, _ := r.fleetView().Ratios(node, r.agentRatio[node])
	c.MemoryMiB = fleet.Apply(c.MemoryMiB, ratios.Memory)
	return c
}
