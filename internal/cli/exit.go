package cli

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// Exit codes that are not Connect codes.
const (
	// ExitOK: the command succeeded.
	ExitOK = 0
	// ExitLocal: a local failure (a file kibo could not read, an answer it
	// could not print, an interrupted run, a Connect error of code canceled
	// or unknown).
	ExitLocal = 1
	// ExitUsage: the command line is wrong (unknown command or flag, a
	// missing or malformed argument, an invalid --command-id, no endpoint).
	// Nothing was sent.
	ExitUsage = 2
	// ExitUnavailable is also the exit code of a missing capability and of a
	// transport failure (connection refused, TLS handshake failure).
	ExitUnavailable = int(connect.CodeUnavailable)
)

// reasonExits are the reasons that decide the exit code before the Connect
// code does.
var reasonExits = map[ctrlv1.FailureReason]int{
	ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE: int(connect.CodeUnavailable),
	ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED:        int(connect.CodeUnauthenticated),
	ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT:              int(connect.CodeDeadlineExceeded),
}

// ExitCode returns the exit code of err: 0 for nil; 2 for usage errors; 14
// for a missing capability; for a Connect error, the override of its
// ErrorDetail.reason if it has one (CAPABILITY_UNAVAILABLE 14,
// SESSION_EXPIRED 16, TIMED_OUT 4), else its code number — except canceled
// (1) and unknown (2), which exit 1 so that 2 always means a usage error; 14
// for a network failure that carries no Connect code; 1 for anything else.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		return ExitUsage
	}
	var me *kibotos.MissingCapabilityError
	if errors.As(err, &me) {
		return ExitUnavailable
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		if code, ok := reasonExits[kibotos.Reason(err)]; ok {
			return code
		}
		switch ce.Code() {
		case connect.CodeCanceled, connect.CodeUnknown:
			return ExitLocal
		}
		return int(ce.Code())
	}
	var oe *net.OpError
	var de *net.DNSError
	if errors.As(err, &oe) || errors.As(err, &de) {
		return ExitUnavailable
	}
	return ExitLocal
}

// usageError is a wrong command line.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErr(err error) error { return &usageError{err} }

func usagef(format string, args ...any) error { return &usageError{fmt.Errorf(format, args...)} }

func isUsage(err error) bool {
	var ue *usageError
	return errors.As(err, &ue)
}

// printError writes err as one line on w:
//
//	error: <code> <REASON>: <message> (retryable: yes/no, settled: yes/no[, field: x])
//
// for Connect errors, and "error: <message>" for the others.
//
// A hint the error carries (see withHint) follows on its own line:
//
//	hint: workspace ws-… is already STOPPED; nothing to do
func printError(w io.Writer, err error) {
	fmt.Fprintln(w, "error: "+describe(err))
	var h *hinted
	if errors.As(err, &h) {
		fmt.Fprintln(w, "hint: "+h.hint)
	}
}

// hinted is an error with advice for people; the exit code is the one of
// the error.
type hinted struct {
	err  error
	hint string
}

func (h *hinted) Error() string { return h.err.Error() }
func (h *hinted) Unwrap() error { return h.err }

// withHint adds hint to err; an empty hint leaves err as it is.
func withHint(err error, hint string) error {
	if err == nil || hint == "" {
		return err
	}
	return &hinted{err: err, hint: hint}
}

// describe renders err without the "error: " prefix.
func describe(err error) string {
	var fe *fieldCapabilityError
	if errors.As(err, &fe) {
		who, verb := "the request", "needs"
		if len(fe.flags) > 0 {
			who = strings.Join(fe.flags, " and ")
			if len(fe.flags) > 1 {
				verb = "need"
			}
		}
		return fmt.Sprintf("%s %s the capability %q (field %s of %s), which the server does not offer; nothing was sent",
			who, verb, fe.err.Capability, fe.err.Field, strings.TrimPrefix(fe.err.Procedure, "/kibotos.ctrl.v1."))
	}
	var me *kibotos.MissingCapabilityError
	if errors.As(err, &me) {
		return fmt.Sprintf("capability %q is not offered by the server (%s needs it); nothing was sent",
			me.Capability, strings.TrimPrefix(me.Procedure, "/kibotos.ctrl.v1."))
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return oneLine(err.Error())
	}
	var b strings.Builder
	b.WriteString(ce.Code().String())
	d, ok := kibotos.Detail(err)
	msg := ce.Message()
	if ok {
		if r := d.GetReason(); r != ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
			b.WriteString(" " + reasonName(r))
		}
		if d.GetMessage() != "" {
			msg = d.GetMessage()
		}
	}
	b.WriteString(": " + oneLine(msg))
	retryable, settled := kibotos.IsRetryable(err), kibotos.IsSettled(err)
	if ok {
		retryable = d.GetRetryable()
	}
	fmt.Fprintf(&b, " (retryable: %s, settled: %s", yesNo(retryable), yesNo(settled))
	if f := d.GetField(); f != "" {
		b.WriteString(", field: " + f)
	}
	b.WriteString(")")
	return b.String()
}

// reasonName is the short name of a reason, without FAILURE_REASON_.
func reasonName(r ctrlv1.FailureReason) string {
	return strings.TrimPrefix(r.String(), "FAILURE_REASON_")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
