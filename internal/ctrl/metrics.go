package ctrl

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	rejected prometheus.Counter
	denied   prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kibotos_ctrl_requests_total", Help: "ctrl API requests by procedure and Connect code.",
		}, []string{"procedure", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kibotos_ctrl_request_duration_seconds", Help: "ctrl API request latency.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60},
		}, []string{"procedure"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kibotos_ctrl_unauthenticated_total", Help: "Requests refused for lack of a client certificate issued by the client CA.",
		}),
		denied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kibotos_ctrl_permission_denied_total", Help: "Requests refused because the certificate's OU is not the role the API needs.",
		}),
	}
	reg.MustRegister(m.requests, m.latency, m.rejected, m.denied)
	return m
}

// retrier is a store that counts the transactions it ran again
// (postgres.Store: serialization failures and deadlocks).
type retrier interface{ Retries() int64 }

// registerStore registers what the store counts of itself:
// kibotos_store_transaction_retries_total, when it retries.
func registerStore(reg *prometheus.Registry, st any) {
	if r, ok := st.(retrier); ok {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kibotos_store_transaction_retries_total",
			Help: "Write transactions the store ran again after a serialization failure or a deadlock (PostgreSQL): contention between replicas and requests.",
		}, func() float64 { return float64(r.Retries()) }))
	}
}

// adviser is a store that can say which of its server's settings to
// change (postgres.Store.SettingAdvice).
type adviser interface {
	SettingAdvice(ctx context.Context) ([]string, error)
}

// adviseStore logs, at start, what the store advises to set.
func adviseStore(ctx context.Context, log *slog.Logger, st any) {
	a, ok := st.(adviser)
	if !ok {
		return
	}
	lines, err := a.SettingAdvice(ctx)
	if err != nil {
		log.Warn("read the store's settings", "error", err.Error())
		return
	}
	for _, l := range lines {
		log.Warn(l)
	}
}

// commandIDer is every write request.
type commandIDer interface {
	GetMetadata() *ctrlv1.CommandMetadata
}

// interceptor logs and measures every call. It logs the procedure, the
// command ID and the outcome; never a request or response body.
func (m *metrics) interceptor(log *slog.Logger) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			start := time.Now()
			res, err := next(ctx, req)
			d := time.Since(start)
			proc := req.Spec().Procedure
			code := "ok"
			if err != nil {
				code = connect.CodeOf(err).String()
			}
			m.requests.WithLabelValues(proc, code).Inc()
			m.latency.WithLabelValues(proc).Observe(d.Seconds())
			attrs := []any{"procedure", proc, "code", code, "duration_ms", float64(d.Microseconds()) / 1000}
			if c, ok := req.Any().(commandIDer); ok && c.GetMetadata() != nil {
				attrs = append(attrs, "command_id", c.GetMetadata().GetCommandId())
			}
			var ce *connect.Error
			if errors.As(err, &ce) {
				attrs = append(attrs, "error", ce.Message())
			}
			log.InfoContext(ctx, "call", attrs...)
			return res, err
		}
	}
}
