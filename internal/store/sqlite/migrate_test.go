package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/migration"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// createAtVersion creates a database at path with the first version
// migrations applied, as a store of that version left it, then runs stmts.
func createAtVersion(t *testing.T, path string, version int, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path+"?_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	all := []string{`CREATE TABLE schema_migrations (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT`}
	for _, m := range ms[:version] {
		all = append(all, m.SQL, fmt.Sprintf(`INSERT INTO schema_migrations VALUES (%d, '%s', 0)`, m.Version, m.Name))
	}
	for _, stmt := range append(all, stmts...) {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%.60s: %v", stmt, err)
		}
	}
}

// TestMigrateResourcesListOrder opens a database created at schema version
// 2, with resources, their labels and a Workspace in it: migration 3
// rebuilds resources clustered in list order, with their labels in the row,
// keeping every row.
func TestMigrateResourcesListOrder(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ctrl.db")
	type row struct {
		kind, id    string
		created     int64
		spec        string // hex
		labels      map[string]string
		annotations string
	}
	rows := []row{
		{"egress", "eg-zz", 30, "0a01", map[string]string{"app": "web", "tier": "front"}, `{"note":"x"}`},
		{"egress", "eg-aa", 20, "", map[string]string{"app": "web"}, `{}`},
		{"egress", "eg-mm", 20, "ff", nil, `{}`},
		{"egress", "eg-bb", 10, "00", map[string]string{"app": "db", "q": `"quoted" \ and ünïcode`}, `{}`},
		{"secret", "eg-aa", 5, "01", map[string]string{"app": "web"}, `{}`},
	}
	stmts := []string{
		// A Workspace and its labels, which migration 3 leaves alone.
		`INSERT INTO workspaces VALUES ('w1', 7, 7, NULL, x'', 1, 0, '', 0, 0, 1, '', 0, 0, 0, NULL)`,
		`INSERT INTO labels VALUES ('workspace', 'w1', 'app', 'web', 7)`,
	}
	for _, r := range rows {
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO resources VALUES ('%s', '%s', %d, %d, 3, x'%s', 2, '%s', 1)`,
			r.kind, r.id, r.created, r.created+1, r.spec, r.annotations))
		for k, v := range r.labels {
			stmts = append(stmts, fmt.Sprintf(`INSERT INTO labels VALUES ('%s', '%s', '%s', '%s', %d)`,
				r.kind, r.id, k, strings.ReplaceAll(v, "'", "''"), r.created))
		}
	}
	createAtVersion(t, path, 2, stmts...)

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.View(ctx, func(tx store.Tx) error {
		for _, r := range rows {
			got, err := tx.GetResource(ctx, store.ResourceKind(r.kind), r.id)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", r.kind, r.id, err)
			}
			want := r.labels
			if want == nil {
				want = map[string]string{}
			}
			if !maps.Equal(got.Labels, want) || got.CreatedAt != rowcodec.FromMicros(r.created) || got.UpdatedAt != rowcodec.FromMicros(r.created+1) ||
				got.Revision != 3 || got.LabelsRevision != 2 || got.AnnotationsRevision != 1 || fmt.Sprintf("%x", got.Spec) != r.spec {
				t.Errorf("%s/%s after migrating: %+v", r.kind, r.id, got)
			}
		}
		page, err := tx.ListResources(ctx, store.ListQuery{Kind: store.KindEgress, Limit: 10})
		if err != nil {
			return err
		}
		if got, want := resourceIDs(page), []string{"eg-bb", "eg-aa", "eg-mm", "eg-zz"}; !slices.Equal(got, want) {
			t.Errorf("list after migrating: %v, want %v", got, want)
		}
		if want := map[string]string{"note": "x"}; !maps.Equal(page[3].Annotations, want) {
			t.Errorf("annotations of eg-zz: %v, want %v", page[3].Annotations, want)
		}
		page, err = tx.ListResources(ctx, store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"app": "web"}, Limit: 10})
		if err != nil {
			return err
		}
		if got, want := resourceIDs(page), []string{"eg-aa", "eg-zz"}; !slices.Equal(got, want) {
			t.Errorf("selector after migrating: %v, want %v", got, want)
		}
		page, err = tx.ListResources(ctx, store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"app": "web"},
			After: &store.Cursor{CreatedAt: rowcodec.FromMicros(20), ID: "eg-aa"}, Limit: 10})
		if err != nil {
			return err
		}
		if got, want := resourceIDs(page), []string{"eg-zz"}; !slices.Equal(got, want) {
			t.Errorf("selector page 2 after migrating: %v, want %v", got, want)
		}
		ws, err := tx.ListWorkspaces(ctx, store.WorkspaceQuery{Selector: map[string]string{"app": "web"}, Limit: 10})
		if err != nil {
			return err
		}
		if len(ws) != 1 || ws[0].ID != "w1" || !maps.Equal(ws[0].Labels, map[string]string{"app": "web"}) {
			t.Errorf("workspace selector after migrating: %+v", ws)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// An ID is still unique within its kind, whatever its created_at.
	dup := resource("eg-mm", nil)
	dup.CreatedAt = base.Add(time.Hour)
	if err := s.InTx(ctx, func(tx store.Tx) error { return tx.InsertResource(ctx, dup) }); !errors.Is(err, store.ErrDuplicate) {
		t.Errorf("insert of a duplicate ID: %v, want ErrDuplicate", err)
	}
	dup.CreatedAt = rowcodec.FromMicros(20)
	if err := s.InTx(ctx, func(tx store.Tx) error { return tx.InsertResource(ctx, dup) }); !errors.Is(err, store.ErrDuplicate) {
		t.Errorf("insert of a duplicate ID and created_at: %v, want ErrDuplicate", err)
	}
	// Updates and deletes of migrated rows keep both copies of the labels.
	if err := s.InTx(ctx, func(tx store.Tx) error {
		r, err := tx.GetResource(ctx, store.KindEgress, "eg-aa")
		if err != nil {
			return err
		}
		r.Labels = map[string]string{"app": "api"}
		r.Revision++
		if err := tx.UpdateResource(ctx, r); err != nil {
			return err
		}
		return tx.DeleteResource(ctx, store.KindEgress, "eg-zz")
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.View(ctx, func(tx store.Tx) error {
		for sel, want := range map[string][]string{"web": nil, "api": {"eg-aa"}} {
			page, err := tx.ListResources(ctx, store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"app": sel}, Limit: 10})
			if err != nil {
				return err
			}
			if got := resourceIDs(page); !slices.Equal(got, want) {
				t.Errorf("app=%s after update and delete: %v, want %v", sel, got, want)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	var ddl string
	readerRow(t, s, `SELECT sql FROM sqlite_schema WHERE name = 'resources'`, nil, &ddl)
	if !strings.Contains(ddl, "PRIMARY KEY (kind, created_at, id)") || !strings.Contains(ddl, "WITHOUT ROWID") {
		t.Errorf("resources after migrating:\n%s", ddl)
	}
	var indexes string
	readerRow(t, s, `SELECT group_concat(name || ':' || "unique", ' ') FROM (SELECT * FROM pragma_index_list('resources') ORDER BY name)`, nil, &indexes)
	if indexes != "resources_id:1 sqlite_autoindex_resources_1:1" {
		t.Errorf("indexes of resources after migrating: %s", indexes)
	}
	var check string
	if readerRow(t, s, `PRAGMA integrity_check`, nil, &check); check != "ok" {
		t.Errorf("integrity_check: %q", check)
	}
	var n int
	readerRow(t, s, `SELECT count(*) FROM schema_migrations`, nil, &n)
	if ms, _ := migrations(); n != len(ms) {
		t.Errorf("schema_migrations has %d rows, want %d", n, len(ms))
	}
}

func resourceIDs(rs []*store.Resource) []string {
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.ID)
	}
	return ids
}

// TestMigrationVersions: a new database records the versions and names
// migration.Changes gives SQLite, which databases already deployed have
// recorded too (a renumbered file would fail here and there).
func TestMigrationVersions(t *testing.T) {
	s := openTest(t)
	var want []string
	for _, c := range migration.Changes {
		if v := c.Version(migration.SQLite); v != 0 {
			want = append(want, fmt.Sprintf("%d %04d_%s.sql", v, v, c.Name))
		}
	}
	var got string
	readerRow(t, s, `SELECT group_concat(version || ' ' || name, ', ') FROM (SELECT * FROM schema_migrations ORDER BY version)`, nil, &got)
	if got != strings.Join(want, ", ") {
		t.Errorf("schema_migrations = %s, want %s", got, strings.Join(want, ", "))
	}
}

// TestMigrateNetwork opens a database created at schema version 6 with a
// Workspace and an Egress in it: migration 7 gives them the defaults of the
// network columns (drains of 600 seconds, no DNS configuration version).
func TestMigrateNetwork(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ctrl.db")
	createAtVersion(t, path, 6,
		`INSERT INTO workspaces VALUES ('w1', 7, 7, NULL, x'', 1, 0, 'node-a', 1, 0, 1, '', 0, 0, 0, NULL)`,
		`INSERT INTO resources VALUES ('egress', 'eg-1', 10, 11, 3, x'0a01', '{}', 1, '{}', 1)`)
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.View(ctx, func(tx store.Tx) error {
		w, err := tx.GetWorkspace(ctx, "w1")
		if err != nil {
			return err
		}
		if w.PolicyDrainSeconds != 600 || w.ExecDNSVersion != 0 {
			t.Errorf("workspace after migrating: policy drain %d, DNS version %d; want 600 and 0", w.PolicyDrainSeconds, w.ExecDNSVersion)
		}
		r, err := tx.GetResource(ctx, store.KindEgress, "eg-1")
		if err != nil {
			return err
		}
		if r.DrainSeconds != 600 || r.Revision != 3 {
			t.Errorf("egress after migrating: drain %d revision %d; want 600 and 3", r.DrainSeconds, r.Revision)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateCommandMessage opens a database created at schema version 8
// with a command recorded in it: migration 9 gives it an empty message (a
// command recorded before it says nothing of why it started), and the
// command reads back as it was.
func TestMigrateCommandMessage(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ctrl.db")
	createAtVersion(t, path, 8,
		`INSERT INTO commands VALUES ('host-memory/n1/1/ws-1', 'ctrl/host-memory', x'', 'workspace', 'ws-1', 3, 3, 2, x'0a01', '', x'', 10, 11)`)
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.View(ctx, func(tx store.Tx) error {
		c, err := tx.GetCommand(ctx, "host-memory/n1/1/ws-1")
		if err != nil {
			return err
		}
		if c.Message != "" || c.ObjectID != "ws-1" || c.Initiator != 3 || c.Status != store.CommandCompleted ||
			string(c.Result) != "\x0a\x01" || c.CompletedAt != rowcodec.FromMicros(11) {
			t.Errorf("command after migrating: %+v", c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
