package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/volume"
)

// Nodes serves NodeService (Operator API): the fleet, its drains,
// isolations and retirements, overcommit and storage pools.
type Nodes struct {
	svc *fleet.Service
}

var _ ctrlv1connect.NodeServiceHandler = (*Nodes)(nil)

// NewNodes returns the handler. A service without Volumes counts the
// nodes' Volumes with NodeVolumes.
func NewNodes(svc *fleet.Service) *Nodes {
	if svc.Volumes == nil {
		svc.Volumes = NodeVolumes
	}
	return &Nodes{svc: svc}
}

// NodeVolumes returns, by node, how many Volumes whose deletion has not
// completed it holds and the bytes they take of its pool
// (Volume.PoolBytes, the pool accounting of internal/volume), reading every
// Volume once.
func NodeVolumes(ctx context.Context, tx store.Tx) (map[string]fleet.VolumeUse, error) {
	all, err := volume.All(ctx, tx)
	if err != nil {
		return nil, err
	}
	out := map[string]fleet.VolumeUse{}
	for _, v := range all {
		if v.Node != "" {
			u := out[v.Node]
			u.Count++
			u.Bytes += v.PoolBytes()
			out[v.Node] = u
		}
	}
	return out, nil
}

// ListNodes pages through nodes in ID order.
func (h *Nodes) ListNodes(ctx context.Context, req *connect.Request[ctrlv1.ListNodesRequest]) (*connect.Response[ctrlv1.ListNodesResponse], error) {
	out, err := h.svc.List(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// GetNode reads a node.
func (h *Nodes) GetNode(ctx context.Context, req *connect.Request[ctrlv1.GetNodeRequest]) (*connect.Response[ctrlv1.GetNodeResponse], error) {
	n, err := h.svc.Get(ctx, req.Msg.GetNodeId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetNodeResponse{Node: n}), nil
}

// DrainNode drains a node.
func (h *Nodes) DrainNode(ctx context.Context, req *connect.Request[ctrlv1.DrainNodeRequest]) (*connect.Response[ctrlv1.DrainNodeResponse], error) {
	return respond(h.svc.Drain(ctx, req.Msg))
}

// CancelNodeDrain returns a node to ACTIVE.
func (h *Nodes) CancelNodeDrain(ctx context.Context, req *connect.Request[ctrlv1.CancelNodeDrainRequest]) (*connect.Response[ctrlv1.CancelNodeDrainResponse], error) {
	return respond(h.svc.CancelDrain(ctx, req.Msg))
}

// IsolateNode isolates a node.
func (h *Nodes) IsolateNode(ctx context.Context, req *connect.Request[ctrlv1.IsolateNodeRequest]) (*connect.Response[ctrlv1.IsolateNodeResponse], error) {
	return respond(h.svc.Isolate(ctx, req.Msg))
}

// RetireNode retires a node.
func (h *Nodes) RetireNode(ctx context.Context, req *connect.Request[ctrlv1.RetireNodeRequest]) (*connect.Response[ctrlv1.RetireNodeResponse], error) {
	return respond(h.svc.Retire(ctx, req.Msg))
}

// SetNodeOvercommit sets or clears a node's own ratios.
func (h *Nodes) SetNodeOvercommit(ctx context.Context, req *connect.Request[ctrlv1.SetNodeOvercommitRequest]) (*connect.Response[ctrlv1.SetNodeOvercommitResponse], error) {
	return respond(h.svc.SetOvercommit(ctx, req.Msg))
}

// GetOvercommitDefaults reads the default ratios.
func (h *Nodes) GetOvercommitDefaults(ctx context.Context, _ *connect.Request[ctrlv1.GetOvercommitDefaultsRequest]) (*connect.Response[ctrlv1.GetOvercommitDefaultsResponse], error) {
	d, err := h.svc.GetDefaults(ctx)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetOvercommitDefaultsResponse{Defaults: d}), nil
}

// SetOvercommitDefaults sets the default ratios.
func (h *Nodes) SetOvercommitDefaults(ctx context.Context, req *connect.Request[ctrlv1.SetOvercommitDefaultsRequest]) (*connect.Response[ctrlv1.SetOvercommitDefaultsResponse], error) {
	return respond(h.svc.SetDefaults(ctx, req.Msg))
}

// SetStoragePoolCapacity sets or clears a pool's capacity override.
func (h *Nodes) SetStoragePoolCapacity(ctx context.Context, req *connect.Request[ctrlv1.SetStoragePoolCapacityRequest]) (*connect.Response[ctrlv1.SetStoragePoolCapacityResponse], error) {
	return respond(h.svc.SetPoolCapacity(ctx, req.Msg))
}
