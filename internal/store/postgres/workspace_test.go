package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kibotos/kibotos/internal/store"
)

// explainSQL returns the plan of query: planned for its parameter values
// ("custom"), or as a prepared statement's generic plan ("generic"), which
// pgx's statement cache may get after a few executions.
func explainSQL(t *testing.T, s *Store, query string, args []any, mode string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var rows pgx.Rows
	if mode == "custom" {
		rows, err = conn.Query(ctx, "EXPLAIN (COSTS OFF) "+query, args...)
	} else {
		lits := make([]string, len(args))
		for i, a := range args {
			switch a := a.(type) {
			case string:
				lits[i] = "'" + strings.ReplaceAll(a, "'", "''") + "'"
			default:
				lits[i] = fmt.Sprint(a)
			}
		}
		// The simple protocol, so that pgx's statement cache on this
		// connection is neither used nor disturbed.
		simple := pgx.QueryExecModeSimpleProtocol
		for _, stmt := range []string{"PREPARE plan_stmt AS " + query, "SET plan_cache_mode = force_generic_plan"} {
			if _, err := conn.Exec(ctx, stmt, simple); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
		defer conn.Exec(ctx, "RESET plan_cache_mode; DEALLOCATE plan_stmt", simple) //nolint:errcheck
		execute := "EXECUTE plan_stmt"
		if len(lits) > 0 {
			execute += "(" + strings.Join(lits, ", ") + ")"
		}
		rows, err = conn.Query(ctx, "EXPLAIN (COSTS OFF) "+execute, simple)
	}
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// hasSortNode reports whether a plan sorts (a Merge Append's "Sort Key"
// merges ordered inputs and is no sort).
func hasSortNode(plan string) bool {
	for _, line := range strings.Split(plan, "\n") {
		line = strings.TrimLeft(strings.TrimSpace(line), "-> ")
		if strings.HasPrefix(line, "Sort") && !strings.HasPrefix(line, "Sort Key") ||
			strings.HasPrefix(line, "Incremental Sort") {
			return true
		}
	}
	return false
}

// TestWorkspaceQueryPlans checks that a page of Workspaces costs about its
// rows whatever the table holds: most Workspaces are AVAILABLE with a READY
// guest, a few are in rare states or conditions, some are deleted.
func TestWorkspaceQueryPlans(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 5000 {
			w := &store.Workspace{
				ID:             fmt.Sprintf("w%04d", i),
				CreatedAt:      base.Add(time.Duration(i) * time.Millisecond),
				State:          3,
				GuestCondition: 1,
				NodeID:         fmt.Sprintf("n%d", i%20),
				Generation:     1,
				Labels:         map[string]string{"a": fmt.Sprint(i % 10), "b": fmt.Sprint(i % 7)},
			}
			switch {
			case i%100 < 5:
				w.State, w.GuestCondition, w.DeletedAt = store.WorkspaceStateDeleted, 0, w.CreatedAt
			case i%100 < 10:
				w.State, w.GuestCondition = 5, 0
			case i%100 == 99:
				w.State, w.GuestCondition = 6, 3
			}
			if i%97 == 0 {
				w.ObservedGeneration = 0
			} else {
				w.ObservedGeneration = 1
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
			c := &store.Command{ID: fmt.Sprintf("c%04d", i), ObjectKind: "workspace", ObjectID: w.ID,
				Status: store.CommandCompleted, CreatedAt: w.CreatedAt, CompletedAt: w.CreatedAt}
			if i%50 == 0 {
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
	if _, err := s.pool.Exec(ctx, "ANALYZE workspaces; ANALYZE labels; ANALYZE commands"); err != nil {
		t.Fatal(err)
	}
	// Pages of 10, well under the rows of the rarest state or condition
	// after the cursor: with pages as large as the whole match, reading it
	// all and sorting is a fine plan, and the planner rightly picks it.
	after := &store.Cursor{CreatedAt: base.Add(time.Second), ID: "w1000"}
	list := func(q store.WorkspaceQuery) (string, []any) {
		q.After, q.Limit = after, 10
		return workspaceListSQL(q)
	}
	type planCase struct {
		name  string
		query string
		args  []any
		want  []string
		sort  bool // the plan may sort (all its rows are returned)
	}
	var cases []planCase
	add := func(name string, q store.WorkspaceQuery, want ...string) {
		query, args := list(q)
		cases = append(cases, planCase{name: name, query: query, args: args, want: want})
	}
	add("default", store.WorkspaceQuery{},
		"Index Scan using workspaces_live on workspaces w", "ROW(created_at, id) > ROW(")
	add("include deleted", store.WorkspaceQuery{IncludeDeleted: true},
		"Index Scan using workspaces_list on workspaces w", "ROW(created_at, id) > ROW(")
	add("common state", store.WorkspaceQuery{States: []int32{3}}, "ROW(created_at, id) > ROW(")
	add("rare state", store.WorkspaceQuery{States: []int32{6}},
		"Index Scan using workspaces_state on workspaces w", "(state = 6) AND (ROW(created_at, id) > ROW(")
	add("deleted state", store.WorkspaceQuery{States: []int32{store.WorkspaceStateDeleted}},
		"Index Scan using workspaces_state on workspaces w", "(state = 8) AND (ROW(created_at, id) > ROW(")
	add("states", store.WorkspaceQuery{States: []int32{6, 5, 3}},
		"Merge Append", "using workspaces_state on workspaces", "(state = 6) AND (ROW(created_at, id) > ROW(",
		"(state = 5) AND (ROW(created_at, id) > ROW(")
	add("rare guest", store.WorkspaceQuery{GuestCondition: 3},
		"Index Scan using workspaces_guest on workspaces w", "(guest_condition = 3) AND (ROW(created_at, id) > ROW(")
	add("selector", store.WorkspaceQuery{Selector: map[string]string{"a": "1"}},
		"Index Only Scan using labels_selector on labels l0", "ROW(object_created_at, object_id) > ROW(",
		"Index Scan using workspaces_pkey on workspaces w")
	add("selector and filters", store.WorkspaceQuery{Selector: map[string]string{"b": "2", "a": "1"}, States: []int32{6, 5}, GuestCondition: 3},
		"Index Only Scan using labels_selector on labels l0", "Index Scan using workspaces_pkey on workspaces w", "labels_pkey on labels l")
	add("selector, rare state", store.WorkspaceQuery{Selector: map[string]string{"a": "1"}, States: []int32{6}},
		"Index Only Scan using labels_selector on labels l0", "Index Scan using workspaces_pkey on workspaces w")
	cases = append(cases,
		planCase{name: "pending", query: pendingWorkspacesSQL, args: []any{10}, want: []string{"Index Scan using workspaces_pending on workspaces w"}},
		planCase{name: "processing", query: processingCommandsSQL, args: []any{"workspace", 10},
			want: []string{"Index Scan using commands_processing on commands", "Index Cond: (object_kind = "}},
		planCase{name: "on node", query: workspacesOnNodeSQL, args: []any{"n3"}, want: []string{"workspaces_node"}, sort: true},
		planCase{name: "stale labels", query: deleteStaleLabelsSQL, args: []any{"workspace", "w0001", []string{"a"}, []string{"1"}},
			want: []string{"Index Scan using labels_pkey on labels l"}},
		planCase{name: "missing labels", query: insertMissingLabelsSQL, args: []any{"workspace", "w0001", []string{"a"}, []string{"1"}},
			want: []string{"Index Only Scan using labels_pkey on labels l", "Index Scan using workspaces_pkey on workspaces w"}},
	)
	for _, tc := range cases {
		for _, mode := range []string{"custom", "generic"} {
			if mode == "generic" && len(tc.args) > 0 {
				if _, isSlice := tc.args[len(tc.args)-1].([]string); isSlice {
					continue // arrays have no literal form here
				}
			}
			plan := explainSQL(t, s, tc.query, tc.args, mode)
			t.Logf("%s (%s):\n%s", tc.name, mode, plan)
			for _, w := range tc.want {
				if !strings.Contains(plan, w) {
					t.Errorf("%s (%s): plan lacks %q", tc.name, mode, w)
				}
			}
			for _, bad := range []string{"Seq Scan", "Bitmap", "Hash"} {
				if strings.Contains(plan, bad) && !(tc.sort && bad == "Bitmap") {
					t.Errorf("%s (%s): plan has a %s: a page would cost more than its rows", tc.name, mode, bad)
				}
			}
			if !tc.sort && hasSortNode(plan) {
				t.Errorf("%s (%s): plan sorts: a page would cost more than its rows", tc.name, mode)
			}
		}
	}
}

// TestPartialIndexConstants: the partial indexes test the stored values the
// statements spell, store.WorkspaceStateDeleted and store.CommandProcessing.
func TestPartialIndexConstants(t *testing.T) {
	s := openTest(t)
	for index, want := range map[string]string{
		"workspaces_live":     fmt.Sprintf("WHERE (state <> %d)", store.WorkspaceStateDeleted),
		"commands_processing": fmt.Sprintf("WHERE (status = %d)", store.CommandProcessing),
	} {
		var def string
		if err := s.pool.QueryRow(context.Background(),
			`SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND indexname = $1`, index).Scan(&def); err != nil {
			t.Fatalf("%s: %v", index, err)
		}
		if !strings.HasSuffix(def, want) {
			t.Errorf("%s: %s, want it to end with %q", index, def, want)
		}
	}
}
