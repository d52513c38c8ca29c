package api

import (
	"context"
	"slices"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/volume"
)

// Volumes serves VolumeService (internal/volume holds the rules). Create,
// resize and delete wait, bounded, for the node holding the Volume. Every
// method is refused (unimplemented, CAPABILITY_UNAVAILABLE) while
// volume.create is not served: no connected node serves Volumes.
type Volumes struct {
	svc *volume.Service
	// Served, when set, returns the capabilities served now.
	Served func() []string
}

// unserved refuses a method whose capability name the deployment does not
// serve now (none without served), before anything is recorded.
func unserved(served func() []string, name, method string) error {
	if served != nil && slices.Contains(served(), name) {
		return nil
	}
	return &fault.Error{Kind: fault.KindUnimplemented, Reason: fault.ReasonCapabilityUnavailable,
		Message: method + " needs the capability " + name + ", which this deployment does not serve now (no connected node serves volumes); nothing was recorded"}
}

func (h *Volumes) gate(method string) error {
	return unserved(h.Served, capability.VolumeCreate, method)
}

var _ ctrlv1connect.VolumeServiceHandler = (*Volumes)(nil)

// NewVolumes returns the VolumeService handler.
func NewVolumes(svc *volume.Service, served func() []string) *Volumes {
	return &Volumes{svc: svc, Served: served}
}

// CreateVolume creates a Volume and waits until its node made it.
func (h *Volumes) CreateVolume(ctx context.Context, req *connect.Request[ctrlv1.CreateVolumeRequest]) (*connect.Response[ctrlv1.CreateVolumeResponse], error) {
	if err := h.gate("CreateVolume"); err != nil {
		return nil, err
	}
	return respond(h.svc.Create(ctx, req.Msg))
}

// GetVolume reads one Volume, deleted ones included.
func (h *Volumes) GetVolume(ctx context.Context, req *connect.Request[ctrlv1.GetVolumeRequest]) (*connect.Response[ctrlv1.GetVolumeResponse], error) {
	if err := h.gate("GetVolume"); err != nil {
		return nil, err
	}
	v, err := h.svc.Get(ctx, req.Msg.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetVolumeResponse{Volume: v}), nil
}

// ListVolumes lists one page.
func (h *Volumes) ListVolumes(ctx context.Context, req *connect.Request[ctrlv1.ListVolumesRequest]) (*connect.Response[ctrlv1.ListVolumesResponse], error) {
	if err := h.gate("ListVolumes"); err != nil {
		return nil, err
	}
	return respond(h.svc.List(ctx, req.Msg))
}

// ResizeVolume grows a Volume and waits until its node did.
func (h *Volumes) ResizeVolume(ctx context.Context, req *connect.Request[ctrlv1.ResizeVolumeRequest]) (*connect.Response[ctrlv1.ResizeVolumeResponse], error) {
	if err := h.gate("ResizeVolume"); err != nil {
		return nil, err
	}
	return respond(h.svc.Resize(ctx, req.Msg))
}

// DeleteVolume deletes an unbound Volume and waits until its node did.
func (h *Volumes) DeleteVolume(ctx context.Context, req *connect.Request[ctrlv1.DeleteVolumeRequest]) (*connect.Response[ctrlv1.DeleteVolumeResponse], error) {
	if err := h.gate("DeleteVolume"); err != nil {
		return nil, err
	}
	return respond(h.svc.Delete(ctx, req.Msg))
}

// GetVolumeCommand reads a Volume command.
func (h *Volumes) GetVolumeCommand(ctx context.Context, req *connect.Request[ctrlv1.GetVolumeCommandRequest]) (*connect.Response[ctrlv1.GetVolumeCommandResponse], error) {
	if err := h.gate("GetVolumeCommand"); err != nil {
		return nil, err
	}
	c, err := h.svc.GetCommand(ctx, req.Msg.GetCommandId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetVolumeCommandResponse{Command: c}), nil
}

// UpdateVolumeLabels replaces the label map under CAS.
func (h *Volumes) UpdateVolumeLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateVolumeLabelsRequest]) (*connect.Response[ctrlv1.UpdateVolumeLabelsResponse], error) {
	if err := h.gate("UpdateVolumeLabels"); err != nil {
		return nil, err
	}
	m := req.Msg
	v, err := h.svc.UpdateMap(ctx, m, m.GetVolumeId(), false, m.GetExpectedRevision(), m.GetLabels())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.UpdateVolumeLabelsResponse{Volume: v}), nil
}

// UpdateVolumeAnnotations replaces the annotation map under CAS.
func (h *Volumes) UpdateVolumeAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateVolumeAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateVolumeAnnotationsResponse], error) {
	if err := h.gate("UpdateVolumeAnnotations"); err != nil {
		return nil, err
	}
	m := req.Msg
	v, err := h.svc.UpdateMap(ctx, m, m.GetVolumeId(), true, m.GetExpectedRevision(), m.GetAnnotations())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.UpdateVolumeAnnotationsResponse{Volume: v}), nil
}
