package kibotos_test

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// withDetail builds the error a ctrl server returns.
func withDetail(code connect.Code, d *ctrlv1.ErrorDetail) *connect.Error {
	ce := connect.NewError(code, errors.New(d.GetMessage()))
	ed, err := connect.NewErrorDetail(d)
	if err != nil {
		panic(err)
	}
	ce.AddDetail(ed)
	return ce
}

func TestErrorAccessors(t *testing.T) {
	notFound := &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, CommandSettled: true, Message: "egress not found"}
	storeDown := &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE, Retryable: true, Message: "store unavailable"}
	timedOut := &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT, Retryable: true}
	invalid := &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, Field: "spec.socks5.address"}
	unavailableNotRetryable := &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_NODE_UNREACHABLE}
	settledRetryable := &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, Retryable: true, CommandSettled: true}
	tests := []struct {
		name      string
		err       error
		detail    *ctrlv1.ErrorDetail
		reason    ctrlv1.FailureReason
		retryable bool
		settled   bool
	}{
		{"nil", nil, nil, 0, false, false},
		{"plain error", errors.New("boom"), nil, 0, true, false},
		{"settled not_found", withDetail(connect.CodeNotFound, notFound), notFound, notFound.Reason, false, true},
		{"wrapped", fmt.Errorf("get: %w", withDetail(connect.CodeNotFound, notFound)), notFound, notFound.Reason, false, true},
		{"retryable unsettled", withDetail(connect.CodeUnavailable, storeDown), storeDown, storeDown.Reason, true, false},
		{"timed out", withDetail(connect.CodeUnavailable, timedOut), timedOut, timedOut.Reason, true, false},
		{"invalid argument", withDetail(connect.CodeInvalidArgument, invalid), invalid, invalid.Reason, false, false},
		{"unavailable marked not retryable: result unknown", withDetail(connect.CodeUnavailable, unavailableNotRetryable), unavailableNotRetryable, unavailableNotRetryable.Reason, true, false},
		{"settled wins over retryable", withDetail(connect.CodeResourceExhausted, settledRetryable), settledRetryable, settledRetryable.Reason, false, true},
		{"transport failure", connect.NewError(connect.CodeUnavailable, errors.New("connection refused")), nil, 0, true, false},
		{"deadline without detail", connect.NewError(connect.CodeDeadlineExceeded, errors.New("deadline")), nil, 0, true, false},
		{"unimplemented without detail", connect.NewError(connect.CodeUnimplemented, errors.New("404")), nil, 0, false, false},
		{"unauthenticated without detail", connect.NewError(connect.CodeUnauthenticated, errors.New("401")), nil, 0, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, ok := kibotos.Detail(tt.err)
			if ok != (tt.detail != nil) {
				t.Fatalf("Detail(%v) ok = %v, want %v", tt.err, ok, tt.detail != nil)
			}
			if diff := cmp.Diff(tt.detail, d, protocmp.Transform()); diff != "" {
				t.Errorf("Detail(%v) mismatch (-want +got):\n%s", tt.err, diff)
			}
			if got := kibotos.Reason(tt.err); got != tt.reason {
				t.Errorf("Reason(%v) = %v, want %v", tt.err, got, tt.reason)
			}
			if got := kibotos.IsRetryable(tt.err); got != tt.retryable {
				t.Errorf("IsRetryable(%v) = %v, want %v", tt.err, got, tt.retryable)
			}
			if got := kibotos.IsSettled(tt.err); got != tt.settled {
				t.Errorf("IsSettled(%v) = %v, want %v", tt.err, got, tt.settled)
			}
		})
	}
}

func TestCommandError(t *testing.T) {
	if err := kibotos.CommandError(nil); err != nil {
		t.Fatalf("CommandError(nil) = %v, want nil", err)
	}
	d := &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED, CommandSettled: true, Message: "guest did not boot", Stage: "start"}
	err := kibotos.CommandError(&ctrlv1.CommandError{Code: "failed_precondition", Detail: d})
	if got := connect.CodeOf(err); got != connect.CodeFailedPrecondition {
		t.Errorf("CodeOf(CommandError) = %v, want failed_precondition", got)
	}
	got, ok := kibotos.Detail(err)
	if !ok {
		t.Fatalf("Detail(CommandError) found none")
	}
	if diff := cmp.Diff(d, got, protocmp.Transform()); diff != "" {
		t.Errorf("Detail(CommandError) mismatch (-want +got):\n%s", diff)
	}
	if !kibotos.IsSettled(err) || kibotos.IsRetryable(err) {
		t.Errorf("CommandError: IsSettled = %v, IsRetryable = %v; want true, false", kibotos.IsSettled(err), kibotos.IsRetryable(err))
	}
	if got := connect.CodeOf(kibotos.CommandError(&ctrlv1.CommandError{Code: "no such code"})); got != connect.CodeUnknown {
		t.Errorf("CodeOf(CommandError with a bad code) = %v, want unknown", got)
	}
}
