package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// explainSQL returns the EXPLAIN QUERY PLAN details of a statement, as a
// reader connection plans it.
func explainSQL(t *testing.T, s *Store, query string, args ...any) []string {
	t.Helper()
	ctx := context.Background()
	var plan []string
	err := s.view(ctx, func(tx *txn) error {
		return tx.query(ctx, "EXPLAIN QUERY PLAN "+query, args, func(rows *sql.Rows) error {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				return err
			}
			plan = append(plan, detail)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// TestWorkspaceQueryPlans checks that every Workspace query is a search of
// the index made for it, so that a page costs about its rows whatever the
// table holds.
func TestWorkspaceQueryPlans(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 2000 {
			w := &store.Workspace{
				ID:             fmt.Sprintf("w%04d", i),
				CreatedAt:      base.Add(time.Duration(i) * time.Millisecond),
				State:          int32(1 + i%8),
				GuestCondition: int32(i % 4),
				NodeID:         fmt.Sprintf("n%d", i%20),
				Generation:     uint64(i % 3),
				Labels:         map[string]string{"a": fmt.Sprint(i % 10), "b": fmt.Sprint(i % 7)},
			}
			if w.State == store.WorkspaceStateDeleted {
				w.DeletedAt = w.CreatedAt
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Plans both without statistics (as a new database runs) and with.
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			writerExec(t, s, "ANALYZE")
		}
		after := &store.Cursor{CreatedAt: base.Add(time.Second), ID: "w1000"}
		type planCase struct {
			name  string
			query string
			args  []any
			want  []string
			// sorts is how many temporary sorts the plan may have, each of
			// at most Limit rows.
			sorts int
		}
		var cases []planCase
		add := func(name string, q store.WorkspaceQuery, sorts int, want ...string) {
			q.After, q.Limit = after, 100
			query, args := workspaceListSQL(q)
			cases = append(cases, planCase{name: name, query: query, args: args, want: want, sorts: sorts})
		}
		add("default", store.WorkspaceQuery{}, 0,
			"SEARCH w USING INDEX workspaces_live ((created_at,id)>(?,?))")
		add("include deleted", store.WorkspaceQuery{IncludeDeleted: true}, 0,
			"SEARCH w USING INDEX workspaces_list ((created_at,id)>(?,?))")
		add("state", store.WorkspaceQuery{States: []int32{6}}, 0,
			"SEARCH w USING INDEX workspaces_state (state=? AND (created_at,id)>(?,?))")
		add("states", store.WorkspaceQuery{States: []int32{6, 5, 8}}, 3,
			"SEARCH w USING INDEX workspaces_state (state=? AND (created_at,id)>(?,?))")
		add("guest", store.WorkspaceQuery{GuestCondition: 3}, 0,
			"SEARCH w USING INDEX workspaces_guest (guest_condition=? AND (created_at,id)>(?,?))")
		add("guest, deleted included", store.WorkspaceQuery{GuestCondition: 3, IncludeDeleted: true}, 0,
			"SEARCH w USING INDEX workspaces_guest (guest_condition=? AND (created_at,id)>(?,?))")
		add("selector", store.WorkspaceQuery{Selector: map[string]string{"a": "1"}}, 0,
			"SEARCH l0 USING COVERING INDEX labels_selector (kind=? AND key=? AND value=? AND (object_created_at,object_id)>(?,?))",
			"SEARCH w USING INDEX sqlite_autoindex_workspaces_1 (id=?)")
		add("selector and filters", store.WorkspaceQuery{Selector: map[string]string{"b": "2", "a": "1"}, States: []int32{6, 5}, GuestCondition: 3}, 0,
			"SEARCH l0 USING COVERING INDEX labels_selector (kind=? AND key=? AND value=? AND (object_created_at,object_id)>(?,?))",
			"SEARCH w USING INDEX sqlite_autoindex_workspaces_1 (id=?)",
			"SEARCH l EXISTS USING PRIMARY KEY (kind=? AND object_id=? AND key=?)")
		cases = append(cases,
			planCase{name: "pending", query: pendingWorkspacesSQL, args: []any{100}, want: []string{"SCAN w USING INDEX workspaces_pending"}},
			planCase{name: "on node", query: workspacesOnNodeSQL, args: []any{"n3"}, want: []string{"SEARCH w USING INDEX workspaces_node (node_id=?)"}},
			planCase{name: "processing", query: processingCommandsSQL, args: []any{"workspace", 100},
				want: []string{"SEARCH commands USING INDEX commands_processing (object_kind=?)"}},
			planCase{name: "labels of a page", query: labelsSQL, args: []any{"workspace", `["w0001","w0002"]`},
				want: []string{"SEARCH labels USING PRIMARY KEY (kind=? AND object_id=?)"}},
		)
		for _, tc := range cases {
			name := fmt.Sprintf("%s (analyzed=%v)", tc.name, analyzed)
			plan := explainSQL(t, s, tc.query, tc.args...)
			t.Logf("%s:\n  %s", name, strings.Join(plan, "\n  "))
			for _, w := range tc.want {
				found := false
				for _, p := range plan {
					found = found || p == w
				}
				if !found {
					t.Errorf("%s: plan lacks %q", name, w)
				}
			}
			sorts := 0
			for _, p := range plan {
				switch {
				case strings.Contains(p, "TEMP B-TREE"):
					sorts++
				case strings.HasPrefix(p, "SCAN") && !strings.HasPrefix(p, "SCAN (subquery") &&
					p != "SCAN w USING INDEX workspaces_pending" && !strings.HasPrefix(p, "SCAN j VIRTUAL TABLE"):
					// workspaces_pending holds only what the query returns.
					t.Errorf("%s: plan has %q: a page would cost more than its rows", name, p)
				}
			}
			if sorts > tc.sorts {
				t.Errorf("%s: %d temporary sorts, want at most %d", name, sorts, tc.sorts)
			}
		}
	}
}

// TestMigrateLabelsKept opens a database created at schema version 1, with
// resources and labels in it: migration 2 rebuilds labels without its
// foreign key to resources, keeping every row, so that Workspaces can have
// labels too.
func TestMigrateLabelsKept(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ctrl.db")
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path+"?_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`CREATE TABLE schema_migrations (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT`,
		ms[0].SQL,
		`INSERT INTO schema_migrations VALUES (1, '` + ms[0].Name + `', 0)`,
		`INSERT INTO resources VALUES ('egress', 'e1', 5, 5, 1, x'', 1, '{}', 1)`,
		`INSERT INTO labels VALUES ('egress', 'e1', 'app', 'web', 5), ('egress', 'e1', 'tier', 'front', 5)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%.60s: %v", stmt, err)
		}
	}
	// Version 1 refuses the labels of an object that is not a resource.
	if _, err := db.ExecContext(ctx, `INSERT INTO labels VALUES ('workspace', 'w1', 'app', 'web', 5)`); err == nil {
		t.Fatal("schema version 1 accepted a label without a resource: the test does not test the migration")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.InTx(ctx, func(tx store.Tx) error {
		return tx.InsertWorkspace(ctx, &store.Workspace{ID: "e1", CreatedAt: base, Labels: map[string]string{"app": "web"}})
	}); err != nil {
		t.Fatalf("InsertWorkspace with labels after migrating: %v", err)
	}
	if err := s.View(ctx, func(tx store.Tx) error {
		r, err := tx.GetResource(ctx, store.KindEgress, "e1")
		if err != nil {
			return err
		}
		if want := map[string]string{"app": "web", "tier": "front"}; !maps.Equal(r.Labels, want) {
			t.Errorf("labels of e1 after migrating: %v, want %v", r.Labels, want)
		}
		page, err := tx.ListResources(ctx, store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"tier": "front"}, Limit: 10})
		if err != nil {
			return err
		}
		if len(page) != 1 || page[0].ID != "e1" {
			t.Errorf("selector after migrating: %d resources, want e1", len(page))
		}
		ws, err := tx.ListWorkspaces(ctx, store.WorkspaceQuery{Selector: map[string]string{"app": "web"}, Limit: 10})
		if err != nil {
			return err
		}
		if len(ws) != 1 || ws[0].ID != "e1" || !maps.Equal(ws[0].Labels, map[string]string{"app": "web"}) {
			t.Errorf("workspace selector after migrating: %+v", ws)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var n int
	readerRow(t, s, `SELECT count(*) FROM pragma_foreign_key_list('labels')`, nil, &n)
	if n != 0 {
		t.Errorf("labels has %d foreign keys after migrating, want none", n)
	}
	var check string
	if readerRow(t, s, `PRAGMA integrity_check`, nil, &check); check != "ok" {
		t.Errorf("integrity_check: %q", check)
	}
}

// TestPartialIndexConstants: the partial indexes test the stored values the
// statements spell, store.WorkspaceStateDeleted and store.CommandProcessing.
func TestPartialIndexConstants(t *testing.T) {
	s := openTest(t)
	for index, want := range map[string]string{
		"workspaces_live":     fmt.Sprintf("WHERE state != %d", store.WorkspaceStateDeleted),
		"commands_processing": fmt.Sprintf("WHERE status = %d", store.CommandProcessing),
	} {
		var ddl string
		readerRow(t, s, `SELECT sql FROM sqlite_schema WHERE type = 'index' AND name = ?`, []any{index}, &ddl)
		if !strings.HasSuffix(ddl, want) {
			t.Errorf("%s: %s, want it to end with %q", index, ddl, want)
		}
	}
}
