package kibotos

import (
	"errors"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// Detail returns the ErrorDetail the server attached to err. It reports
// false when err is not a Connect error or carries no ErrorDetail: the
// request then failed before the server answered (a transport failure, a
// timeout) or something other than ctrl answered, and its result is unknown.
func Detail(err error) (*ctrlv1.ErrorDetail, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil, false
	}
	for _, d := range ce.Details() {
		v, err := d.Value()
		if err != nil {
			continue
		}
		if ed, ok := v.(*ctrlv1.ErrorDetail); ok {
			return ed, true
		}
	}
	return nil, false
}

// Reason returns the reason of err's ErrorDetail, FAILURE_REASON_UNSPECIFIED
// when it has none. Read it before the Connect code.
func Reason(err error) ctrlv1.FailureReason {
	d, _ := Detail(err)
	return d.GetReason()
}

// IsSettled reports whether err is the recorded result of its command ID
// (ErrorDetail.command_settled): resending the same ID only replays it, so a
// retry needs a new command ID, and the decision to make one is the
// caller's.
func IsSettled(err error) bool {
	d, ok := Detail(err)
	return ok && d.GetCommandSettled()
}

// IsRetryable reports whether resending the same request, with the same
// command ID, may succeed. It is true
//
//   - when the ErrorDetail says retryable and the failure is not settled (it
//     recorded nothing: the same ID will execute);
//   - when the result is unknown: the code is unavailable or
//     deadline_exceeded and the failure is not settled, or the error carries
//     no ErrorDetail at all (a transport failure, a timeout, an answer from
//     something other than ctrl) — except unimplemented, unauthenticated and
//     permission_denied, which a resend cannot change.
//
// It is false for nil, for settled failures and for other failures the
// server marked not retryable: change the request or the object first.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	code := connect.CodeOf(err)
	if d, ok := Detail(err); ok {
		if d.GetCommandSettled() {
			return false
		}
		if d.GetRetryable() {
			return true
		}
		return code == connect.CodeUnavailable || code == connect.CodeDeadlineExceeded
	}
	switch code {
	case connect.CodeUnimplemented, connect.CodeUnauthenticated, connect.CodePermissionDenied:
		return false
	}
	return true
}

// CommandError returns the error a completed command ended with, as the
// Connect error its request would have returned: the code of e and its
// ErrorDetail, so Detail, Reason, IsRetryable and IsSettled apply. It
// returns nil when e is nil.
func CommandError(e *ctrlv1.CommandError) error {
	if e == nil {
		return nil
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(e.GetCode())); err != nil {
		code = connect.CodeUnknown
	}
	d := e.GetDetail()
	msg := d.GetMessage()
	if msg == "" {
		msg = "command failed"
	}
	ce := connect.NewError(code, errors.New(msg))
	if d != nil {
		if ed, err := connect.NewErrorDetail(d); err == nil {
			ce.AddDetail(ed)
		}
	}
	return ce
}
