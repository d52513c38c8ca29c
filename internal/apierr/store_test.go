package apierr

import (
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
)

// causeErr is a fault with a cause that only logs may see, as the
// PostgreSQL store's unavailable errors are: its Error names the cause,
// its Unwrap gives the fault.
type causeErr struct {
	fe    *fault.Error
	cause string
}

func (e causeErr) Error() string { return e.fe.Message + ": " + e.cause }
func (e causeErr) Unwrap() error { return e.fe }

// TestConvertStoreUnavailable: a store that cannot reach its database
// answers unavailable, retryable, with the fault's reason, stage and
// message; the cause wrapped with it (hosts, users) reaches no client.
func TestConvertStoreUnavailable(t *testing.T) {
	for _, reason := range []fault.Reason{fault.ReasonUnavailable, fault.ReasonTimedOut} {
		fe := fault.Unavailable(reason, "the store is unavailable: cannot connect to the database (connection refused); retry later")
		fe.Stage = "store"
		err := fmt.Errorf("workspace: %w", causeErr{fe, "failed to connect to `user=kibotos database=ctrl`: 10.0.0.5:5432: connection refused"})
		ce := Convert(t.Context(), nil, "/p", err)
		d, ok := kibotos.Detail(ce)
		if !ok || ce.Code() != connect.CodeUnavailable || !d.GetRetryable() || d.GetStage() != "store" ||
			d.GetReason() != reason.Enum() || d.GetReason() == ctrlv1.FailureReason_FAILURE_REASON_INTERNAL {
			t.Errorf("%s: Convert = %v, detail %v; want unavailable, retryable, stage store, %s", reason, ce, d, reason)
		}
		for _, leak := range []string{"10.0.0.5", "user=", "database="} {
			if strings.Contains(ce.Error(), leak) || strings.Contains(d.GetMessage(), leak) {
				t.Errorf("%s: %q shows %q", reason, ce.Error(), leak)
			}
		}
	}
}
