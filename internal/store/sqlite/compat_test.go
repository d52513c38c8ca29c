package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/store/migration"
)

// migrateAs migrates the database at path with the migrations of another
// binary, ms.
func migrateAs(t *testing.T, path string, ms []migration.Migration) error {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return migrateWith(context.Background(), db, ms)
}

// lastBreaking is the index in ms of the newest breaking migration.
func lastBreaking(t *testing.T, ms []migration.Migration) int {
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].Breaks() {
			return i
		}
	}
	t.Fatal("no breaking migration")
	return -1
}

// TestSchemaCompat: a new database records its newest breaking change in
// schema_compat; a binary that knows it opens the database although newer
// migrations are applied (the previous release during an upgrade, and this
// one after a newer binary's additive change), applying nothing; a binary
// that does not refuses with a message naming both versions.
func TestSchemaCompat(t *testing.T) {
	ctx := context.Background()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	last := lastBreaking(t, ms)
	known := ms[len(ms)-1].Version

	path := filepath.Join(t.TempDir(), "ctrl.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	var minVersion int
	var change string
	readerRow(t, s, `SELECT min_version, change_name FROM schema_compat`, nil, &minVersion, &change)
	if minVersion != ms[last].Version || change != ms[last].Change() {
		t.Errorf("schema_compat = %d %s, want %d %s", minVersion, change, ms[last].Version, ms[last].Change())
	}
	s.Close()

	// The previous release, which knows the newest breaking change but
	// not what follows it, opens the database as it is.
	if err := migrateAs(t, path, ms[:last+1]); err != nil {
		t.Errorf("a binary knowing version %d (of %d): %v", ms[last].Version, known, err)
	}
	// One that does not know it refuses.
	if err := migrateAs(t, path, ms[:last]); !errors.As(err, new(*migration.TooOldError)) {
		t.Errorf("a binary knowing version %d: %v, want a TooOldError", ms[last-1].Version, err)
	}

	// A newer binary adds an additive change: this one still opens the
	// database, and does not touch the newer schema.
	additive := migration.Migration{Version: known + 1, Name: fmt.Sprintf("%04d_future_additive.sql", known+1),
		SQL: `CREATE TABLE future_additive (x INTEGER) STRICT`}
	if err := migrateAs(t, path, append(ms[:len(ms):len(ms)], additive)); err != nil {
		t.Fatal(err)
	}
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatalf("Open after a newer binary's additive change: %v", err)
	}
	var n int
	readerRow(t, s, `SELECT count(*) FROM schema_migrations`, nil, &n)
	if n != len(ms)+1 {
		t.Errorf("schema_migrations has %d rows, want %d", n, len(ms)+1)
	}
	s.Close()

	// A newer binary applies a breaking change: this one refuses.
	migration.Breaking["future_breaking"] = "test"
	t.Cleanup(func() { delete(migration.Breaking, "future_breaking") })
	breaking := migration.Migration{Version: known + 2, Name: fmt.Sprintf("%04d_future_breaking.sql", known+2),
		SQL: `CREATE TABLE future_breaking (x INTEGER) STRICT`}
	if err := migrateAs(t, path, append(ms[:len(ms):len(ms)], additive, breaking)); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, path)
	want := fmt.Sprintf("this kibotos-ctrl knows sqlite schema version %d, the database needs at least version %d (change future_breaking): upgrade kibotos-ctrl", known, known+2)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Open after a newer binary's breaking change: %v, want %q", err, want)
	}
}
