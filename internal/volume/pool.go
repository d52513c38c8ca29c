package volume

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
)

// PoolFree returns the bytes of nodeID's storage pool that nothing is
// promised yet: the pool's size (store.Node.StorageBytes, from the node's
// Hello; the operator's capacity override when smaller, PoolCapacity)
// minus the writable-layer capacity of every Workspace placed on the
// node whose deletion has not completed, and the capacity of every Volume
// on the node whose deletion has not completed (the larger of its desired
// and confirmed capacity, so that a resize in flight counts at its
// target). known is false for a node the store does not know or that
// reports no pool size: nobody can judge, the node decides. It is the hook
// workspace.Service.PoolFree, and what CreateVolume and ResizeVolume
// judge by.
func PoolFree(ctx context.Context, tx store.Tx, nodeID string) (free uint64, known bool, err error) {
	n, err := tx.GetNode(ctx, nodeID)
	if errors.Is(err, store.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	use, err := PoolUsage(ctx, tx)
	if err != nil {
		return 0, false, err
	}
	return freeOf(ctx, tx, n, use)
}

// freeOf is PoolFree of node n, given what its Volumes use. The writable
// layers are a sum the store reads from an index (store.Tx.NodeUsage),
// whatever the number of Workspaces on the node.
func freeOf(ctx context.Context, tx store.Tx, n *store.Node, volumeUse map[string]uint64) (free uint64, known bool, err error) {
	if n.StorageBytes == 0 {
		return 0, false, nil
	}
	size, err := PoolCapacity(ctx, tx, n.ID, nodeHello(n).GetCapacity().GetStoragePool(), n.StorageBytes)
	if err != nil {
		return 0, false, err
	}
	u, err := tx.NodeUsage(ctx, n.ID)
	if err != nil {
		return 0, false, err
	}
	return Free(size, volumeUse[n.ID], u.LayerBytes), true, nil
}

// PoolCapacity is the capacity ctrl accounts pool poolID of nodeID at,
// read inside tx: the override SetStoragePoolCapacity recorded when it is
// smaller than reported (what the node reports), else reported
// (fleet.View.PoolCapacity, for one pool).
func PoolCapacity(ctx context.Context, tx store.Tx, nodeID, poolID string, reported uint64) (uint64, error) {
	r, err := tx.GetResource(ctx, fleet.KindPool, fleet.PoolKey(nodeID, poolID))
	if errors.Is(err, store.ErrNotFound) {
		return reported, nil
	}
	if err != nil {
		return 0, err
	}
	var p fleet.PoolRecord
	if err := json.Unmarshal(r.Spec, &p); err != nil {
		return 0, fault.Internal("decode storage pool %s: %v", r.ID, err)
	}
	if p.OverrideBytes > 0 && p.OverrideBytes < reported {
		return p.OverrideBytes, nil
	}
	return reported, nil
}

// Free is what a pool of size bytes has not promised yet when its Volumes
// take volumes bytes and its Workspaces' writable layers layers.
func Free(size, volumes, layers uint64) uint64 {
	used := volumes + layers
	if used < volumes || used >= size { // overflow or full
		return 0
	}
	return size - used
}

// PoolUsage returns, by node, the capacity its Volumes whose deletion has
// not completed take (reading every Volume once).
func PoolUsage(ctx context.Context, tx store.Tx) (map[string]uint64, error) {
	all, err := All(ctx, tx)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, v := range all {
		if v.Node != "" {
			out[v.Node] += max(v.Capacity, v.Pub.GetCapacityBytes())
		}
	}
	return out, nil
}
