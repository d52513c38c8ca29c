package sqlite

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// TestExpirationQueryPlans checks that the expiration engine's reads are
// searches of workspaces_expiration: their cost does not grow with the
// Workspaces, armed or not, that are not due.
func TestExpirationQueryPlans(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 2000 {
			w := &store.Workspace{ID: fmt.Sprintf("w%04d", i), CreatedAt: base, State: 3}
			if i%2 == 0 {
				w.ExpirationDeadline = base.Add(time.Duration(i) * time.Second)
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			writerExec(t, s, "ANALYZE")
		}
		for name, q := range map[string]struct {
			query string
			args  []any
		}{
			"due":  {dueExpirationsSQL, []any{base.UnixMicro(), int64(0), "", 10}},
			"next": {nextExpirationSQL, []any{base.UnixMicro()}},
		} {
			plan := strings.Join(explainSQL(t, s, q.query, q.args...), "; ")
			if !strings.Contains(plan, "USING COVERING INDEX workspaces_expiration") || strings.Contains(plan, "TEMP B-TREE") {
				t.Errorf("analyzed=%v %s: plan %q, want a search of workspaces_expiration without a sort", analyzed, name, plan)
			}
		}
	}
}
