package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/enrollment"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodepeer"
)

// Enrollments serves EnrollmentService (Operator API) and the node-facing
// BootstrapService.
type Enrollments struct {
	svc *enrollment.Service
}

var (
	_ ctrlv1connect.EnrollmentServiceHandler  = (*Enrollments)(nil)
	_ nodev1connect.BootstrapServiceHandler   = (*Enrollments)(nil)
	_ nodev1connect.CertificateServiceHandler = (*Enrollments)(nil)
)

// NewEnrollments returns the handler.
func NewEnrollments(svc *enrollment.Service) *Enrollments { return &Enrollments{svc: svc} }

// CreateEnrollment creates a single-use node enrollment token.
func (h *Enrollments) CreateEnrollment(ctx context.Context, req *connect.Request[ctrlv1.CreateEnrollmentRequest]) (*connect.Response[ctrlv1.CreateEnrollmentResponse], error) {
	out, err := h.svc.Create(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// GetEnrollment reads an enrollment.
func (h *Enrollments) GetEnrollment(ctx context.Context, req *connect.Request[ctrlv1.GetEnrollmentRequest]) (*connect.Response[ctrlv1.GetEnrollmentResponse], error) {
	e, err := h.svc.Get(ctx, req.Msg.GetEnrollmentId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetEnrollmentResponse{Enrollment: e}), nil
}

// ListEnrollments pages through enrollments.
func (h *Enrollments) ListEnrollments(ctx context.Context, req *connect.Request[ctrlv1.ListEnrollmentsRequest]) (*connect.Response[ctrlv1.ListEnrollmentsResponse], error) {
	list, next, err := h.svc.List(ctx, req.Msg.GetPageSize(), req.Msg.GetPageToken())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.ListEnrollmentsResponse{Enrollments: list, NextPageToken: next}), nil
}

// RevokeEnrollment revokes an unused token.
func (h *Enrollments) RevokeEnrollment(ctx context.Context, req *connect.Request[ctrlv1.RevokeEnrollmentRequest]) (*connect.Response[ctrlv1.RevokeEnrollmentResponse], error) {
	e, err := h.svc.Revoke(ctx, req.Msg.GetEnrollmentId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.RevokeEnrollmentResponse{Enrollment: e}), nil
}

// Enroll exchanges a token for a node certificate.
func (h *Enrollments) Enroll(ctx context.Context, req *connect.Request[nodev1.EnrollRequest]) (*connect.Response[nodev1.EnrollResponse], error) {
	out, err := h.svc.Enroll(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// RenewCertificate issues a fresh certificate for the calling node's key.
func (h *Enrollments) RenewCertificate(ctx context.Context, req *connect.Request[nodev1.RenewCertificateRequest]) (*connect.Response[nodev1.RenewCertificateResponse], error) {
	p, ok := nodepeer.From(ctx)
	if !ok {
		return nil, &fault.Error{Kind: fault.KindUnauthenticated, Reason: fault.ReasonPermissionDenied, Message: "a node certificate is required"}
	}
	out, err := h.svc.Renew(ctx, p, req.Msg.GetCsr())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}
