package volume

import (
	"context"
	"errors"

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
	_, pool, err := fleet.GetPool(ctx, tx, n.ID, nodeHello(n).GetCapacity().GetStoragePool())
	if err != nil {
		return 0, false, err
	}
	size := pool.Capacity(n.StorageBytes)
	u, err := tx.NodeUsage(ctx, n.ID)
	if err != nil {
		return 0, false, err
	}
	return Free(size, volumeUse[n.ID], u.LayerBytes), true, nil
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
			out[v.Node] += v.PoolBytes()
		}
	}
	return out, nil
}

// PoolBytes is what v takes of its node's pool: the larger of its image's
// capacity and the capacity it is being resized to.
func (v *Volume) PoolBytes() uint64 { return max(v.Capacity, v.Pub.GetCapacityBytes()) }
