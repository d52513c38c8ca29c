package reconciler

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/lease"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/volume"
	"github.com/kibotos/kibotos/internal/workspace"
)

// candidate is a connected node as placement sees it.
type candidate struct {
	id        string
	capacity  workspace.Capacity
	templates map[string]string // template → version
	pool      string            // the storage pool its Workspaces go to
	usedMiB   uint64            // memory of its Workspaces desired RUNNING
	usedCPU   uint64            // CPU (millicores) of its Workspaces desired RUNNING
	network   bool              // it serves workspace networks
	artifacts bool              // it fetches published Templates (nodewire.FeatureArtifacts)
	// state is its fleet state: only an ACTIVE node takes new Workspaces.
	state fleet.State
	// ratios are the overcommit ratios that apply to it (fleet.View.Ratios);
	// below 1 counts as 1.
	ratios fleet.Ratios
	// freeBytes is what its storage pool has not promised yet, its
	// capacity the operator's override when smaller than reported
	// (fleet.View.PoolCapacity), when storageKnown.
	freeBytes    uint64
	storageKnown bool
	// local: its stream is to this replica, which pushes it the placement
	// itself (the others' nodes hear of it through their replica).
	local bool
}

// memoryLimit is the memory (MiB) the Workspaces desired RUNNING on c may
// take together: its capacity times its memory ratio.
func (c *candidate) memoryLimit() uint64 { return fleet.Apply(c.capacity.MemoryMiB, c.ratios.Memory) }

// cpuLimit is the CPU (millicores) the Workspaces desired RUNNING on c may
// take together: its capacity times its CPU ratio.
func (c *candidate) cpuLimit() uint64 { return fleet.Apply(c.capacity.CPUMillis, c.ratios.CPU) }

// freeMiB is the memory c can still admit.
func (c *candidate) freeMiB() uint64 {
	if l := c.memoryLimit(); l > c.usedMiB {
		return l - c.usedMiB
	}
	return 0
}

// fits reports whether c has the memory and CPU d asks for: its memory and
// CPU on top of what the node's running Workspaces take, within the
// overcommitted limits, and never more CPU than the node has.
func (c *candidate) fits(d demand) bool {
	return c.usedMiB+d.memoryMiB <= c.memoryLimit() && c.usedCPU+d.cpuMillis <= c.cpuLimit() &&
		d.cpuMillis <= c.capacity.CPUMillis
}

// demand is what a Workspace asks of its node.
type demand struct {
	template string
	// version is the template version it was created from; published,
	// it is a published version (a template other than the node-built
	// default), which any node fetching artifacts can run.
	version   string
	published bool
	memoryMiB uint64
	cpuMillis uint64
	network   bool // its policy is PUBLIC_INTERNET: only a node that serves networks
	// storageBytes is what it takes from the pool: its writable layer, and
	// the Volume of a NEW binding not placed yet.
	storageBytes uint64
	// node, when set, is the only node that can run it: the one holding
	// its Volume.
	node string
}

func demandOf(pub *ctrlv1.Workspace) demand {
	t := pub.GetTemplate()
	return demand{
		template:  t.GetTemplateId(),
		version:   t.GetVersion(),
		published: t.GetTemplateId() != workspace.DefaultTemplate && t.GetVersion() != "",
		memoryMiB: uint64(pub.GetResources().GetMemoryMib()),
		cpuMillis: uint64(pub.GetResources().GetCpuMillis()),
		network:   pub.GetNetworkPolicy().GetMode() == ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET,

		storageBytes: pub.GetWritableLayer().GetCapacityBytes(),
	}
}

// holds reports whether c can run d's template: it holds it (the node
// built it: the default, whatever version it holds), or the template is a
// published version, which a node that fetches artifacts gets before it
// starts the Workspace.
func (c *candidate) holds(d demand) bool {
	if d.published {
		return c.artifacts || (hasKey(c.templates, d.template) && c.templates[d.template] == d.version)
	}
	return hasKey(c.templates, d.template)
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

// serves reports whether c can run what d asks for, capacity aside.
func (c *candidate) serves(d demand) bool {
	return c.holds(d) && (c.network || !d.network)
}

// pick chooses among the connected nodes an ACTIVE one (fleet.State) that
// holds the template (or fetches it: a published version), serves networks
// when the Workspace's policy is PUBLIC_INTERNET, has room in its storage
// pool, fits the demand (candidate.fits) and has the most free memory;
// ties go to the first in nodes. A node whose stream is to this replica
// (local) is preferred to the others while it has at least half the free
// memory of the one with the most (localShare): its placement then reaches
// it without crossing to another replica. It returns nil with the reason
// when nodes exist but none fits — naming the nodes' states when only
// nodes that are not ACTIVE could take it — nil and "" when nodes is empty.
func pick(nodes []candidate, d demand) (*candidate, string) {
	if len(nodes) == 0 {
		return nil, ""
	}
	var best, bestLocal *candidate
	var blocked, inactive []*candidate // not ACTIVE: could take it / any
	active, holders, networked, stored := 0, 0, 0, 0
	if d.node != "" && !slices.ContainsFunc(nodes, func(c candidate) bool { return c.id == d.node }) {
		return nil, "" // the node holding its Volume is not connected
	}
	for i := range nodes {
		c := &nodes[i]
		if d.node != "" && c.id != d.node {
			continue
		}
		if !c.state.Placeable() {
			inactive = append(inactive, c)
			if c.serves(d) && (!c.storageKnown || c.freeBytes >= d.storageBytes) && c.fits(d) {
				blocked = append(blocked, c)
			}
			continue
		}
		active++
		if !c.holds(d) {
			continue
		}
		holders++
		if !c.serves(d) {
			continue
		}
		networked++
		if c.storageKnown && c.freeBytes < d.storageBytes {
			continue
		}
		stored++
		if !c.fits(d) {
			continue
		}
		if best == nil || c.freeMiB() > best.freeMiB() {
			best = c
		}
		if c.local && (bestLocal == nil || c.freeMiB() > bestLocal.freeMiB()) {
			bestLocal = c
		}
	}
	switch {
	case bestLocal != nil && bestLocal.freeMiB() >= best.freeMiB()/localShare:
		return bestLocal, ""
	case best != nil:
		return best, ""
	case len(blocked) > 0:
		return nil, "only nodes that are not ACTIVE could hold this workspace, and no new workspace is placed on them: " + states(blocked)
	case active == 0 && d.node != "":
		return nil, "node " + strconv.Quote(d.node) + ", which holds this workspace's volume, is " + strings.ToLower(string(inactive[0].state)) +
			": no new workspace is placed on it"
	case active == 0:
		return nil, "no connected node is ACTIVE: " + states(inactive)
	case holders == 0 && d.published:
		return nil, "no connected ACTIVE node fetches published templates (feature " + nodewire.FeatureArtifacts + ") or holds template " +
			strconv.Quote(d.template) + " version " + strconv.Quote(d.version)
	case holders == 0:
		return nil, "no connected node holds template " + strconv.Quote(d.template)
	case networked == 0:
		return nil, "no connected node that holds template " + strconv.Quote(d.template) +
			" serves workspace networks, which this workspace's PUBLIC_INTERNET policy needs"
	case stored == 0 && d.node != "":
		return nil, "node " + strconv.Quote(d.node) + ", which holds this workspace's volume, has no room in its storage pool for the writable layer"
	case stored == 0:
		return nil, "no connected node that can run this workspace has room in its storage pool for its writable layer (and new volume)"
	}
	return nil, "no connected node has the memory and CPU this workspace requests"
}

// localShare bounds how much emptier than every node of this replica
// another replica's node may be and still lose to one of them (pick): a
// factor of the free memory. With clients spread over the replicas their
// nodes fill alike; with every client on one replica, its nodes fill to
// where they have half the free memory of the others, and the others take
// their share from then on.
const localShare = 2

// states lists nodes with their states: `node "a" is draining, node "b"
// is isolated`, at most five, then how many more.
func states(nodes []*candidate) string {
	const most = 5
	var b strings.Builder
	for i, c := range nodes {
		if i == most {
			b.WriteString(", and " + strconv.Itoa(len(nodes)-most) + " more")
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("node " + strconv.Quote(c.id) + " is " + strings.ToLower(string(c.state)))
	}
	return b.String()
}

// placementFailure is the failure of a Workspace that waited longer than
// the placement timeout: capacity exhausted when nodes refused it for
// reason, a retryable unavailability when no node was connected.
func placementFailure(reason string) *fault.Error {
	if reason == "" {
		return &fault.Error{Kind: fault.KindUnavailable, Reason: fault.ReasonNodeUnreachable, Retryable: true, Stage: "placement",
			Message: "no node is connected to place the workspace on"}
	}
	return &fault.Error{Kind: fault.KindResourceExhausted, Reason: fault.ReasonCapacityExhausted, Stage: "placement", Message: reason}
}

// reachable returns, in ID order, without their usage, with their fleet
// state and overcommit ratios from the cached view, the nodes that
// hold a stream to some ctrl replica (Connected): those connected to this
// ctrl, and the others heard from within the grace at now by the store's
// last_seen (as of the last reload of the node records), except those
// whose latest stream was to this ctrl and ended: placement weighs them
// all.
func (r *Reconciler) reachable(now time.Time) []candidate {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id, k := range r.stored {
		if _, here := r.nodes[id]; !here && r.heardElsewhere(id, k, now) {
			ids = append(ids, id)
		}
	}
	for id := range r.nodes {
		ids = append(ids, id)
	}
	return r.candidates(ids)
}

// candidates are the nodes ids as placement sees them, in ID order.
// Callers hold r.mu.
func (r *Reconciler) candidates(ids []string) []candidate {
	v := r.fleetView()
	slices.Sort(ids) // the IDs, not the larger candidates
	out := make([]candidate, len(ids))
	for i, id := range ids {
		ratios, _ := v.Ratios(id, r.agentRatio[id])
		f := r.features[id]
		var pool string
		if nc := r.nodes[id]; nc != nil {
			pool = nc.pool
		} else {
			pool = r.stored[id].pool
		}
		out[i] = candidate{id: id, capacity: r.caps[id], templates: r.templates[id], pool: pool,
			network: f[nodewire.FeatureNetwork], artifacts: f[nodewire.FeatureArtifacts],
			state: v.State(id), ratios: ratios, local: r.nodes[id] != nil}
	}
	return out
}

// decider makes the placement decisions of one transaction among nodes,
// built once for all of them (building and weighing a candidate for every
// node was most of a placement's cost with 1,000 nodes). It weighs the
// candidates by what their Workspaces ask of them: the memory and CPU of
// those desired RUNNING and the writable layers of all
// (store.Tx.NodeUsages), and the Volumes of their pools. Those sums come
// from the usage cache (read at most once a second, one read of an index
// for all nodes) and are never trusted for a decision itself: the node
// picked has its own sums read again in tx (store.Tx.NodeUsage) and is
// taken only if it still fits; a decision that finds no node, or whose
// picks keep failing that check, reads every node's sums in tx and decides
// on them, as do the decisions after it. A Workspace bound to a Volume
// weighs only the Volume's node, read in tx. What each placement takes is
// added (took) before the next decision. The fleet's records come from the
// cached view; the pool overrides bound the pools' capacity.
//
// The usage cache learns what the decider read and placed only after the
// transaction committed (learn): a transaction tried again or rolled back
// leaves it as it was.
type decider struct {
	r         *Reconciler
	nodes     []candidate
	view      *fleet.View
	volumeUse map[string]uint64 // by node, what its Volumes take from its pool
	usage     map[string]store.NodeUsage
	fresh     bool            // usage was read in tx
	touched   map[string]bool // nodes whose usage the decider read in tx or placed on
}

// newDecider weighs nodes as of tx.
func (r *Reconciler) newDecider(ctx context.Context, tx store.Tx, nodes []candidate) (*decider, error) {
	volumeUse, err := volume.PoolUsage(ctx, tx)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	view := r.fleetView()
	var usage map[string]store.NodeUsage
	if r.usage.m != nil && time.Since(r.usage.loaded) < usageStale {
		usage = maps.Clone(r.usage.m)
	}
	r.usage.used = time.Now()
	r.mu.Unlock()
	d := &decider{r: r, nodes: nodes, view: view, volumeUse: volumeUse, usage: usage, touched: map[string]bool{}}
	if usage == nil {
		if err := d.reload(ctx, tx); err != nil {
			return nil, err
		}
	}
	for i := range d.nodes {
		d.fill(&d.nodes[i])
	}
	return d, nil
}

// reload reads every node's sums in tx.
func (d *decider) reload(ctx context.Context, tx store.Tx) error {
	m, err := tx.NodeUsages(ctx)
	if err != nil {
		return err
	}
	d.usage, d.fresh = m, true
	return nil
}

// fill sets c's use and free storage from the decider's sums.
func (d *decider) fill(c *candidate) {
	u := d.usage[c.id]
	c.storageKnown, c.freeBytes = false, 0
	if size := d.view.PoolCapacity(c.id, c.pool, c.capacity.StorageBytes); size > 0 {
		c.storageKnown, c.freeBytes = true, volume.Free(size, d.volumeUse[c.id], u.LayerBytes)
	}
	c.usedMiB, c.usedCPU = u.RunningMemoryMiB, u.RunningCPUMillis
}

// decide picks a node for pub (see pick), or returns why none fits; dm is
// what pub asks of the node picked, its Volume included.
func (d *decider) decide(ctx context.Context, tx store.Tx, pub *ctrlv1.Workspace) (c *candidate, dm demand, reason string, err error) {
	dm = demandOf(pub)
	node, extra, err := volumeDemand(ctx, tx, pub)
	if err != nil {
		return nil, dm, "", err
	}
	dm.node, dm.storageBytes = node, dm.storageBytes+extra
	if dm.node != "" {
		// One node: its own sums, read in tx.
		for i := range d.nodes {
			if c := &d.nodes[i]; c.id == dm.node && c.serves(dm) {
				if err := d.check(ctx, tx, c); err != nil {
					return nil, dm, "", err
				}
			}
		}
		c, reason := pick(d.nodes, dm)
		return c, dm, reason, nil
	}
	for tries := 0; ; tries++ {
		c, reason := pick(d.nodes, dm)
		if d.fresh {
			return c, dm, reason, nil // decided on sums read in tx
		}
		if c != nil && tries < 3 {
			before := d.usage[c.id]
			if err := d.check(ctx, tx, c); err != nil {
				return nil, dm, "", err
			}
			if d.usage[c.id] == before {
				return c, dm, "", nil
			}
			if (!c.storageKnown || c.freeBytes >= dm.storageBytes) && c.fits(dm) {
				return c, dm, "", nil // still fits, though another may have more room now
			}
			continue // it does not fit after all: pick again
		}
		// No node by the cache, or picks that kept failing: decide on every
		// node's sums read in tx.
		if err := d.reload(ctx, tx); err != nil {
			return nil, dm, "", err
		}
		for i := range d.nodes {
			d.fill(&d.nodes[i])
		}
	}
}

// check reads c's sums in tx and weighs it by them.
func (d *decider) check(ctx context.Context, tx store.Tx, c *candidate) error {
	u, err := tx.NodeUsage(ctx, c.id)
	if err != nil {
		return err
	}
	d.usage[c.id], d.touched[c.id] = u, true
	d.fill(c)
	return nil
}

// took adds to c what w, just placed on it, takes (its query columns as
// saved; dm.storageBytes beyond its writable layer is its new Volume), so
// that the next decisions weigh c with it.
func (d *decider) took(c *candidate, w *store.Workspace, dm demand) {
	u := d.usage[c.id]
	u.LayerBytes += w.LayerBytes
	if w.Power == store.PowerRunning {
		u.RunningMemoryMiB += w.MemoryMiB
		u.RunningCPUMillis += w.CPUMillis
	}
	d.usage[c.id], d.touched[c.id] = u, true
	if dm.storageBytes > w.LayerBytes {
		d.volumeUse[c.id] += dm.storageBytes - w.LayerBytes
	}
	d.fill(c)
}

// learn puts into the usage cache what the decider read and placed, once
// its transaction committed: every node's sums when it read them all, and
// those of the nodes it checked or placed on, which a load of the cache
// running meanwhile keeps over what it read (recent).
func (d *decider) learn() {
	r := d.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if d.fresh {
		r.usage.m, r.usage.loaded = d.usage, time.Now()
	} else if r.usage.m == nil {
		return
	}
	for id := range d.touched {
		r.usage.m[id] = d.usage[id]
		if r.usage.recent != nil {
			r.usage.recent[id] = d.usage[id]
		}
	}
}

// usageReload is how old the usage cache gets before reloadEvery reads
// every node's sums again, while placement uses it (within usageKeep of
// its last use); usageStale is how old it may get before a placement reads
// them itself (preloadUsage), and before the decider trusts it no more and
// reads them in its transaction.
const (
	usageReload = time.Second
	usageKeep   = 10 * time.Second
	usageStale  = 3 * usageReload
)

// usageCache is every node's use as last read (store.Tx.NodeUsages).
type usageCache struct {
	m      map[string]store.NodeUsage
	loaded time.Time // by the monotonic wall clock, not Config.Now
	used   time.Time // when a placement last weighed nodes with it
	// recent, while a load of the cache runs (loadUsage), holds what the
	// placements learnt meanwhile, newer than what the load may read.
	recent map[string]store.NodeUsage
}

// refreshUsage reloads the usage cache when placement used it within
// usageKeep and it is older than usageReload: reloadEvery calls it, so
// that the read of every node's sums (50 ms at 100,000 Workspaces) is
// made beside the passes, and a pass placing the Workspace a client waits
// for does not wait for it too.
func (r *Reconciler) refreshUsage(ctx context.Context) {
	r.mu.Lock()
	used := r.usage.m != nil && time.Since(r.usage.used) < usageKeep
	r.mu.Unlock()
	if used {
		r.loadUsage(ctx, usageReload)
	}
}

// preloadUsage reads every node's sums, before a placement transaction
// begins, when the usage cache is missing or older than usageStale (the
// first placement, or reloadEvery behind or not running).
func (r *Reconciler) preloadUsage(ctx context.Context) { r.loadUsage(ctx, usageStale) }

// loadUsage reads every node's sums into the usage cache, when it is
// missing or older than age, in a read-only view, never in a placement
// transaction: that read of the whole index then holds neither the
// writer of an SQLite store, nor SSI read locks over the whole index in the
// serializable placement transaction, where every write of a report on
// any node conflicted with them. The decider trusts the cache for no
// decision (it reads the node picked again in its transaction). Loads run
// one at a time, and one that waited for another finds the cache fresh and
// reads nothing. What placements learnt while the view ran is newer than
// it and kept. When the view fails, the cache stays as it was; a decider
// that finds it too old reads every node's sums in its transaction.
func (r *Reconciler) loadUsage(ctx context.Context, age time.Duration) {
	r.usageLoads.Lock()
	defer r.usageLoads.Unlock()
	started := time.Now()
	r.mu.Lock()
	if r.usage.m != nil && started.Sub(r.usage.loaded) < age {
		r.mu.Unlock()
		return
	}
	r.usage.recent = map[string]store.NodeUsage{}
	r.mu.Unlock()
	var m map[string]store.NodeUsage
	err := r.store.View(ctx, func(tx store.Tx) error {
		var err error
		m, err = tx.NodeUsages(ctx)
		return err
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	recent := r.usage.recent
	r.usage.recent = nil
	if err != nil {
		return
	}
	maps.Copy(m, recent)
	r.usage.m, r.usage.loaded = m, started
}

// placement is what placing one Workspace came to.
type placement struct {
	placed    *store.Workspace // the row placed, nil when not
	completed bool             // its command completed (deleted before placement, or failed)
	// late: it waited past the placement timeout without a node, and this
	// ctrl holds the fleet lease: place decides on it alone, in a
	// transaction fenced by the lease.
	late bool
}

// place chooses a node for an unplaced Workspace among the nodes connected
// to any replica (reachable: their capacity, templates, features, fleet
// state and usage), or fails its command when none can hold it after the
// placement timeout, for the fleet's reason (capacity, templates, states;
// NODE_UNREACHABLE only when no node anywhere was heard from within the
// grace). Placing is the work of the replica that admitted the command,
// then of the fleet lease's holder (placePending), which alone fails a
// placement: the failure's transaction checks the lease first
// (Config.Fence). A placement itself needs no fence: the
// transaction re-reads the row, so a replica that lost the lease and
// places all the same places a Workspace nobody placed, once. It returns
// the placed row (nil when not placed) and whether a command completed.
func (r *Reconciler) place(ctx context.Context, nodes []candidate, id string) (*store.Workspace, bool, error) {
	if nodes == nil {
		nodes = r.reachable(r.now())
	}
	r.preloadUsage(ctx)
	var p placement
	var d *decider
	err := r.store.InTx(ctx, func(tx store.Tx) error {
		var err error
		if d, err = r.newDecider(ctx, tx, slices.Clone(nodes)); err != nil {
			return err
		}
		p, err = r.placeIn(ctx, tx, d, id, true)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	d.learn()
	return p.placed, p.completed, nil
}

// placeBatch places the Workspaces ids as place does, in one transaction
// whose decisions share one decider: a pass with hundreds to place
// commits once per batch, not once per Workspace (one placement per
// commit, in series, held bench/hollow's creates to about 175/s). The
// ones that waited past the placement timeout are then decided each
// alone by place, whose failure is fenced by the fleet lease: a lease
// lost, or any error there, leaves that one to the next pass and undoes
// nothing of the batch.
func (r *Reconciler) placeBatch(ctx context.Context, nodes []candidate, ids []string, tr *passTrace) ([]placement, error) {
	if nodes == nil {
		nodes = r.reachable(r.now())
	}
	r.preloadUsage(ctx)
	var out []placement
	var d *decider
	called, attempts := time.Now(), 0
	var first time.Time
	err := r.store.InTx(ctx, func(tx store.Tx) error {
		if attempts++; attempts == 1 {
			first = time.Now()
		}
		out = make([]placement, len(ids))
		var err error
		if d, err = r.newDecider(ctx, tx, slices.Clone(nodes)); err != nil {
			return err
		}
		for i, id := range ids {
			if out[i], err = r.placeIn(ctx, tx, d, id, false); err != nil {
				return err
			}
		}
		return nil
	})
	tr.batch(len(ids), attempts, called, first)
	if err != nil {
		return nil, err
	}
	d.learn()
	for i, p := range out {
		if !p.late {
			continue
		}
		placed, completed, err := r.place(ctx, nodes, ids[i])
		switch {
		case errors.Is(err, lease.ErrNotHeld):
			out[i] = placement{} // the fleet lease moved on: its holder fails it
		case err != nil:
			// The batch committed: its results stand; the next pass
			// decides on this one again.
			out[i] = placement{}
			if ctx.Err() == nil {
				r.log.Warn("place workspace past its placement timeout", "workspace_id", ids[i], "error", err.Error())
			}
		default:
			out[i] = placement{placed: placed, completed: completed}
		}
	}
	return out, nil
}

// placeIn is one placement of place or placeBatch, in tx with d. Past the
// placement timeout, it fails the Workspace when fail, else reports it
// late.
func (r *Reconciler) placeIn(ctx context.Context, tx store.Tx, d *decider, id string, fail bool) (placement, error) {
	w, err := tx.GetWorkspace(ctx, id)
	if err != nil {
		return placement{}, err
	}
	if w.NodeID != "" || w.CommandID == "" {
		return placement{}, nil
	}
	pub, err := workspace.Decode(w)
	if err != nil {
		return placement{}, err
	}
	now := r.now()
	if w.Power == store.PowerDeleted {
		// Never placed: nothing to release.
		pub.State, pub.DeletedAt = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, nil
		w.DeletedAt = now
		w.ObservedGeneration = w.Generation
		if err := complete(ctx, tx, w, pub, nil, now); err != nil {
			return placement{}, err
		}
		if err := tx.SetReferences(ctx, w.ID, nil); err != nil {
			return placement{}, err
		}
		if err := r.workspaceGone(ctx, tx, pub, now); err != nil {
			return placement{}, err
		}
		return placement{completed: true}, saveRow(ctx, tx, w, pub, now)
	}
	node, dm, reason, err := d.decide(ctx, tx, pub)
	if err != nil {
		return placement{}, err
	}
	if node != nil {
		// The view may be a second old: the node picked must still be
		// ACTIVE by its record.
		if ok, err := r.placeable(ctx, tx, node.id); err != nil || !ok {
			return placement{}, err // not ACTIVE any more: the next pass decides again
		}
		w.NodeID = node.id
		pub.Placement = &ctrlv1.Placement{NodeId: node.id, StoragePool: node.pool}
		// The node-built template runs at the version the node holds;
		// a published version stays the one it was created from.
		if v := node.templates[pub.GetTemplate().GetTemplateId()]; v != "" && pub.GetTemplate() != nil && !dm.published {
			pub.Template.Version = v
		}
		if err := r.placeVolume(ctx, tx, pub, node, now); err != nil {
			return placement{}, err
		}
		if err := saveRow(ctx, tx, w, pub, now); err != nil {
			return placement{}, err
		}
		d.took(node, w, dm)
		return placement{placed: w}, nil
	}
	if now.Sub(w.UpdatedAt) < r.placementTimeout || !r.leads() {
		// Wait for a node; only the fleet lease's holder fails a
		// placement at its timeout.
		return placement{}, nil
	}
	if !fail {
		return placement{late: true}, nil
	}
	if err := r.fenced(ctx, tx); err != nil {
		return placement{}, err
	}
	fe := placementFailure(reason)
	pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, false
	pub.Failure = fe.Detail()
	w.ObservedGeneration = w.Generation
	if err := complete(ctx, tx, w, pub, fe, now); err != nil {
		return placement{}, err
	}
	return placement{completed: true}, saveRow(ctx, tx, w, pub, now)
}
