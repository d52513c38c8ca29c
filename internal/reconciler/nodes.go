package reconciler

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// With several ctrl replicas, a node's stream goes to one of them, but
// every replica needs every node: admission's size and template checks
// (MaxCapacity, Template), the advertised capabilities, and on the fleet
// lease's holder silent-node detection and the reason of a placement that
// timed out. So each replica keeps every node's record, read from the
// store:
//
//   - after a commit that changed a node's record (a Hello's registration,
//     an Inventory) the replica that made it notifies store.NodesTopic,
//     which the PostgreSQL store carries to the other replicas; each marks
//     its node records stale, and its next pass reloads them (coalesced:
//     one reload a pass however many notifications came);
//   - they are reloaded anyway when older than nodeReload (the fallback
//     for a lost notification), and on the fleet lease's holder when
//     older than silenceReload, since it judges silence by the store's
//     last_seen: by reloadEvery, off the passes;
//   - a reload is one query of every node's ID, last_seen, epoch and
//     revision (store.Tx.NodeStates, no document), then the documents of
//     only the nodes whose revision changed (a heartbeat changes
//     last_seen, never the revision).

// nodeReload is how old the node records may get on a replica before a
// pass reloads them without a notification; silenceReload is that age on
// the fleet lease's holder.
const (
	nodeReload    = 10 * time.Second
	silenceReload = time.Second
)

// docBatch is the number of changed documents beyond which a reload reads
// every node (store.Tx.ListNodes) rather than each changed one.
const docBatch = 64

// storedNode is what the reconciler knows of a node's stored record.
type storedNode struct {
	lastSeen time.Time // the store's last_seen, as of loaded
	epoch    int64
	revision int64  // of the document read last; 0: never read
	pool     string // its Hello's storage pool
	// ended is the epoch of the node's last stream to this replica that
	// ended (0: none): while the stored epoch is not newer, no other
	// replica holds a newer stream of the node.
	ended int64
}

// nodeCache is the state of the node records' cache.
type nodeCache struct {
	loaded time.Time // by the monotonic wall clock, not Config.Now; zero: never
	stale  bool
}

// NodesChanged marks the node records stale and wakes the loop: another
// replica (or this one) committed a node's registration or inventory.
func (r *Reconciler) NodesChanged() {
	r.mu.Lock()
	r.nodeCache.stale = true
	r.mu.Unlock()
	r.wake()
}

// subscribeNodes subscribes to store.NodesTopic: Run calls it before its
// first load of the node records, so that a registration committed after
// that load cannot be missed, and hands the subscription to wakeOnNodes.
func (r *Reconciler) subscribeNodes() (<-chan struct{}, func()) {
	return r.store.Subscribe(store.NodesTopic)
}

// wakeOnNodes calls NodesChanged at each notification of store.NodesTopic
// until ctx ends, starting with the subscription changed. It subscribes
// again before it marks the records stale, so that a notification sent
// while the reload runs is not lost.
func (r *Reconciler) wakeOnNodes(ctx context.Context, changed <-chan struct{}, release func()) {
	for {
		select {
		case <-ctx.Done():
			release()
			return
		case <-changed:
			release()
			changed, release = r.subscribeNodes()
			r.NodesChanged()
		}
	}
}

// nodesChangedHere notifies every replica, this one included, that a
// node's record changed (after its commit).
func (r *Reconciler) nodesChangedHere() { r.store.Notify(store.NodesTopic) }

// refreshNodes reloads the node records when stale, never loaded or, when
// aged, older than their bound (nodeReload; silenceReload on the lease's
// holder).
func (r *Reconciler) refreshNodes(ctx context.Context, aged, leads bool) error {
	bound := nodeReload
	if leads {
		bound = silenceReload
	}
	r.mu.Lock()
	due := r.nodeCache.stale || r.nodeCache.loaded.IsZero() || (aged && time.Since(r.nodeCache.loaded) >= bound)
	r.nodeCache.stale = false
	r.mu.Unlock()
	if !due {
		return nil
	}
	if err := r.loadNodes(ctx); err != nil {
		r.mu.Lock()
		r.nodeCache.stale = true
		r.mu.Unlock()
		return err
	}
	return nil
}

// LoadNodes reads the node records once, now: ctrl calls it before it
// serves, so that a replica just started answers what needs a node (the
// capabilities, admission's size and template checks) from its first
// request; Run loads them again (cheaply: only what changed) and keeps
// them.
func (r *Reconciler) LoadNodes(ctx context.Context) error { return r.loadNodes(ctx) }

// loadNodes reads every node's state and the documents of those whose
// revision changed since they were read, in one store view, and learns
// them: capacity, templates, features, overcommit ratio, pool, the store's
// last_seen and epoch. A stream this ctrl holds whose epoch the stored one
// passed is superseded: the node connected again, to another replica.
func (r *Reconciler) loadNodes(ctx context.Context) error {
	r.nodeLoads.Lock()
	defer r.nodeLoads.Unlock()
	started := time.Now()
	var states []store.NodeState
	var docs []*store.Node
	err := r.store.View(ctx, func(tx store.Tx) error {
		var err error
		if states, err = tx.NodeStates(ctx); err != nil {
			return err
		}
		var changed []string
		r.mu.Lock()
		for _, s := range states {
			if k, ok := r.stored[s.ID]; !ok || k.revision != s.Revision {
				changed = append(changed, s.ID)
			}
		}
		r.mu.Unlock()
		docs = docs[:0]
		if len(changed) > docBatch {
			docs, err = tx.ListNodes(ctx)
			return err
		}
		for _, id := range changed {
			n, err := tx.GetNode(ctx, id)
			if err != nil {
				return err
			}
			docs = append(docs, n)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var superseded []*nodeConn
	r.mu.Lock()
	for _, n := range docs {
		k := r.stored[n.ID]
		if k.revision == n.Revision {
			continue
		}
		k.revision = n.Revision
		r.caps[n.ID] = workspace.Capacity{MemoryMiB: n.MemoryMiB, CPUMillis: n.CPUMillis, StorageBytes: n.StorageBytes}
		hello := &nodev1.Hello{}
		if err := proto.Unmarshal(n.Doc, hello); err == nil {
			r.templates[n.ID] = templateMap(hello.GetTemplates())
			r.features[n.ID] = featureSet(hello.GetFeatures())
			r.agentRatio[n.ID] = hello.GetCapacity().GetMemoryOvercommitRatio()
			k.pool = hello.GetCapacity().GetStoragePool()
		}
		r.stored[n.ID] = k
	}
	now := r.now()
	for _, s := range states {
		k := r.stored[s.ID]
		k.lastSeen, k.epoch = s.LastSeen, s.Epoch
		r.stored[s.ID] = k
		if now.Sub(s.LastSeen) <= r.nodeGrace {
			delete(r.quiet, s.ID) // heard again (by any replica): judged again when silent
		}
		if nc := r.nodes[s.ID]; nc != nil && s.Epoch > nc.epoch {
			superseded = append(superseded, nc)
		}
	}
	r.nodeCache.loaded = started
	r.mu.Unlock()
	for _, nc := range superseded {
		r.supersede(nc)
	}
	return nil
}

// supersede ends nc's stream, which a newer connection of its node
// replaced (a higher epoch in the store): the writes of its messages would
// be refused anyway. The node, if it is still there, connects again.
func (r *Reconciler) supersede(nc *nodeConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes[nc.id] != nc {
		return
	}
	nc.end(&fault.Error{Kind: fault.KindUnavailable, Reason: fault.ReasonNodeUnreachable, Retryable: true,
		Message: "a newer connection of node " + nc.id + " superseded this stream"})
	r.log.Warn("node stream superseded by a newer connection of the node", "node_id", nc.id, "epoch", nc.epoch)
}

// superseded reports whether the node records, as last reloaded, hold a
// connection epoch of nc's node newer than nc's: a message on nc is then
// dropped (a report, a VolumeReport, a memory condition), not applied.
// The reload follows the registering commit's notification, so the window
// in which a superseded stream's messages still apply is that of the
// notification (milliseconds), at most the reload bound when it is lost;
// heartbeats, Inventories and execution reports check the stored epoch in
// their transaction.
func (r *Reconciler) superseded(nc *nodeConn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stored[nc.id].epoch > nc.epoch
}

// storeSeen is when node was last seen: the later of the store's last_seen
// (any replica's stream) and the last message of this ctrl's stream.
// Callers hold r.mu.
func (r *Reconciler) storeSeen(id string) time.Time {
	seen := r.stored[id].lastSeen
	if nc := r.nodes[id]; nc != nil && nc.lastSeen.After(seen) {
		seen = nc.lastSeen
	}
	return seen
}

// Connected reports whether node holds a stream to some ctrl replica: to
// this one, or heard by another within the node grace (its last_seen in
// the store, as of the last reload of the node records). A node whose
// stream to another replica just ended counts as connected until the
// grace has passed, as it does for silence detection; one whose latest
// stream was to this replica and ended, or that is RETIRED, is not.
func (r *Reconciler) Connected(node string) bool {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes[node] != nil {
		return true
	}
	return r.heardElsewhere(node, r.stored[node], now)
}

// heardElsewhere reports whether node, whose stream this ctrl does not
// hold and whose stored record is k, holds one to another replica as far
// as this ctrl can tell: it is not RETIRED, its latest stream was not to
// this ctrl (ended since), and the store heard from it within the grace
// at now. Callers hold r.mu.
func (r *Reconciler) heardElsewhere(node string, k storedNode, now time.Time) bool {
	if r.fleetView().State(node) == fleet.StateRetired {
		return false
	}
	if k.ended != 0 && k.epoch <= k.ended {
		return false // its latest stream was to this replica, and ended
	}
	return !k.lastSeen.IsZero() && now.Sub(k.lastSeen) <= r.nodeGrace
}
