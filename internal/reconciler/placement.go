package reconciler

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
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
// ties go to the first in nodes. It returns nil with the reason when nodes
// exist but none fits — naming the nodes' states when only nodes that are
// not ACTIVE could take it — nil and "" when nodes is empty.
func pick(nodes []candidate, d demand) (*candidate, string) {
	if len(nodes) == 0 {
		return nil, ""
	}
	var best *candidate
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
	}
	switch {
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

// placementStalled is the failure of a Workspace that node, connected to
// another replica, could hold, but that no replica placed within bound
// (placement timeout plus the node grace): retryable.
func placementStalled(node string, bound time.Duration) *fault.Error {
	return &fault.Error{Kind: fault.KindUnavailable, Reason: fault.ReasonNodeUnreachable, Retryable: true, Stage: "placement",
		Message: "node " + strconv.Quote(node) + " could hold the workspace, but the ctrl replica holding its stream did not place it within " +
			bound.String()}
}

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

// fleetWide returns, in ID order and as connected does, the nodes
// connected to any replica: those connected to this ctrl, and the others
// heard from within the grace at now by the store's last_seen (as of the
// last reload of the node records).
func (r *Reconciler) fleetWide(now time.Time) []candidate {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id := range r.stored {
		if _, here := r.nodes[id]; !here && now.Sub(r.storeSeen(id)) <= r.nodeGrace {
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
			state: v.State(id), ratios: ratios}
	}
	return out
}

// choose picks a node for pub among the connected ones (see pick),
// weighing the candidates by what their Workspaces ask of them: the memory
// and CPU of those desired RUNNING and the writable layers of all
// (store.Tx.NodeUsages). Those sums come from the usage cache (read at
// most once a second, one read of an index for all nodes) and are never
// trusted for the decision itself: the node picked has its own sums read
// again in tx (store.Tx.NodeUsage) and is taken only if it still fits; a
// decision that finds no node, or whose picks keep failing that check,
// reads every node's sums in tx and decides on them. A Workspace bound to
// a Volume weighs only the Volume's node, read in tx. The fleet's records
// come from the cached view; the pool overrides bound the pools' capacity.
func (r *Reconciler) choose(ctx context.Context, tx store.Tx, pub *ctrlv1.Workspace) (*candidate, string, error) {
	return r.chooseAmong(ctx, tx, pub, r.connected())
}

// chooseAmong is choose among nodes.
func (r *Reconciler) chooseAmong(ctx context.Context, tx store.Tx, pub *ctrlv1.Workspace, nodes []candidate) (*candidate, string, error) {
	d := demandOf(pub)
	node, extra, err := volumeDemand(ctx, tx, pub)
	if err != nil {
		return nil, "", err
	}
	d.node, d.storageBytes = node, d.storageBytes+extra
	volumeUse, err := volume.PoolUsage(ctx, tx)
	if err != nil {
		return nil, "", err
	}
	r.mu.Lock()
	view := r.fleetView()
	r.mu.Unlock()
	fill := func(c *candidate, u store.NodeUsage) {
		c.storageKnown, c.freeBytes = false, 0
		if size := view.PoolCapacity(c.id, c.pool, c.capacity.StorageBytes); size > 0 {
			c.storageKnown, c.freeBytes = true, volume.Free(size, volumeUse[c.id], u.LayerBytes)
		}
		c.usedMiB, c.usedCPU = u.RunningMemoryMiB, u.RunningCPUMillis
	}
	weighed := func(c *candidate) bool { return c.serves(d) && (d.node == "" || c.id == d.node) }
	if d.node != "" {
		// One node: its own sums, read in tx.
		for i := range nodes {
			if c := &nodes[i]; weighed(c) {
				u, err := tx.NodeUsage(ctx, c.id)
				if err != nil {
					return nil, "", err
				}
				fill(c, u)
			}
		}
		c, reason := pick(nodes, d)
		return c, reason, nil
	}
	usage, fresh, err := r.nodeUsage(ctx, tx, false)
	if err != nil {
		return nil, "", err
	}
	fillAll := func() {
		for i := range nodes {
			if c := &nodes[i]; weighed(c) {
				fill(c, usage[c.id])
			}
		}
	}
	fillAll()
	for tries := 0; ; tries++ {
		c, reason := pick(nodes, d)
		if fresh {
			return c, reason, nil // decided on sums read in tx
		}
		if c != nil && tries < 3 {
			u, err := tx.NodeUsage(ctx, c.id)
			if err != nil {
				return nil, "", err
			}
			if u == usage[c.id] {
				return c, "", nil
			}
			r.setNodeUsage(c.id, u)
			usage[c.id] = u
			fill(c, u)
			if !c.storageKnown || c.freeBytes >= d.storageBytes {
				if c.fits(d) {
					return c, "", nil // still fits, though another may have more room now
				}
			}
			continue // it does not fit after all: pick again
		}
		// No node by the cache, or picks that kept failing: decide on every
		// node's sums read in tx.
		if usage, fresh, err = r.nodeUsage(ctx, tx, true); err != nil {
			return nil, "", err
		}
		fillAll()
	}
}

// usageReload is how long placement weighs candidates by the usage cache
// before reading every node's sums again.
const usageReload = time.Second

// usageCache is every node's use as last read (store.Tx.NodeUsages).
type usageCache struct {
	m      map[string]store.NodeUsage
	loaded time.Time // by the monotonic wall clock, not Config.Now
}

// nodeUsage returns a copy of the usage cache, read again in tx when it is
// older than usageReload or when now; fresh reports that it was read in
// tx.
func (r *Reconciler) nodeUsage(ctx context.Context, tx store.Tx, now bool) (map[string]store.NodeUsage, bool, error) {
	r.mu.Lock()
	if !now && r.usage.m != nil && time.Since(r.usage.loaded) < usageReload {
		out := maps.Clone(r.usage.m)
		r.mu.Unlock()
		return out, false, nil
	}
	r.mu.Unlock()
	m, err := tx.NodeUsages(ctx)
	if err != nil {
		return nil, false, err
	}
	r.mu.Lock()
	r.usage = usageCache{m: maps.Clone(m), loaded: time.Now()}
	r.mu.Unlock()
	return m, true, nil
}

// setNodeUsage records node's sums as read in a transaction.
func (r *Reconciler) setNodeUsage(node string, u store.NodeUsage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.usage.m != nil {
		r.usage.m[node] = u
	}
}

// placedUsage adds to the usage cache what a Workspace placed on node
// takes (its placement committed): the next decisions of the pass weigh
// the node with it.
func (r *Reconciler) placedUsage(node string, d demand, running bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.usage.m == nil {
		return
	}
	u := r.usage.m[node]
	u.LayerBytes += d.storageBytes
	if running {
		u.RunningMemoryMiB += d.memoryMiB
		u.RunningCPUMillis += d.cpuMillis
	}
	r.usage.m[node] = u
}

// place chooses a node for an unplaced Workspace among the nodes connected
// to this ctrl, or fails its command when none can hold it after the
// placement timeout. Only the holder of the fleet lease fails it
// (Config.Leader), and it judges the failure over the whole fleet
// (fleetWide: the nodes any replica heard from within the grace, their
// capacity, templates, features, fleet state and usage): when a node
// connected to another replica could hold it, that replica places it, and
// the holder waits up to the placement timeout plus the node grace before
// it fails it as retryable (placementStalled); otherwise the reason is
// that of the fleet (capacity, templates, states), NODE_UNREACHABLE only
// when no node anywhere was heard from within the grace. The failure's
// transaction checks the fleet lease first (Config.Fence). It returns the placed row
// (nil when not placed) and whether a command completed.
func (r *Reconciler) place(ctx context.Context, id string) (*store.Workspace, bool, error) {
	completed := false
	var placed *store.Workspace
	var placedDemand demand // what it takes from its node (its writable layer; a Volume counts apart)
	placedOn, running := "", false
	err := r.store.InTx(ctx, func(tx store.Tx) error {
		completed, placed, placedOn = false, nil, ""
		w, err := tx.GetWorkspace(ctx, id)
		if err != nil {
			return err
		}
		if w.NodeID != "" || w.CommandID == "" {
			return nil
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		now := r.now()
		if w.Power == store.PowerDeleted {
			// Never placed: nothing to release.
			pub.State, pub.DeletedAt = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, nil
			w.DeletedAt = now
			w.ObservedGeneration = w.Generation
			if err := complete(ctx, tx, w, pub, nil, now); err != nil {
				return err
			}
			completed = true
			if err := tx.SetReferences(ctx, w.ID, nil); err != nil {
				return err
			}
			if err := r.workspaceGone(ctx, tx, pub, now); err != nil {
				return err
			}
			return saveRow(ctx, tx, w, pub, now)
		}
		node, reason, err := r.choose(ctx, tx, pub)
		if err != nil {
			return err
		}
		if node != nil {
			// The view may be a second old: the node picked must still be
			// ACTIVE by its record.
			if ok, err := r.placeable(ctx, tx, node.id); err != nil || !ok {
				return err // not ACTIVE any more: the next pass decides again
			}
			w.NodeID = node.id
			pub.Placement = &ctrlv1.Placement{NodeId: node.id, StoragePool: node.pool}
			// The node-built template runs at the version the node holds;
			// a published version stays the one it was created from.
			if v := node.templates[pub.GetTemplate().GetTemplateId()]; v != "" && pub.GetTemplate() != nil && !demandOf(pub).published {
				pub.Template.Version = v
			}
			if err := r.placeVolume(ctx, tx, pub, node, now); err != nil {
				return err
			}
			placed, placedOn, running, placedDemand = w, node.id, w.Power == store.PowerRunning, demandOf(pub)
			return saveRow(ctx, tx, w, pub, now)
		}
		if now.Sub(w.UpdatedAt) < r.placementTimeout || !r.leads() {
			// Wait for a node; only the fleet lease's holder fails a
			// placement at its timeout.
			return nil
		}
		// Timed out on this ctrl's nodes: judge it over the whole fleet,
		// the nodes connected to other replicas included.
		other, reason, err := r.chooseAmong(ctx, tx, pub, r.fleetWide(now))
		if err != nil {
			return err
		}
		if other != nil && now.Sub(w.UpdatedAt) < r.placementTimeout+r.nodeGrace {
			// A node connected to another replica can hold it: that
			// replica places it at its next pass.
			return nil
		}
		if err := r.fenced(ctx, tx); err != nil {
			return err
		}
		fe := placementFailure(reason)
		if other != nil {
			fe = placementStalled(other.id, r.placementTimeout+r.nodeGrace)
		}
		pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, false
		pub.Failure = fe.Detail()
		w.ObservedGeneration = w.Generation
		if err := complete(ctx, tx, w, pub, fe, now); err != nil {
			return err
		}
		completed = true
		return saveRow(ctx, tx, w, pub, now)
	})
	if err == nil && placedOn != "" {
		r.placedUsage(placedOn, placedDemand, running)
	}
	return placed, completed, err
}
