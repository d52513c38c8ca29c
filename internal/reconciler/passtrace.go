package reconciler

import (
	"context"
	"log/slog"
	"time"
)

// passTrace times the stages of one pass (pass) and its placement
// transactions for the debug log ("reconcile pass"): where a pass's time
// goes when commands wait for it. A nil *passTrace records nothing.
type passTrace struct {
	start, last time.Time
	attrs       []any
	// Placement transactions (placeBatch): how many, the Workspaces they
	// decided on, the attempts they took (a serialization failure is
	// tried again), and the time until their first attempt began (the
	// pool's connection or SQLite's writer, and the BEGIN).
	batches, rows, attempts int
	wait                    time.Duration
}

// newPassTrace returns a trace when the debug log is on, else nil.
func newPassTrace(ctx context.Context, log *slog.Logger) *passTrace {
	if !log.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	now := time.Now()
	return &passTrace{start: now, last: now}
}

// mark ends stage: the time since the last mark.
func (t *passTrace) mark(stage string) {
	if t == nil {
		return
	}
	now := time.Now()
	t.attrs = append(t.attrs, stage+"_ms", ms(now.Sub(t.last)))
	t.last = now
}

// batch records one placement transaction of rows Workspaces: called when
// it was asked for, first when its first attempt began, attempts made.
func (t *passTrace) batch(rows, attempts int, called, first time.Time) {
	if t == nil {
		return
	}
	t.batches++
	t.rows += rows
	t.attempts += attempts
	if !first.IsZero() {
		t.wait += first.Sub(called)
	}
}

// log writes the trace.
func (t *passTrace) log(ctx context.Context, log *slog.Logger) {
	if t == nil {
		return
	}
	attrs := append([]any{"total_ms", ms(time.Since(t.start))}, t.attrs...)
	if t.batches > 0 {
		attrs = append(attrs, "place_batches", t.batches, "place_rows", t.rows, "place_attempts", t.attempts,
			"place_wait_ms", ms(t.wait))
	}
	log.DebugContext(ctx, "reconcile pass", attrs...)
}

// ms is d in milliseconds, to a tenth of one.
func ms(d time.Duration) float64 { return float64(d.Round(100*time.Microsecond)) / 1e6 }
