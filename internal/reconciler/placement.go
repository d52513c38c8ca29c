package reconciler

import (
	"context"
	"slices"
	"strconv"
	"strings"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
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
	network   bool              // it serves workspace networks
	// freeBytes is what its storage pool has not promised yet
	// (volume.PoolFree), when storageKnown.
	freeBytes    uint64
	storageKnown bool
}

// demand is what a Workspace asks of its node.
type demand struct {
	template  string
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
	return demand{
		template:  pub.GetTemplate().GetTemplateId(),
		memoryMiB: uint64(pub.GetResources().GetMemoryMib()),
		cpuMillis: uint64(pub.GetResources().GetCpuMillis()),
		network:   pub.GetNetworkPolicy().GetMode() == ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET,

		storageBytes: pub.GetWritableLayer().GetCapacityBytes(),
	}
}

func (c *candidate) holds(template string) bool {
	_, ok := c.templates[template]
	return ok
}

// serves reports whether c can run what d asks for, capacity aside.
func (c *candidate) serves(d demand) bool {
	return c.holds(d.template) && (c.network || !d.network)
}

// pick chooses among the connected nodes the one that holds the template,
// serves networks when the Workspace's policy is PUBLIC_INTERNET, fits the
// demand (its memory on top of what the node's running Workspaces
// use; its CPU within the node's) and has the most free memory; ties go to
// the first in nodes. It returns nil with the reason when nodes exist but
// none fits, nil and "" when nodes is empty.
func pick(nodes []candidate, d demand) (*candidate, string) {
	if len(nodes) == 0 {
		return nil, ""
	}
	var best *candidate
	holders, networked, stored := 0, 0, 0
	if d.node != "" && !slices.ContainsFunc(nodes, func(c candidate) bool { return c.id == d.node }) {
		return nil, "" // the node holding its Volume is not connected
	}
	for i := range nodes {
		c := &nodes[i]
		if d.node != "" && c.id != d.node {
			continue
		}
		if !c.holds(d.template) {
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
		if c.usedMiB+d.memoryMiB > c.capacity.MemoryMiB || d.cpuMillis > c.capacity.CPUMillis {
			continue
		}
		if best == nil || c.capacity.MemoryMiB-c.usedMiB > best.capacity.MemoryMiB-best.usedMiB {
			best = c
		}
	}
	switch {
	case holders == 0:
		return nil, "no connected node holds template " + strconv.Quote(d.template)
	case networked == 0:
		return nil, "no connected node that holds template " + strconv.Quote(d.template) +
			" serves workspace networks, which this workspace's PUBLIC_INTERNET policy needs"
	case stored == 0 && d.node != "":
		return nil, "node " + strconv.Quote(d.node) + ", which holds this workspace's volume, has no room in its storage pool for the writable layer"
	case stored == 0:
		return nil, "no connected node that can run this workspace has room in its storage pool for its writable layer (and new volume)"
	case best == nil:
		return nil, "no connected node has the memory and CPU this workspace requests"
	}
	return best, ""
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

// connected returns the connected nodes in ID order, without their usage.
func (r *Reconciler) connected() []candidate {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]candidate, 0, len(r.nodes))
	for id, nc := range r.nodes {
		out = append(out, candidate{id: id, capacity: r.caps[id], templates: r.templates[id], pool: nc.pool,
			network: r.features[id][nodewire.FeatureNetwork]})
	}
	slices.SortFunc(out, func(a, b candidate) int { return strings.Compare(a.id, b.id) })
	return out
}

// choose picks a node for pub among the connected ones (see pick), reading
// from tx what the candidates' Workspaces ask of them: the memory of those
// desired RUNNING and the writable layers of all (store.Tx.NodeUsage, sums
// of an index, whatever the number of Workspaces on the node).
func (r *Reconciler) choose(ctx context.Context, tx store.Tx, pub *ctrlv1.Workspace) (*candidate, string, error) {
	nodes, d := r.connected(), demandOf(pub)
	node, extra, err := volumeDemand(ctx, tx, pub)
	if err != nil {
		return nil, "", err
	}
	d.node, d.storageBytes = node, d.storageBytes+extra
	volumeUse, err := volume.PoolUsage(ctx, tx)
	if err != nil {
		return nil, "", err
	}
	for i := range nodes {
		c := &nodes[i]
		if !c.serves(d) || (d.node != "" && c.id != d.node) {
			continue
		}
		u, err := tx.NodeUsage(ctx, c.id)
		if err != nil {
			return nil, "", err
		}
		if size := c.capacity.StorageBytes; size > 0 {
			c.storageKnown, c.freeBytes = true, volume.Free(size, volumeUse[c.id], u.LayerBytes)
		}
		c.usedMiB = u.RunningMemoryMiB
	}
	c, reason := pick(nodes, d)
	return c, reason, nil
}

// place chooses a node for an unplaced Workspace, or fails its command when
// none can hold it after the placement timeout. It returns the placed row
// (nil when not placed) and whether a command completed.
func (r *Reconciler) place(ctx context.Context, id string) (*store.Workspace, bool, error) {
	completed := false
	var placed *store.Workspace
	err := r.store.InTx(ctx, func(tx store.Tx) error {
		completed, placed = false, nil
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
			w.NodeID = node.id
			pub.Placement = &ctrlv1.Placement{NodeId: node.id, StoragePool: node.pool}
			if v := node.templates[pub.GetTemplate().GetTemplateId()]; v != "" && pub.GetTemplate() != nil {
				pub.Template.Version = v
			}
			if err := r.placeVolume(ctx, tx, pub, node, now); err != nil {
				return err
			}
			placed = w
			return saveRow(ctx, tx, w, pub, now)
		}
		if now.Sub(w.UpdatedAt) < r.placementTimeout {
			return nil // wait for a node
		}
		fe := placementFailure(reason)
		pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, false
		pub.Failure = fe.Detail()
		w.ObservedGeneration = w.Generation
		if err := complete(ctx, tx, w, pub, fe, now); err != nil {
			return err
		}
		completed = true
		return saveRow(ctx, tx, w, pub, now)
	})
	return placed, completed, err
}
