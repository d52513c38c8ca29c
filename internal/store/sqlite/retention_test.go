package sqlite

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// TestRetentionQueryPlans: a pruning batch finds its rows by a search of
// the partial indexes made for it, without a sort, whatever the tables
// hold.
func TestRetentionQueryPlans(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 2000 {
			w := &store.Workspace{ID: fmt.Sprintf("w%04d", i), CreatedAt: base, State: 3}
			if i%2 == 0 {
				w.State, w.DeletedAt = store.WorkspaceStateDeleted, base.Add(time.Duration(i)*time.Second)
			}
			if i%10 == 1 {
				w.CommandID = fmt.Sprintf("c%04d", i)
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
			c := &store.Command{ID: fmt.Sprintf("c%04d", i), Method: "m", Status: store.CommandCompleted, CreatedAt: base, CompletedAt: base.Add(time.Duration(i) * time.Second)}
			if i%3 == 0 {
				c.Status, c.CompletedAt = store.CommandProcessing, time.Time{}
			}
			if err := tx.InsertCommand(ctx, c); err != nil {
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
			want  []string
		}{
			"commands": {pruneCommandsSQL(1), []any{base.UnixMicro(), "ctrl/keep", 10},
				[]string{"INDEX commands_completed", "INDEX workspaces_command"}},
			"workspaces": {prunableWorkspacesSQL, []any{base.UnixMicro(), 10}, []string{"INDEX workspaces_deleted"}},
		} {
			plan := strings.Join(explainSQL(t, s, q.query, q.args...), "; ")
			for _, w := range q.want {
				if !strings.Contains(plan, w) || strings.Contains(plan, "TEMP B-TREE") {
					t.Errorf("analyzed=%v %s: plan %q, want a search of %s without a sort", analyzed, name, plan, w)
				}
			}
		}
	}
}
