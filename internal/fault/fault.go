// Package fault defines the domain error type that every Kibotos package
// returns. A fault says what went wrong in domain terms (a Kind, a Reason, the
// offending field); internal/apierr is the one place that turns it into a
// Connect error.
//
// A fault's public form is a kibotos.ctrl.v1.ErrorDetail (Detail); a failure
// recorded with a command ID is stored as its Kind's name and that encoded
// detail (Encode), and read back as a fault whose Settled flag is set
// (Decode). Domain packages record and replay failures with these, without
// any transport.
//
// Messages must never contain secrets: callers build them from field names
// and public values only.
package fault

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// Kind is the class of failure. Each Kind maps to exactly one Connect code in
// internal/apierr, and its name is that code's name.
type Kind int

const (
	KindInternal Kind = iota
	KindInvalidArgument
	KindNotFound
	KindAlreadyExists
	KindFailedPrecondition
	KindAborted
	KindResourceExhausted
	KindUnavailable
	KindDeadlineExceeded
	KindPermissionDenied
	KindUnauthenticated
	KindUnimplemented
)

var kindNames = [...]string{
	KindInternal:           "internal",
	KindInvalidArgument:    "invalid_argument",
	KindNotFound:           "not_found",
	KindAlreadyExists:      "already_exists",
	KindFailedPrecondition: "failed_precondition",
	KindAborted:            "aborted",
	KindResourceExhausted:  "resource_exhausted",
	KindUnavailable:        "unavailable",
	KindDeadlineExceeded:   "deadline_exceeded",
	KindPermissionDenied:   "permission_denied",
	KindUnauthenticated:    "unauthenticated",
	KindUnimplemented:      "unimplemented",
}

func (k Kind) String() string {
	if int(k) >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// ParseKind returns the Kind named name (its String).
func ParseKind(name string) (Kind, bool) {
	for k, n := range kindNames {
		if n == name {
			return Kind(k), true
		}
	}
	return KindInternal, false
}

// Reason is the fine-grained cause, mirrored one to one by the FailureReason
// enum of the public API.
type Reason string

const (
	ReasonUnspecified                Reason = ""
	ReasonInvalidArgument            Reason = "INVALID_ARGUMENT"
	ReasonInvalidCommandID           Reason = "INVALID_COMMAND_ID"
	ReasonReservedCommandID          Reason = "RESERVED_COMMAND_ID"
	ReasonCommandIDReused            Reason = "COMMAND_ID_REUSED"
	ReasonNotFound                   Reason = "NOT_FOUND"
	ReasonRevisionMismatch           Reason = "REVISION_MISMATCH"
	ReasonExpirationRevisionMismatch Reason = "EXPIRATION_REVISION_MISMATCH"
	ReasonStateConflict              Reason = "STATE_CONFLICT"
	ReasonConflict                   Reason = "CONFLICT"
	ReasonCapacityExhausted          Reason = "CAPACITY_EXHAUSTED"
	ReasonCapabilityUnavailable      Reason = "CAPABILITY_UNAVAILABLE"
	ReasonSessionExpired             Reason = "SESSION_EXPIRED"
	ReasonTimedOut                   Reason = "TIMED_OUT"
	ReasonNodeUnreachable            Reason = "NODE_UNREACHABLE"
	ReasonGuestWritebackFailed       Reason = "GUEST_WRITEBACK_FAILED"
	ReasonGuestUnresponsive          Reason = "GUEST_UNRESPONSIVE"
	ReasonExecutionFailed            Reason = "EXECUTION_FAILED"
	ReasonEndpointForbidden          Reason = "ENDPOINT_FORBIDDEN"
	ReasonPageTokenInvalid           Reason = "PAGE_TOKEN_INVALID"
	ReasonPermissionDenied           Reason = "PERMISSION_DENIED"
	ReasonUnavailable                Reason = "UNAVAILABLE"
	ReasonInternal                   Reason = "INTERNAL"
)

const enumPrefix = "FAILURE_REASON_"

// Enum returns the FailureReason of the public API; INTERNAL for a reason
// the API does not know.
func (r Reason) Enum() ctrlv1.FailureReason {
	if r == ReasonUnspecified {
		return ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED
	}
	v, ok := ctrlv1.FailureReason_value[enumPrefix+string(r)]
	if !ok {
		return ctrlv1.FailureReason_FAILURE_REASON_INTERNAL
	}
	return ctrlv1.FailureReason(v)
}

// ReasonOf returns the domain reason of a FailureReason of the public API.
func ReasonOf(r ctrlv1.FailureReason) Reason {
	if r == ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
		return ReasonUnspecified
	}
	return Reason(strings.TrimPrefix(r.String(), enumPrefix))
}

// Error is a domain failure.
type Error struct {
	Kind   Kind
	Reason Reason
	// Field is the path of the offending request field (for example
	// "spec.socks5.address"), when one is to blame.
	Field string
	// Message is human readable and never contains a secret.
	Message string
	// Retryable reports whether resending the same request can succeed.
	Retryable bool
	// Stage names where the failure happened: "admission", "placement", ...
	Stage string
	// ObservedWorkspace is the Workspace as it was when the request
	// failed, for a refusal by its state or one of its revisions: the
	// caller tells the two apart with it and decides what to do next.
	ObservedWorkspace *ctrlv1.Workspace
	// ObservedVolume is the Volume as it was when the request failed, for
	// a refusal by its state (or by a binding that names it).
	ObservedVolume *ctrlv1.Volume
	// Settled marks the recorded result of a command ID: every resend of
	// the same request gets it again (command_settled in the API).
	Settled bool
}

func (e *Error) Error() string {
	var s string
	if e.Field != "" {
		s = e.Field + ": "
	}
	s += e.Message
	if e.Reason != ReasonUnspecified {
		s += " (" + string(e.Reason) + ")"
	}
	return s
}

// Detail returns the public form of e.
func (e *Error) Detail() *ctrlv1.ErrorDetail {
	return &ctrlv1.ErrorDetail{
		Reason:         e.Reason.Enum(),
		Retryable:      e.Retryable,
		CommandSettled: e.Settled,
		Message:        e.Message,
		Stage:          e.Stage,
		Field:          e.Field,

		ObservedWorkspace: e.ObservedWorkspace,
		ObservedVolume:    e.ObservedVolume,
	}
}

// FromDetail returns the fault of kind whose public form is d.
func FromDetail(kind Kind, d *ctrlv1.ErrorDetail) *Error {
	return &Error{
		Kind:              kind,
		Reason:            ReasonOf(d.GetReason()),
		Field:             d.GetField(),
		Message:           d.GetMessage(),
		Retryable:         d.GetRetryable(),
		Stage:             d.GetStage(),
		ObservedWorkspace: d.GetObservedWorkspace(),
		ObservedVolume:    d.GetObservedVolume(),
		Settled:           d.GetCommandSettled(),
	}
}

// Encode returns the recorded form of a command's failure: the name of its
// Kind and its encoded ErrorDetail, with command_settled set.
func Encode(e *Error) (code string, detail []byte, err error) {
	d := e.Detail()
	d.CommandSettled = true
	b, err := proto.Marshal(d)
	return e.Kind.String(), b, err
}

// Decode returns the fault of a recorded failure (see Encode). Settled is
// what the record says; an unreadable record is an internal fault.
func Decode(code string, detail []byte) *Error {
	k, ok := ParseKind(code)
	if !ok {
		k = KindInternal
	}
	d := &ctrlv1.ErrorDetail{}
	if err := proto.Unmarshal(detail, d); err != nil {
		d = &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_INTERNAL, Message: "stored error detail unreadable", CommandSettled: true}
	}
	return FromDetail(k, d)
}

// As returns the *Error in err's chain.
func As(err error) (*Error, bool) {
	var fe *Error
	ok := errors.As(err, &fe)
	return fe, ok
}

// KindOf returns the Kind of err, KindInternal when err is not a fault.
func KindOf(err error) Kind {
	if fe, ok := As(err); ok {
		return fe.Kind
	}
	return KindInternal
}

// Invalid reports a malformed request field.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Kind: KindInvalidArgument, Reason: ReasonInvalidArgument, Field: field, Message: fmt.Sprintf(format, args...)}
}

// InvalidReason is Invalid with a more specific reason.
func InvalidReason(reason Reason, field, format string, args ...any) *Error {
	e := Invalid(field, format, args...)
	e.Reason = reason
	return e
}

// NotFound reports a missing object.
func NotFound(what, id string) *Error {
	return &Error{Kind: KindNotFound, Reason: ReasonNotFound, Message: fmt.Sprintf("%s %q not found", what, id)}
}

// RevisionMismatch reports a failed compare-and-swap on a revision other than
// the expiration revision.
func RevisionMismatch(field string, want, have uint64) *Error {
	return &Error{Kind: KindAborted, Reason: ReasonRevisionMismatch, Field: field,
		Message: fmt.Sprintf("expected revision %d, current revision is %d", want, have)}
}

// Precondition reports that the object's state forbids the request.
func Precondition(reason Reason, format string, args ...any) *Error {
	return &Error{Kind: KindFailedPrecondition, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Unavailable reports a transient failure; the same request may succeed later.
func Unavailable(reason Reason, format string, args ...any) *Error {
	return &Error{Kind: KindUnavailable, Reason: reason, Retryable: true, Message: fmt.Sprintf(format, args...)}
}

// Internal wraps an unexpected failure. Its message is replaced at the API
// edge; the original is only logged.
func Internal(format string, args ...any) *Error {
	return &Error{Kind: KindInternal, Reason: ReasonInternal, Message: fmt.Sprintf(format, args...)}
}
