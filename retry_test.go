package kibotos_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

var fast = kibotos.RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond}

// sender records the command ID of every request it is asked to send and
// answers with the scripted errors, then nil.
type sender struct {
	ids     []string
	results []error
}

func (s *sender) send(_ context.Context, req *ctrlv1.CreateEgressRequest) error {
	s.ids = append(s.ids, req.GetMetadata().GetCommandId())
	if n := len(s.ids); n <= len(s.results) {
		return s.results[n-1]
	}
	return nil
}

func unavailable() error {
	return connect.NewError(connect.CodeUnavailable, errors.New("connection reset"))
}

func TestRetryResendsTheSameCommandID(t *testing.T) {
	retryable := withDetail(connect.CodeUnavailable, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE, Retryable: true})
	s := &sender{results: []error{unavailable(), retryable}}
	req := &ctrlv1.CreateEgressRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "create-eg-1"}}
	err := kibotos.Retry(t.Context(), fast, func(ctx context.Context) error { return s.send(ctx, req) })
	if err != nil {
		t.Fatalf("Retry = %v, want nil", err)
	}
	if len(s.ids) != 3 {
		t.Fatalf("Retry made %d calls, want 3", len(s.ids))
	}
	for i, id := range s.ids {
		if id != "create-eg-1" {
			t.Errorf("call %d sent command ID %q, want create-eg-1", i+1, id)
		}
	}
}

func TestRetryStops(t *testing.T) {
	settled := withDetail(connect.CodeNotFound, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, CommandSettled: true})
	settledRetryable := withDetail(connect.CodeResourceExhausted, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, Retryable: true, CommandSettled: true})
	invalid := withDetail(connect.CodeInvalidArgument, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID})
	for name, first := range map[string]error{
		"settled":                   settled,
		"settled though retryable":  settledRetryable,
		"not retryable":             invalid,
		"unimplemented, no detail":  connect.NewError(connect.CodeUnimplemented, errors.New("404")),
		"unauthenticated no detail": connect.NewError(connect.CodeUnauthenticated, errors.New("401")),
	} {
		t.Run(name, func(t *testing.T) {
			s := &sender{results: []error{first}}
			req := &ctrlv1.CreateEgressRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "x"}}
			err := kibotos.Retry(t.Context(), fast, func(ctx context.Context) error { return s.send(ctx, req) })
			if err != first {
				t.Errorf("Retry = %v, want %v", err, first)
			}
			if len(s.ids) != 1 {
				t.Errorf("Retry made %d calls, want 1", len(s.ids))
			}
		})
	}
}

func TestRetryBoundsAttempts(t *testing.T) {
	s := &sender{results: []error{unavailable(), unavailable(), unavailable(), unavailable(), unavailable()}}
	req := &ctrlv1.CreateEgressRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "x"}}
	var delays []time.Duration
	p := fast
	p.MaxAttempts = 4
	p.OnRetry = func(attempt int, err error, d time.Duration) { delays = append(delays, d) }
	err := kibotos.Retry(t.Context(), p, func(ctx context.Context) error { return s.send(ctx, req) })
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("Retry = %v, want the last unavailable", err)
	}
	if len(s.ids) != 4 {
		t.Errorf("Retry made %d calls, want 4", len(s.ids))
	}
	if len(delays) != 3 {
		t.Fatalf("OnRetry called %d times, want 3", len(delays))
	}
	for i, d := range delays {
		bound := min(time.Millisecond<<i, 4*time.Millisecond)
		if d < 0 || d >= bound {
			t.Errorf("pause %d = %v, want in [0, %v)", i+1, d, bound)
		}
	}
}

func TestRetryHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	calls := 0
	p := kibotos.RetryPolicy{InitialBackoff: time.Hour, MaxBackoff: time.Hour, MaxAttempts: 10}
	p.OnRetry = func(int, error, time.Duration) { cancel() }
	start := time.Now()
	err := kibotos.Retry(ctx, p, func(context.Context) error { calls++; return unavailable() })
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("Retry = %v, want the last error of fn", err)
	}
	if calls != 1 {
		t.Errorf("Retry made %d calls after the context ended, want 1", calls)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("Retry took %v: it did not stop when the context ended", time.Since(start))
	}

	calls = 0
	err = kibotos.Retry(ctx, fast, func(ctx context.Context) error { calls++; return ctx.Err() })
	if calls != 1 || err == nil {
		t.Errorf("Retry on an ended context: %d calls, error %v; want 1 call and an error", calls, err)
	}
}

func TestRetryAttemptTimeout(t *testing.T) {
	calls := 0
	p := fast
	p.AttemptTimeout = 20 * time.Millisecond
	err := kibotos.Retry(t.Context(), p, func(ctx context.Context) error {
		calls++
		if calls == 1 {
			<-ctx.Done() // a call that hangs: its result is unknown
			return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Errorf("Retry = %v after %d calls, want nil after 2", err, calls)
	}
}
