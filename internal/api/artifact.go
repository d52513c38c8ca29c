package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/artifact"
)

// Artifacts serves ArtifactService (Operator API).
type Artifacts struct {
	svc *artifact.Service
}

var _ ctrlv1connect.ArtifactServiceHandler = (*Artifacts)(nil)

// NewArtifacts returns the handler.
func NewArtifacts(svc *artifact.Service) *Artifacts { return &Artifacts{svc: svc} }

// BeginArtifactPublication opens a publication.
func (h *Artifacts) BeginArtifactPublication(ctx context.Context, req *connect.Request[ctrlv1.BeginArtifactPublicationRequest]) (*connect.Response[ctrlv1.BeginArtifactPublicationResponse], error) {
	p, err := h.svc.Begin(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.BeginArtifactPublicationResponse{Publication: p}), nil
}

// UploadArtifactContent appends bytes to a publication.
func (h *Artifacts) UploadArtifactContent(ctx context.Context, req *connect.Request[ctrlv1.UploadArtifactContentRequest]) (*connect.Response[ctrlv1.UploadArtifactContentResponse], error) {
	p, err := h.svc.Upload(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.UploadArtifactContentResponse{Publication: p}), nil
}

// CommitArtifactPublication writes a publication's manifest.
func (h *Artifacts) CommitArtifactPublication(ctx context.Context, req *connect.Request[ctrlv1.CommitArtifactPublicationRequest]) (*connect.Response[ctrlv1.CommitArtifactPublicationResponse], error) {
	out, err := h.svc.Commit(ctx, req.Msg.GetCommandId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// GetArtifactPublication reads a publication.
func (h *Artifacts) GetArtifactPublication(ctx context.Context, req *connect.Request[ctrlv1.GetArtifactPublicationRequest]) (*connect.Response[ctrlv1.GetArtifactPublicationResponse], error) {
	p, err := h.svc.GetPublication(ctx, req.Msg.GetCommandId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetArtifactPublicationResponse{Publication: p}), nil
}

// ListArtifacts lists the Templates or Platforms.
func (h *Artifacts) ListArtifacts(ctx context.Context, req *connect.Request[ctrlv1.ListArtifactsRequest]) (*connect.Response[ctrlv1.ListArtifactsResponse], error) {
	list, err := h.svc.List(ctx, req.Msg.GetKind())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.ListArtifactsResponse{Artifacts: list}), nil
}

// GetArtifact reads a Template or Platform.
func (h *Artifacts) GetArtifact(ctx context.Context, req *connect.Request[ctrlv1.GetArtifactRequest]) (*connect.Response[ctrlv1.GetArtifactResponse], error) {
	a, err := h.svc.Get(ctx, req.Msg.GetArtifact())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetArtifactResponse{Artifact: a}), nil
}

// ListArtifactVersions lists an artifact's versions, newest first.
func (h *Artifacts) ListArtifactVersions(ctx context.Context, req *connect.Request[ctrlv1.ListArtifactVersionsRequest]) (*connect.Response[ctrlv1.ListArtifactVersionsResponse], error) {
	list, err := h.svc.Versions(ctx, req.Msg.GetArtifact(), req.Msg.GetIncludeReclaimed())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.ListArtifactVersionsResponse{Versions: list}), nil
}

// SetTemplateDefault moves a Template's default.
func (h *Artifacts) SetTemplateDefault(ctx context.Context, req *connect.Request[ctrlv1.SetTemplateDefaultRequest]) (*connect.Response[ctrlv1.SetTemplateDefaultResponse], error) {
	out, err := h.svc.SetTemplateDefault(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// SetPlatformDefault moves a Platform's default.
func (h *Artifacts) SetPlatformDefault(ctx context.Context, req *connect.Request[ctrlv1.SetPlatformDefaultRequest]) (*connect.Response[ctrlv1.SetPlatformDefaultResponse], error) {
	out, err := h.svc.SetPlatformDefault(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// RetainLaunchRevision keeps a version from reclamation.
func (h *Artifacts) RetainLaunchRevision(ctx context.Context, req *connect.Request[ctrlv1.RetainLaunchRevisionRequest]) (*connect.Response[ctrlv1.RetainLaunchRevisionResponse], error) {
	v, err := h.svc.Retain(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.RetainLaunchRevisionResponse{Version: v}), nil
}

// ApplyArtifactReclamation reclaims a version.
func (h *Artifacts) ApplyArtifactReclamation(ctx context.Context, req *connect.Request[ctrlv1.ApplyArtifactReclamationRequest]) (*connect.Response[ctrlv1.ApplyArtifactReclamationResponse], error) {
	out, err := h.svc.Reclaim(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}
