// Package apierr is the one place that turns domain errors into Connect
// errors. Every error the ctrl API returns carries exactly one
// kibotos.ctrl.v1.ErrorDetail; this package attaches it (a fault's own, see
// fault.Error.Detail), and its interceptor makes sure no error leaves a
// handler without one. The domain packages (internal/command,
// internal/workspace, internal/catalog, ...) do not speak Connect: they
// return faults, recorded failures included (deps_test.go checks it).
//
// Internal errors are masked at the edge: the caller gets an error ID, the
// log gets the original.
package apierr

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
)

// codes maps each fault Kind to its Connect code.
var codes = map[fault.Kind]connect.Code{
	fault.KindInternal:           connect.CodeInternal,
	fault.KindInvalidArgument:    connect.CodeInvalidArgument,
	fault.KindNotFound:           connect.CodeNotFound,
	fault.KindAlreadyExists:      connect.CodeAlreadyExists,
	fault.KindFailedPrecondition: connect.CodeFailedPrecondition,
	fault.KindAborted:            connect.CodeAborted,
	fault.KindResourceExhausted:  connect.CodeResourceExhausted,
	fault.KindUnavailable:        connect.CodeUnavailable,
	fault.KindDeadlineExceeded:   connect.CodeDeadlineExceeded,
	fault.KindPermissionDenied:   connect.CodePermissionDenied,
	fault.KindUnauthenticated:    connect.CodeUnauthenticated,
	fault.KindUnimplemented:      connect.CodeUnimplemented,
}

// Code returns the Connect code of a fault Kind.
func Code(k fault.Kind) connect.Code {
	if c, ok := codes[k]; ok {
		return c
	}
	return connect.CodeInternal
}

// FromFault returns the Connect error of a fault: its Kind's code and its
// ErrorDetail (command_settled when the fault is a command's recorded
// result).
func FromFault(fe *fault.Error) *connect.Error {
	return FromDetail(Code(fe.Kind), fe.Detail())
}

// FromDetail returns a Connect error carrying d.
func FromDetail(code connect.Code, d *ctrlv1.ErrorDetail) *connect.Error {
	ce := connect.NewError(code, errors.New(d.GetMessage()))
	if ed, err := connect.NewErrorDetail(d); err == nil {
		ce.AddDetail(ed)
	}
	return ce
}

// defaultReasons gives errors that carry no detail (produced by the
// framework, not by Kibotos code) a reason.
var defaultReasons = map[connect.Code]ctrlv1.FailureReason{
	connect.CodeInvalidArgument:    ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT,
	connect.CodeNotFound:           ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND,
	connect.CodeUnimplemented:      ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE,
	connect.CodeUnauthenticated:    ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED,
	connect.CodePermissionDenied:   ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED,
	connect.CodeDeadlineExceeded:   ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT,
	connect.CodeCanceled:           ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE,
	connect.CodeUnavailable:        ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE,
	connect.CodeResourceExhausted:  ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED,
	connect.CodeFailedPrecondition: ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT,
	connect.CodeAborted:            ctrlv1.FailureReason_FAILURE_REASON_CONFLICT,
}

// retryableCodes are the codes a resend can fix without changing anything.
var retryableCodes = map[connect.Code]bool{
	connect.CodeUnavailable:      true,
	connect.CodeDeadlineExceeded: true,
	connect.CodeCanceled:         true,
}

// Convert turns any error into a Connect error with an ErrorDetail. Faults
// map through the table; Connect errors without a detail get one; anything
// else is an internal error whose message is replaced by an error ID (the
// original goes to log).
func Convert(ctx context.Context, log *slog.Logger, procedure string, err error) *connect.Error {
	if err == nil {
		return nil
	}
	if fe, ok := fault.As(err); ok && fe.Kind != fault.KindInternal {
		return FromFault(fe)
	}
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() != connect.CodeInternal && ce.Code() != connect.CodeUnknown {
		if _, ok := kibotos.Detail(ce); ok {
			return ce
		}
		reason, ok := defaultReasons[ce.Code()]
		if !ok {
			reason = ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED
		}
		out := FromDetail(ce.Code(), &ctrlv1.ErrorDetail{
			Reason:    reason,
			Retryable: retryableCodes[ce.Code()],
			Message:   ce.Message(),
		})
		for k, v := range ce.Meta() {
			out.Meta()[k] = v
		}
		return out
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		code := connect.CodeCanceled
		if errors.Is(err, context.DeadlineExceeded) {
			code = connect.CodeDeadlineExceeded
		}
		return FromDetail(code, &ctrlv1.ErrorDetail{Reason: defaultReasons[code], Retryable: true, Message: "request " + code.String()})
	}
	id := newErrorID()
	if log != nil {
		log.ErrorContext(ctx, "internal error", "procedure", procedure, "error_id", id, "error", err.Error())
	}
	return FromDetail(connect.CodeInternal, &ctrlv1.ErrorDetail{
		Reason:    ctrlv1.FailureReason_FAILURE_REASON_INTERNAL,
		Retryable: true,
		Message:   "internal error; quote error id " + id,
	})
}

func newErrorID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewInterceptor returns the interceptor that passes every handler error
// through Convert.
func NewInterceptor(log *slog.Logger) connect.Interceptor {
	return interceptor{log: log}
}

type interceptor struct{ log *slog.Logger }

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		if err != nil {
			return nil, Convert(ctx, i.log, req.Spec().Procedure, err)
		}
		return res, nil
	}
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := next(ctx, conn); err != nil {
			return Convert(ctx, i.log, conn.Spec().Procedure, err)
		}
		return nil
	}
}
