package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// TestExpirationQueryPlans checks that the expiration engine's reads are
// scans of workspaces_expiration without a sort, custom and generic: their
// cost does not grow with the Workspaces that are not due.
func TestExpirationQueryPlans(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 5000 {
			w := &store.Workspace{ID: fmt.Sprintf("w%04d", i), CreatedAt: base, State: 3}
			if i%5 == 0 {
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
	if _, err := s.pool.Exec(ctx, "ANALYZE workspaces"); err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]struct {
		query string
		args  []any
	}{
		"due":  {dueExpirationsSQL, []any{base.UnixMicro(), int64(0), "", 10}},
		"next": {nextExpirationSQL, []any{base.UnixMicro()}},
	} {
		for _, mode := range []string{"custom", "generic"} {
			plan := explainSQL(t, s, q.query, q.args, mode)
			if !strings.Contains(plan, "workspaces_expiration") || hasSortNode(plan) {
				t.Errorf("%s (%s): plan\n%s\nwant a scan of workspaces_expiration without a sort", name, mode, plan)
			}
		}
	}
}
