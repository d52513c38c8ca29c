package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kibotos/kibotos/internal/store/migration"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
)

// TestSchemaCompat: a new schema records its newest breaking change in
// schema_compat; a binary that knows it opens the schema although newer
// migrations are applied (the previous release during a rolling upgrade,
// and this one after a newer binary's additive change), applying nothing; a
// binary that does not refuses with a message naming both versions.
func TestSchemaCompat(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	var schema string
	if err := s.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cfg := s.pool.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for i, m := range ms {
		if m.Breaks() {
			last = i
		}
	}
	if last < 0 {
		t.Fatal("no breaking migration")
	}
	known := ms[len(ms)-1].Version
	migrateAs := func(ms ...migration.Migration) error { return migrateWith(ctx, cfg.ConnConfig.Copy(), ms) }

	var minVersion int
	var change string
	if err := s.pool.QueryRow(ctx, `SELECT min_version, change_name FROM schema_compat`).Scan(&minVersion, &change); err != nil {
		t.Fatal(err)
	}
	if minVersion != ms[last].Version || change != ms[last].Change() {
		t.Errorf("schema_compat = %d %s, want %d %s", minVersion, change, ms[last].Version, ms[last].Change())
	}
	if err := migrateAs(ms[:last+1]...); err != nil {
		t.Errorf("a binary knowing version %d (of %d): %v", ms[last].Version, known, err)
	}
	if err := migrateAs(ms[:last]...); !errors.As(err, new(*migration.TooOldError)) {
		t.Errorf("a binary knowing version %d: %v, want a TooOldError", ms[last-1].Version, err)
	}

	additive := migration.Migration{Version: known + 1, Name: fmt.Sprintf("%04d_future_additive.sql", known+1),
		SQL: `CREATE TABLE future_additive (x INTEGER)`}
	if err := migrateAs(append(ms[:len(ms):len(ms)], additive)...); err != nil {
		t.Fatal(err)
	}
	other, err := openConfig(ctx, cfg.Copy())
	if err != nil {
		t.Fatalf("open after a newer binary's additive change: %v", err)
	}
	other.Close()
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(ms)+1 {
		t.Errorf("schema_migrations has %d rows, want %d", n, len(ms)+1)
	}

	migration.Breaking["future_breaking"] = "test"
	t.Cleanup(func() { delete(migration.Breaking, "future_breaking") })
	breaking := migration.Migration{Version: known + 2, Name: fmt.Sprintf("%04d_future_breaking.sql", known+2),
		SQL: `CREATE TABLE future_breaking (x INTEGER)`}
	if err := migrateAs(append(ms[:len(ms):len(ms)], additive, breaking)...); err != nil {
		t.Fatal(err)
	}
	_, err = openConfig(ctx, cfg.Copy())
	want := fmt.Sprintf("this kibotos-ctrl knows postgres schema version %d, the database needs at least version %d (change future_breaking): upgrade kibotos-ctrl", known, known+2)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("open after a newer binary's breaking change: %v, want %q", err, want)
	}
}

// TestMigrateEmptyConcurrently starts four stores at once on an empty
// schema, as replicas starting together on a new database do: every one
// opens, and each migration is applied once (schema_migrations has one row
// per version; a second application would have failed on its CREATE TABLE).
func TestMigrateEmptyConcurrently(t *testing.T) {
	ctx := context.Background()
	var urlUsed string
	s, cleanup, err := pgtest.Open(ctx, testURL(t), func(ctx context.Context, url string) (*Store, error) {
		urlUsed = url
		stores := make([]*Store, 4)
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i := range stores {
			wg.Go(func() { stores[i], errs[i] = Open(ctx, url) })
		}
		wg.Wait()
		for i := 1; i < len(stores); i++ {
			if stores[i] != nil {
				stores[i].Close()
			}
		}
		if err := errors.Join(errs...); err != nil {
			if stores[0] != nil {
				stores[0].Close()
			}
			return nil, err
		}
		return stores[0], nil
	})
	if err != nil {
		t.Fatalf("four concurrent opens of an empty schema: %v", err)
	}
	t.Cleanup(func() {
		if err := cleanup(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if !strings.Contains(urlUsed, "search_path=") {
		t.Fatalf("pgtest gave %q", urlUsed)
	}
	ms, _ := migrations()
	rows, err := s.pool.Query(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	if len(versions) != len(ms) {
		t.Errorf("schema_migrations has %d rows, want %d", len(versions), len(ms))
	}
	for i, v := range versions {
		if i < len(ms) && int(v) != ms[i].Version {
			t.Errorf("schema_migrations[%d] = %d, want %d", i, v, ms[i].Version)
		}
	}
}
