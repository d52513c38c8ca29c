package apierr

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
)

// TestCodeTable pins the mapping of every Kind.
func TestCodeTable(t *testing.T) {
	want := map[fault.Kind]connect.Code{
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
	for k, c := range want {
		if got := Code(k); got != c {
			t.Errorf("Code(%v) = %v, want %v", k, got, c)
		}
	}
	if len(codes) != len(want) {
		t.Errorf("codes has %d entries, the test pins %d", len(codes), len(want))
	}
}

// TestReasonTable checks that every domain reason has its API value.
func TestReasonTable(t *testing.T) {
	reasons := []fault.Reason{
		fault.ReasonInvalidArgument, fault.ReasonInvalidCommandID, fault.ReasonReservedCommandID,
		fault.ReasonCommandIDReused, fault.ReasonNotFound, fault.ReasonRevisionMismatch,
		fault.ReasonExpirationRevisionMismatch, fault.ReasonStateConflict, fault.ReasonConflict,
		fault.ReasonCapacityExhausted, fault.ReasonCapabilityUnavailable, fault.ReasonSessionExpired,
		fault.ReasonTimedOut, fault.ReasonNodeUnreachable, fault.ReasonGuestWritebackFailed,
		fault.ReasonGuestUnresponsive, fault.ReasonExecutionFailed, fault.ReasonEndpointForbidden,
		fault.ReasonPageTokenInvalid, fault.ReasonPermissionDenied, fault.ReasonUnavailable, fault.ReasonInternal,
	}
	for _, r := range reasons {
		got := Reason(r)
		if got.String() != "FAILURE_REASON_"+string(r) {
			t.Errorf("Reason(%s) = %v", r, got)
		}
	}
	if got := Reason(fault.ReasonUnspecified); got != ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
		t.Errorf("Reason(unspecified) = %v", got)
	}
	// Every API value except UNSPECIFIED is reachable from a domain reason.
	if len(reasons) != len(ctrlv1.FailureReason_name)-1 {
		t.Errorf("%d domain reasons for %d API reasons", len(reasons), len(ctrlv1.FailureReason_name)-1)
	}
}

func TestSettled(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{fault.NotFound("egress", "x"), true},
		{fault.RevisionMismatch("expected_revision", 1, 2), true},
		{fault.Precondition(fault.ReasonConflict, "in use"), true},
		{fault.Invalid("f", "bad"), true},
		{fault.Unavailable(fault.ReasonUnavailable, "later"), false},
		{fault.Internal("boom"), false},
		{errors.New("plain"), false},
		{context.Canceled, false},
	}
	for _, tt := range tests {
		if got := Settled(tt.err); got != tt.want {
			t.Errorf("Settled(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestConvertMasksInternal(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ce := Convert(t.Context(), log, "/p", errors.New("pq: password authentication failed for secret-thing"))
	d, ok := kibotos.Detail(ce)
	if !ok || ce.Code() != connect.CodeInternal || strings.Contains(ce.Message(), "secret-thing") {
		t.Fatalf("Convert(internal) = %v (%v)", ce, d)
	}
	if !strings.Contains(logs.String(), "secret-thing") || !strings.Contains(logs.String(), "error_id") {
		t.Fatalf("the original error is not logged with its id: %s", logs.String())
	}
	// Faults keep their message and field.
	ce = Convert(t.Context(), log, "/p", fault.Invalid("spec.socks5.address", "bad address"))
	d, _ = kibotos.Detail(ce)
	if ce.Code() != connect.CodeInvalidArgument || d.GetField() != "spec.socks5.address" || d.GetMessage() != "bad address" {
		t.Fatalf("Convert(fault) = %v %v", ce, d)
	}
	// Framework errors get a detail.
	ce = Convert(t.Context(), log, "/p", connect.NewError(connect.CodeUnimplemented, errors.New("nope")))
	d, _ = kibotos.Detail(ce)
	if d.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE {
		t.Fatalf("unimplemented reason = %v", d.GetReason())
	}
}

func TestEncodeDecode(t *testing.T) {
	fe := fault.RevisionMismatch("expected_revision", 1, 2)
	code, b, err := Encode(fe)
	if err != nil {
		t.Fatal(err)
	}
	ce := Decode(code, b)
	d, _ := kibotos.Detail(ce)
	if ce.Code() != connect.CodeAborted || !d.GetCommandSettled() || d.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH {
		t.Fatalf("Decode(Encode) = %v %v", ce, d)
	}
}
