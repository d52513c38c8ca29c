package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/catalog"
	"github.com/kibotos/kibotos/internal/egress"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/reconciler"
	"github.com/kibotos/kibotos/internal/store"
)

// Egresses serves EgressService.
type Egresses struct {
	svc *catalog.Service[*ctrlv1.EgressSpec]
	// OnUpdate, when set, runs after an UpdateEgress succeeded: the
	// reconciler's Kick, which pushes the new revision to the running
	// Workspaces that reference it (their generations moved in the update's
	// transaction).
	OnUpdate func()
	// OnDelete, when set, runs after a DeleteEgress succeeded, with its ID:
	// the reconciler's EgressDeleted, which makes every node close the
	// connections still draining through it.
	OnDelete func(id string)
}

var _ ctrlv1connect.EgressServiceHandler = (*Egresses)(nil)

// EgressType describes Egresses to the catalog. An update that changes the
// spec moves the generation of every running Workspace whose policy
// references the Egress (reconciler.Repush), so that its node switches new
// connections to the new revision; the revision of those policies does not
// change.
func EgressType(checker *netguard.Checker) catalog.ObjectType[*ctrlv1.EgressSpec] {
	return catalog.ObjectType[*ctrlv1.EgressSpec]{
		ResourceKind: store.KindEgress, Noun: "egress", IDPrefix: "eg-", IDField: "egress_id",
		NewSpec:  func() *ctrlv1.EgressSpec { return &ctrlv1.EgressSpec{} },
		Validate: egress.ValidateSpec,
		Check: func(ctx context.Context, field string, s *ctrlv1.EgressSpec) error {
			return egress.CheckEndpoint(ctx, checker, field, s)
		},
		GuardUpdate: func(ctx context.Context, tx store.Tx, id string, old, new *ctrlv1.EgressSpec) error {
			if !old.GetUdpEnabled() || new.GetUdpEnabled() {
				return nil
			}
			n, err := tx.CountReferences(ctx, store.RefEgressUDP, id)
			if err != nil || n == 0 {
				return err
			}
			return egress.UDPInUse(id, n)
		},
		AfterUpdate: func(ctx context.Context, tx store.Tx, id string, _ *store.Resource) error {
			_, err := reconciler.Repush(ctx, tx, id, store.RefEgress, store.RefEgressUDP)
			return err
		},
		DeleteRefs: []store.RefKind{store.RefEgress, store.RefEgressUDP},
	}
}

// NewEgresses returns the EgressService handler.
func NewEgresses(svc *catalog.Service[*ctrlv1.EgressSpec]) *Egresses { return &Egresses{svc: svc} }

func egressMessage(o *catalog.Object[*ctrlv1.EgressSpec]) *ctrlv1.Egress {
	return &ctrlv1.Egress{
		EgressId: o.ID, Spec: egress.Redact(o.Spec), Revision: o.Revision,
		CreatedAt: ts(o.CreatedAt), UpdatedAt: ts(o.UpdatedAt),
		Labels: o.Labels, LabelsRevision: o.LabelsRevision,
		Annotations: o.Annotations, AnnotationsRevision: o.AnnotationsRevision,
	}
}

// CreateEgress stores a new Egress.
func (h *Egresses) CreateEgress(ctx context.Context, req *connect.Request[ctrlv1.CreateEgressRequest]) (*connect.Response[ctrlv1.CreateEgressResponse], error) {
	m := req.Msg
	out, err := catalog.Create(ctx, h.svc, ctrlv1connect.EgressServiceCreateEgressProcedure, m, m.GetSpec(), m.GetLabels(), m.GetAnnotations(),
		func(o *catalog.Object[*ctrlv1.EgressSpec]) *ctrlv1.CreateEgressResponse {
			return &ctrlv1.CreateEgressResponse{Egress: egressMessage(o)}
		}, func() *ctrlv1.CreateEgressResponse { return &ctrlv1.CreateEgressResponse{} })
	return respond(out, err)
}

// GetEgress reads one Egress.
func (h *Egresses) GetEgress(ctx context.Context, req *connect.Request[ctrlv1.GetEgressRequest]) (*connect.Response[ctrlv1.GetEgressResponse], error) {
	o, err := h.svc.Get(ctx, req.Msg.GetEgressId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetEgressResponse{Egress: egressMessage(o)}), nil
}

// ListEgresses lists one page of Egresses.
func (h *Egresses) ListEgresses(ctx context.Context, req *connect.Request[ctrlv1.ListEgressesRequest]) (*connect.Response[ctrlv1.ListEgressesResponse], error) {
	m := req.Msg
	objs, next, err := h.svc.List(ctx, m.GetPageSize(), m.GetPageToken(), m.GetLabelSelector())
	if err != nil {
		return nil, err
	}
	out := &ctrlv1.ListEgressesResponse{NextPageToken: next, Egresses: make([]*ctrlv1.Egress, len(objs))}
	for i, o := range objs {
		out.Egresses[i] = egressMessage(o)
	}
	return connect.NewResponse(out), nil
}

// UpdateEgress replaces an Egress's spec under CAS.
func (h *Egresses) UpdateEgress(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressRequest]) (*connect.Response[ctrlv1.UpdateEgressResponse], error) {
	m := req.Msg
	drain, err := egress.ValidateDrainSeconds("drain_seconds", m.DrainSeconds)
	if err != nil {
		return nil, err
	}
	out, err := catalog.Update(ctx, h.svc, ctrlv1connect.EgressServiceUpdateEgressProcedure, m, m.GetEgressId(), m.GetExpectedRevision(), m.GetSpec(), drain, egress.SameContent,
		func(o *catalog.Object[*ctrlv1.EgressSpec]) *ctrlv1.UpdateEgressResponse {
			return &ctrlv1.UpdateEgressResponse{Egress: egressMessage(o)}
		}, func() *ctrlv1.UpdateEgressResponse { return &ctrlv1.UpdateEgressResponse{} })
	if err == nil && h.OnUpdate != nil {
		h.OnUpdate()
	}
	return respond(out, err)
}

// DeleteEgress deletes an unreferenced Egress.
func (h *Egresses) DeleteEgress(ctx context.Context, req *connect.Request[ctrlv1.DeleteEgressRequest]) (*connect.Response[ctrlv1.DeleteEgressResponse], error) {
	out, err := catalog.Delete(ctx, h.svc, ctrlv1connect.EgressServiceDeleteEgressProcedure, req.Msg, req.Msg.GetEgressId(),
		func() *ctrlv1.DeleteEgressResponse { return &ctrlv1.DeleteEgressResponse{} })
	if err == nil && h.OnDelete != nil {
		h.OnDelete(req.Msg.GetEgressId())
	}
	return respond(out, err)
}

// UpdateEgressLabels replaces the label map under CAS.
func (h *Egresses) UpdateEgressLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressLabelsRequest]) (*connect.Response[ctrlv1.UpdateEgressLabelsResponse], error) {
	m := req.Msg
	out, err := catalog.UpdateMap(ctx, h.svc, ctrlv1connect.EgressServiceUpdateEgressLabelsProcedure, m, m.GetEgressId(), catalog.Labels, m.GetExpectedRevision(), m.GetLabels(),
		func(o *catalog.Object[*ctrlv1.EgressSpec]) *ctrlv1.UpdateEgressLabelsResponse {
			return &ctrlv1.UpdateEgressLabelsResponse{Egress: egressMessage(o)}
		}, func() *ctrlv1.UpdateEgressLabelsResponse { return &ctrlv1.UpdateEgressLabelsResponse{} })
	return respond(out, err)
}

// UpdateEgressAnnotations replaces the annotation map under CAS.
func (h *Egresses) UpdateEgressAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateEgressAnnotationsResponse], error) {
	m := req.Msg
	out, err := catalog.UpdateMap(ctx, h.svc, ctrlv1connect.EgressServiceUpdateEgressAnnotationsProcedure, m, m.GetEgressId(), catalog.Annotations, m.GetExpectedRevision(), m.GetAnnotations(),
		func(o *catalog.Object[*ctrlv1.EgressSpec]) *ctrlv1.UpdateEgressAnnotationsResponse {
			return &ctrlv1.UpdateEgressAnnotationsResponse{Egress: egressMessage(o)}
		}, func() *ctrlv1.UpdateEgressAnnotationsResponse { return &ctrlv1.UpdateEgressAnnotationsResponse{} })
	return respond(out, err)
}

func respond[T any](msg *T, err error) (*connect.Response[T], error) {
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(msg), nil
}
