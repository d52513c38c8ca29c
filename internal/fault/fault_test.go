package fault

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

func TestParseKind(t *testing.T) {
	for k := range Kind(len(kindNames)) {
		if got, ok := ParseKind(k.String()); !ok || got != k {
			t.Errorf("ParseKind(%q) = %v, %v, want %v", k.String(), got, ok, k)
		}
	}
	if got, ok := ParseKind("data_loss"); ok || got != KindInternal {
		t.Errorf("ParseKind(data_loss) = %v, %v, want internal, false", got, ok)
	}
}

// TestReasonTable checks that every domain reason has its API value and
// back.
func TestReasonTable(t *testing.T) {
	reasons := []Reason{
		ReasonInvalidArgument, ReasonInvalidCommandID, ReasonReservedCommandID,
		ReasonCommandIDReused, ReasonNotFound, ReasonRevisionMismatch,
		ReasonExpirationRevisionMismatch, ReasonStateConflict, ReasonConflict,
		ReasonCapacityExhausted, ReasonCapabilityUnavailable, ReasonSessionExpired,
		ReasonTimedOut, ReasonNodeUnreachable, ReasonGuestWritebackFailed,
		ReasonGuestUnresponsive, ReasonExecutionFailed, ReasonEndpointForbidden,
		ReasonPageTokenInvalid, ReasonPermissionDenied, ReasonUnavailable, ReasonInternal,
	}
	for _, r := range reasons {
		got := r.Enum()
		if got.String() != "FAILURE_REASON_"+string(r) {
			t.Errorf("%s.Enum() = %v", r, got)
		}
		if back := ReasonOf(got); back != r {
			t.Errorf("ReasonOf(%v) = %q, want %q", got, back, r)
		}
	}
	if got := ReasonUnspecified.Enum(); got != ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
		t.Errorf("unspecified.Enum() = %v", got)
	}
	if got := ReasonOf(ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED); got != ReasonUnspecified {
		t.Errorf("ReasonOf(UNSPECIFIED) = %q", got)
	}
	if got := Reason("NO_SUCH_REASON").Enum(); got != ctrlv1.FailureReason_FAILURE_REASON_INTERNAL {
		t.Errorf("unknown reason .Enum() = %v, want INTERNAL", got)
	}
	// Every API value except UNSPECIFIED is reachable from a domain reason.
	if len(reasons) != len(ctrlv1.FailureReason_name)-1 {
		t.Errorf("%d domain reasons for %d API reasons", len(reasons), len(ctrlv1.FailureReason_name)-1)
	}
}

// TestDetailFields: a fault carries every field of ErrorDetail that Kibotos
// sets, so that a recorded failure replays exactly as it was recorded. A new
// ErrorDetail field must be carried (or listed here as not set by ctrl).
func TestDetailFields(t *testing.T) {
	carried := []string{"reason", "retryable", "command_settled", "message", "stage", "field", "observed_workspace", "observed_volume"}
	notSet := []string{"accepted_bytes"}
	fields := (&ctrlv1.ErrorDetail{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		name := string(fields.Get(i).Name())
		if !slices.Contains(carried, name) && !slices.Contains(notSet, name) {
			t.Errorf("ErrorDetail.%s is new: carry it in fault.Error (Detail, FromDetail) or list it as not set", name)
		}
	}
	d := &ctrlv1.ErrorDetail{}
	for _, name := range carried {
		f := fields.ByName(protoreflect.Name(name))
		switch f.Kind() {
		case protoreflect.BoolKind:
			d.ProtoReflect().Set(f, protoreflect.ValueOfBool(true))
		case protoreflect.StringKind:
			d.ProtoReflect().Set(f, protoreflect.ValueOfString(name+" value"))
		case protoreflect.EnumKind:
			d.ProtoReflect().Set(f, protoreflect.ValueOfEnum(ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH.Number()))
		case protoreflect.MessageKind:
			var m protoreflect.ProtoMessage = &ctrlv1.Workspace{WorkspaceId: "ws-1"}
			if name == "observed_volume" {
				m = &ctrlv1.Volume{VolumeId: "vol-1"}
			}
			d.ProtoReflect().Set(f, protoreflect.ValueOfMessage(m.ProtoReflect()))
		default:
			t.Fatalf("ErrorDetail.%s: kind %v not handled by the test", name, f.Kind())
		}
	}
	if diff := cmp.Diff(d, FromDetail(KindAborted, d).Detail(), protocmp.Transform()); diff != "" {
		t.Errorf("FromDetail(d).Detail() differs from d (-want +got):\n%s", diff)
	}
}

func TestEncodeDecode(t *testing.T) {
	fe := Precondition(ReasonStateConflict, "stop is not accepted")
	fe.Field, fe.Stage = "workspace_id", "admission"
	fe.ObservedWorkspace = &ctrlv1.Workspace{WorkspaceId: "ws-1"}
	code, b, err := Encode(fe)
	if err != nil {
		t.Fatal(err)
	}
	if code != "failed_precondition" {
		t.Errorf("Encode code = %q, want failed_precondition", code)
	}
	if fe.Settled {
		t.Error("Encode changed its argument")
	}
	got := Decode(code, b)
	want := *fe
	want.Settled = true
	if diff := cmp.Diff(&want, got, protocmp.Transform()); diff != "" {
		t.Errorf("Decode(Encode(fe)) (-want +got):\n%s", diff)
	}

	// Settled is what the record says.
	plain, _ := proto.Marshal(&ctrlv1.ErrorDetail{Message: "m"})
	if got := Decode("unavailable", plain); got.Kind != KindUnavailable || got.Settled || got.Message != "m" {
		t.Errorf("Decode(unsettled record) = %+v", got)
	}
	// Unreadable records are internal.
	if got := Decode("nonsense", []byte{0xff}); got.Kind != KindInternal || got.Reason != ReasonInternal || !got.Settled {
		t.Errorf("Decode(garbage) = %+v", got)
	}
}
