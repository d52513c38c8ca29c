package apierr

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

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
		// A recorded failure stores its Kind's name, which the API shows
		// as the code (WorkspaceCommand.error.code).
		if k.String() != c.String() {
			t.Errorf("Kind %v is named unlike its code %v", k, c)
		}
	}
	if len(codes) != len(want) {
		t.Errorf("codes has %d entries, the test pins %d", len(codes), len(want))
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

// TestRecorded: a recorded failure reaches the wire as it was recorded:
// the code of its Kind, and the stored ErrorDetail unchanged.
func TestRecorded(t *testing.T) {
	fe := fault.RevisionMismatch("expected_revision", 1, 2)
	fe.Stage = "admission"
	fe.ObservedWorkspace = &ctrlv1.Workspace{WorkspaceId: "ws-1", State: ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED}
	code, b, err := fault.Encode(fe)
	if err != nil {
		t.Fatal(err)
	}
	stored := &ctrlv1.ErrorDetail{}
	if err := proto.Unmarshal(b, stored); err != nil {
		t.Fatal(err)
	}
	ce := FromFault(fault.Decode(code, b))
	d, _ := kibotos.Detail(ce)
	if ce.Code().String() != code || ce.Code() != connect.CodeAborted || ce.Message() != fe.Message {
		t.Errorf("FromFault(Decode(Encode)) = %v, want aborted %q", ce, fe.Message)
	}
	if diff := cmp.Diff(stored, d, protocmp.Transform()); diff != "" || !d.GetCommandSettled() {
		t.Errorf("detail differs from the recorded one (-recorded +wire):\n%s", diff)
	}
	// A fault that is not a recorded result is not settled.
	if d, _ := kibotos.Detail(Convert(t.Context(), nil, "/p", fe)); d.GetCommandSettled() {
		t.Error("a fresh fault is marked command_settled")
	}
}
