package api

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/catalog"
	"github.com/kibotos/kibotos/internal/egress"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/reconciler"
	"github.com/kibotos/kibotos/internal/store"
)

// Resolvers serves ResolverService.
type Resolvers struct {
	svc *catalog.Service[*ctrlv1.ResolverSpec]
	// OnUpdate, when set, runs after an UpdateResolver succeeded: the
	// reconciler's Kick (see Egresses.OnUpdate).
	OnUpdate func()
}

var _ ctrlv1connect.ResolverServiceHandler = (*Resolvers)(nil)

// ResolverType describes Resolvers to the catalog. An update that changes
// the spec moves the generation of every running Workspace whose policy
// uses the Resolver (reconciler.Repush); the switch has no drain.
func ResolverType(checker *netguard.Checker) catalog.ObjectType[*ctrlv1.ResolverSpec] {
	return catalog.ObjectType[*ctrlv1.ResolverSpec]{
		ResourceKind: store.KindResolver, Noun: "resolver", IDPrefix: "rs-", IDField: "resolver_id",
		NewSpec:  func() *ctrlv1.ResolverSpec { return &ctrlv1.ResolverSpec{} },
		Validate: egress.ValidateResolverSpec,
		Check: func(ctx context.Context, field string, s *ctrlv1.ResolverSpec) error {
			return egress.CheckResolverEndpoint(ctx, checker, field, s)
		},
		AfterUpdate: func(ctx context.Context, tx store.Tx, id string, _ *store.Resource) error {
			_, err := reconciler.Repush(ctx, tx, id, store.RefResolver)
			return err
		},
		DeleteRefs: []store.RefKind{store.RefResolver},
	}
}

// NewResolvers returns the ResolverService handler.
func NewResolvers(svc *catalog.Service[*ctrlv1.ResolverSpec]) *Resolvers { return &Resolvers{svc: svc} }

func resolverMessage(o *catalog.Object[*ctrlv1.ResolverSpec]) *ctrlv1.Resolver {
	return &ctrlv1.Resolver{
		ResolverId: o.ID, Spec: o.Spec, Revision: o.Revision,
		CreatedAt: ts(o.CreatedAt), UpdatedAt: ts(o.UpdatedAt),
		Labels: o.Labels, LabelsRevision: o.LabelsRevision,
		Annotations: o.Annotations, AnnotationsRevision: o.AnnotationsRevision,
	}
}

func sameResolver(a, b *ctrlv1.ResolverSpec) bool { return proto.Equal(a, b) }

// CreateResolver stores a new Resolver.
func (h *Resolvers) CreateResolver(ctx context.Context, req *connect.Request[ctrlv1.CreateResolverRequest]) (*connect.Response[ctrlv1.CreateResolverResponse], error) {
	m := req.Msg
	out, err := catalog.Create(ctx, h.svc, ctrlv1connect.ResolverServiceCreateResolverProcedure, m, m.GetSpec(), m.GetLabels(), m.GetAnnotations(),
		func(o *catalog.Object[*ctrlv1.ResolverSpec]) *ctrlv1.CreateResolverResponse {
			return &ctrlv1.CreateResolverResponse{Resolver: resolverMessage(o)}
		}, func() *ctrlv1.CreateResolverResponse { return &ctrlv1.CreateResolverResponse{} })
	return respond(out, err)
}

// GetResolver reads one Resolver.
func (h *Resolvers) GetResolver(ctx context.Context, req *connect.Request[ctrlv1.GetResolverRequest]) (*connect.Response[ctrlv1.GetResolverResponse], error) {
	o, err := h.svc.Get(ctx, req.Msg.GetResolverId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetResolverResponse{Resolver: resolverMessage(o)}), nil
}

// ListResolvers lists one page of Resolvers.
func (h *Resolvers) ListResolvers(ctx context.Context, req *connect.Request[ctrlv1.ListResolversRequest]) (*connect.Response[ctrlv1.ListResolversResponse], error) {
	m := req.Msg
	objs, next, err := h.svc.List(ctx, m.GetPageSize(), m.GetPageToken(), m.GetLabelSelector())
	if err != nil {
		return nil, err
	}
	out := &ctrlv1.ListResolversResponse{NextPageToken: next, Resolvers: make([]*ctrlv1.Resolver, len(objs))}
	for i, o := range objs {
		out.Resolvers[i] = resolverMessage(o)
	}
	return connect.NewResponse(out), nil
}

// UpdateResolver replaces a Resolver's spec under CAS.
func (h *Resolvers) UpdateResolver(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverRequest]) (*connect.Response[ctrlv1.UpdateResolverResponse], error) {
	m := req.Msg
	out, err := catalog.Update(ctx, h.svc, ctrlv1connect.ResolverServiceUpdateResolverProcedure, m, m.GetResolverId(), m.GetExpectedRevision(), m.GetSpec(), 0, sameResolver,
		func(o *catalog.Object[*ctrlv1.ResolverSpec]) *ctrlv1.UpdateResolverResponse {
			return &ctrlv1.UpdateResolverResponse{Resolver: resolverMessage(o)}
		}, func() *ctrlv1.UpdateResolverResponse { return &ctrlv1.UpdateResolverResponse{} })
	if err == nil && h.OnUpdate != nil {
		h.OnUpdate()
	}
	return respond(out, err)
}

// DeleteResolver deletes an unreferenced Resolver.
func (h *Resolvers) DeleteResolver(ctx context.Context, req *connect.Request[ctrlv1.DeleteResolverRequest]) (*connect.Response[ctrlv1.DeleteResolverResponse], error) {
	out, err := catalog.Delete(ctx, h.svc, ctrlv1connect.ResolverServiceDeleteResolverProcedure, req.Msg, req.Msg.GetResolverId(),
		func() *ctrlv1.DeleteResolverResponse { return &ctrlv1.DeleteResolverResponse{} })
	return respond(out, err)
}

// UpdateResolverLabels replaces the label map under CAS.
func (h *Resolvers) UpdateResolverLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverLabelsRequest]) (*connect.Response[ctrlv1.UpdateResolverLabelsResponse], error) {
	m := req.Msg
	out, err := catalog.UpdateMap(ctx, h.svc, ctrlv1connect.ResolverServiceUpdateResolverLabelsProcedure, m, m.GetResolverId(), catalog.Labels, m.GetExpectedRevision(), m.GetLabels(),
		func(o *catalog.Object[*ctrlv1.ResolverSpec]) *ctrlv1.UpdateResolverLabelsResponse {
			return &ctrlv1.UpdateResolverLabelsResponse{Resolver: resolverMessage(o)}
		}, func() *ctrlv1.UpdateResolverLabelsResponse { return &ctrlv1.UpdateResolverLabelsResponse{} })
	return respond(out, err)
}

// UpdateResolverAnnotations replaces the annotation map under CAS.
func (h *Resolvers) UpdateResolverAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateResolverAnnotationsResponse], error) {
	m := req.Msg
	out, err := catalog.UpdateMap(ctx, h.svc, ctrlv1connect.ResolverServiceUpdateResolverAnnotationsProcedure, m, m.GetResolverId(), catalog.Annotations, m.GetExpectedRevision(), m.GetAnnotations(),
		func(o *catalog.Object[*ctrlv1.ResolverSpec]) *ctrlv1.UpdateResolverAnnotationsResponse {
			return &ctrlv1.UpdateResolverAnnotationsResponse{Resolver: resolverMessage(o)}
		}, func() *ctrlv1.UpdateResolverAnnotationsResponse { return &ctrlv1.UpdateResolverAnnotationsResponse{} })
	return respond(out, err)
}
