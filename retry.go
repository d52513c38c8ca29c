package kibotos

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// RetryPolicy bounds Retry. The zero value is usable: every zero field takes
// its default.
type RetryPolicy struct {
	// MaxAttempts is the number of calls, the first included; 0 means 5.
	MaxAttempts int
	// InitialBackoff bounds the pause before the second call; 0 means
	// 200ms. The bound doubles after every call.
	InitialBackoff time.Duration
	// MaxBackoff caps the bound; 0 means 10s.
	MaxBackoff time.Duration
	// AttemptTimeout, when positive, bounds each call: its context ends
	// after this long. A call cut short that way has an unknown result and
	// is retried with the same request.
	AttemptTimeout time.Duration
	// OnRetry, when set, is called before each pause with the number of the
	// call that failed (1 for the first), its error and the pause.
	OnRetry func(attempt int, err error, delay time.Duration)
}

const (
	defaultMaxAttempts    = 5
	defaultInitialBackoff = 200 * time.Millisecond
	defaultMaxBackoff     = 10 * time.Second
)

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = defaultMaxAttempts
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = defaultInitialBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = defaultMaxBackoff
	}
	if p.MaxBackoff < p.InitialBackoff {
		p.MaxBackoff = p.InitialBackoff
	}
	return p
}

// Retry calls fn until it succeeds, until its error is not worth resending
// (see IsRetryable), until MaxAttempts calls were made or until ctx ends,
// and returns fn's last error (nil on success). Between calls it pauses for
// a random duration in [0, bound) — exponential back-off with full jitter,
// the bound starting at InitialBackoff and doubling up to MaxBackoff.
//
// Retry never builds or changes a request. fn must send the same request
// every time, with the same command ID: build the request, ID included,
// before calling Retry and let the closure only send it. It stops at once on
// success, on a settled failure (the recorded result of that ID; a retry
// needs a new ID, which is the caller's decision) and on a failure the
// server marked not retryable. An error that is not a Connect error counts
// as an unknown result and is retried. When ctx ends, it returns the last
// error of fn.
func Retry(ctx context.Context, policy RetryPolicy, fn func(ctx context.Context) error) error {
	p := policy.withDefaults()
	bound := p.InitialBackoff
	var err error
	for attempt := 1; ; attempt++ {
		err = call(ctx, p.AttemptTimeout, fn)
		if err == nil || !IsRetryable(err) || attempt >= p.MaxAttempts {
			return err
		}
		if ctx.Err() != nil {
			return err
		}
		delay := time.Duration(rand.Int64N(int64(bound)))
		if p.OnRetry != nil {
			p.OnRetry(attempt, err, delay)
		}
		if !sleep(ctx, delay) {
			return err
		}
		bound = min(bound*2, p.MaxBackoff)
	}
}

// call runs fn under the attempt timeout, if any.
func call(ctx context.Context, timeout time.Duration, fn func(context.Context) error) error {
	if timeout <= 0 {
		return fn(ctx)
	}
	actx, cancel := context.WithTimeoutCause(ctx, timeout, errAttemptTimeout)
	defer cancel()
	return fn(actx)
}

var errAttemptTimeout = errors.New("kibotos: attempt timed out")

// sleep pauses for d and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
