package cli

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

func reasonErr(code connect.Code, r ctrlv1.FailureReason) error {
	return detailed(code, &ctrlv1.ErrorDetail{Reason: r, Message: "m"})
}

func TestExitCode(t *testing.T) {
	codeOnly := func(c connect.Code) error { return connect.NewError(c, errors.New("m")) }
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"success", nil, 0},
		{"local failure", errors.New("read password: no such file"), 1},
		{"usage", usagef("missing EGRESS_ID"), 2},
		{"wrapped usage", fmt.Errorf("x: %w", usagef("bad")), 2},
		{"missing capability", &kibotos.MissingCapabilityError{Procedure: "/p", Capability: "egress.manage"}, 14},
		{"missing field capability", &fieldCapabilityError{err: &kibotos.MissingCapabilityError{Procedure: "/p", Capability: "workspace.expiration", Field: "expiration"}}, 14},
		{"hinted", withHint(codeOnly(connect.CodeFailedPrecondition), "already STOPPED"), 9},
		{"network failure without a code", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, 14},
		// A Connect error exits with its code number...
		{"canceled", codeOnly(connect.CodeCanceled), 1},
		{"unknown", codeOnly(connect.CodeUnknown), 1},
		{"invalid_argument", codeOnly(connect.CodeInvalidArgument), 3},
		{"deadline_exceeded", codeOnly(connect.CodeDeadlineExceeded), 4},
		{"not_found", codeOnly(connect.CodeNotFound), 5},
		{"already_exists", codeOnly(connect.CodeAlreadyExists), 6},
		{"permission_denied", codeOnly(connect.CodePermissionDenied), 7},
		{"resource_exhausted", codeOnly(connect.CodeResourceExhausted), 8},
		{"failed_precondition", codeOnly(connect.CodeFailedPrecondition), 9},
		{"aborted", codeOnly(connect.CodeAborted), 10},
		{"out_of_range", codeOnly(connect.CodeOutOfRange), 11},
		{"unimplemented", codeOnly(connect.CodeUnimplemented), 12},
		{"internal", codeOnly(connect.CodeInternal), 13},
		{"unavailable", codeOnly(connect.CodeUnavailable), 14},
		{"data_loss", codeOnly(connect.CodeDataLoss), 15},
		{"unauthenticated", codeOnly(connect.CodeUnauthenticated), 16},
		{"wrapped connect error", fmt.Errorf("create: %w", codeOnly(connect.CodeAborted)), 10},
		// ...with the code of its detail's reason when one overrides it.
		{"CAPABILITY_UNAVAILABLE overrides unimplemented", reasonErr(connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE), 14},
		{"CAPABILITY_UNAVAILABLE overrides failed_precondition", reasonErr(connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE), 14},
		{"SESSION_EXPIRED overrides permission_denied", reasonErr(connect.CodePermissionDenied, ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED), 16},
		{"SESSION_EXPIRED overrides failed_precondition", reasonErr(connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED), 16},
		{"TIMED_OUT overrides unavailable", reasonErr(connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT), 4},
		{"TIMED_OUT overrides deadline_exceeded", reasonErr(connect.CodeDeadlineExceeded, ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT), 4},
		{"other reasons keep the code", reasonErr(connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_NODE_UNREACHABLE), 14},
		{"CONFLICT keeps failed_precondition", reasonErr(connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT), 9},
		{"PERMISSION_DENIED keeps unauthenticated", reasonErr(connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED), 16},
	}
	for _, tt := range tests {
		if got := ExitCode(tt.err); got != tt.want {
			t.Errorf("%s: ExitCode(%v) = %d, want %d", tt.name, tt.err, got, tt.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{
			detailed(connect.CodeInvalidArgument, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, Message: "address \"x\" is not host:port", Field: "spec.socks5.address"}),
			`invalid_argument INVALID_ARGUMENT: address "x" is not host:port (retryable: no, settled: no, field: spec.socks5.address)`,
		},
		{
			detailed(connect.CodeFailedPrecondition, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_CONFLICT, CommandSettled: true, Message: "referenced\nby 1 workspace"}),
			`failed_precondition CONFLICT: referenced by 1 workspace (retryable: no, settled: yes)`,
		},
		{
			detailed(connect.CodeUnavailable, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT, Retryable: true, Message: "still stopping"}),
			`unavailable TIMED_OUT: still stopping (retryable: yes, settled: no)`,
		},
		{
			connect.NewError(connect.CodeUnavailable, errors.New("dial tcp: connection refused")),
			`unavailable: dial tcp: connection refused (retryable: yes, settled: no)`,
		},
		{
			&kibotos.MissingCapabilityError{Procedure: "/kibotos.ctrl.v1.EgressService/CreateEgress", Capability: "egress.manage"},
			`capability "egress.manage" is not offered by the server (EgressService/CreateEgress needs it); nothing was sent`,
		},
		{
			&fieldCapabilityError{flags: []string{"--network-mode"}, err: &kibotos.MissingCapabilityError{Procedure: "/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace", Capability: "workspace.network_policy", Field: "network_policy"}},
			`--network-mode needs the capability "workspace.network_policy" (field network_policy of WorkspaceService/CreateWorkspace), which the server does not offer; nothing was sent`,
		},
		{errors.New("read password: no such file"), "read password: no such file"},
		{withHint(errors.New("m"), "h"), "m"},
	}
	for _, tt := range tests {
		if got := describe(tt.err); got != tt.want {
			t.Errorf("describe(%v)\n got: %s\nwant: %s", tt.err, got, tt.want)
		}
	}
}
