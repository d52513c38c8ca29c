package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/internal/store/migration"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations returns the embedded migrations in version order, checked
// against migration.Changes.
func migrations() ([]migration.Migration, error) {
	return migration.LoadDialect(migration.SQLite, migrationFS, "migrations")
}

// migrate applies the migrations not yet recorded in schema_migrations, in
// order, in one BEGIN IMMEDIATE transaction: a second process opening the
// same file waits for the first (busy_timeout) and then finds them applied.
// What it applies, and whether it refuses a database that needs a newer
// binary, is migration.Plan's decision, with schema_compat (compat.go).
func migrate(ctx context.Context, db *sql.DB) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	return migrateWith(ctx, db, ms)
}

// migrateWith is migrate with the migrations ms (tests pass the migrations
// of an older or a newer binary).
func migrateWith(ctx context.Context, db *sql.DB, ms []migration.Migration) error {
	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: _txlock on the writer
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER NOT NULL PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at INTEGER NOT NULL
	) STRICT`); err != nil {
		return err
	}
	applied := map[int]bool{}
	rows, err := tx.QueryContext(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return err
		}
		applied[v] = true
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rec, err := readCompat(ctx, tx)
	if err != nil {
		return err
	}
	pending, raise, err := migration.Plan(migration.SQLite, ms, applied, rec)
	if err != nil {
		return err
	}
	if raise != nil {
		if err := raiseCompat(ctx, tx, *raise); err != nil {
			return err
		}
	}
	for _, m := range pending {
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("%s: %w", m.Name, err)
		}
		if fill := backfills[m.Change()]; fill != nil {
			if err := fill(ctx, tx); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
			m.Version, m.Name, time.Now().UnixMicro()); err != nil {
			return fmt.Errorf("%s: %w", m.Name, err)
		}
		if m.Breaks() {
			if err := raiseCompat(ctx, tx, migration.Compat{MinVersion: m.Version, Change: m.Change()}); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
		}
	}
	return tx.Commit()
}

// backfills are the Go steps of migrations whose rows SQL cannot fill,
// by migration.Change name; each runs in the migration's transaction.
var backfills = map[string]func(context.Context, *sql.Tx) error{
	rowcodec.BackfillWorkspaceUsage:       backfillWorkspaceUsage,
	rowcodec.BackfillWorkspaceCPUTemplate: backfillWorkspaceCPUTemplate,
}

// eachWorkspaceDoc calls fn with the ID and document of every stored
// Workspace; the rows are closed before it returns, so that the caller may
// write afterwards in the same transaction.
func eachWorkspaceDoc(ctx context.Context, tx *sql.Tx, fn func(id string, doc []byte) error) error {
	rows, err := tx.QueryContext(ctx, `SELECT id, doc FROM workspaces`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id  string
			doc []byte
		)
		if err := rows.Scan(&id, &doc); err != nil {
			return err
		}
		if err := fn(id, doc); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}

// backfillWorkspaceUsage fills memory_mib and layer_bytes of the Workspaces
// stored before the migration that added them, from their documents
// (rowcodec.WorkspaceUsage).
func backfillWorkspaceUsage(ctx context.Context, tx *sql.Tx) error {
	type usage struct {
		id            string
		memory, layer int64
	}
	var fill []usage
	if err := eachWorkspaceDoc(ctx, tx, func(id string, doc []byte) error {
		memory, layer, _ := rowcodec.WorkspaceUsage(doc)
		if memory == 0 && layer == 0 {
			return nil
		}
		m, err := rowcodec.U2I("memory", memory)
		if err != nil {
			return err
		}
		l, err := rowcodec.U2I("layer bytes", layer)
		if err != nil {
			return err
		}
		fill = append(fill, usage{id, m, l})
		return nil
	}); err != nil {
		return err
	}
	for _, u := range fill {
		if _, err := tx.ExecContext(ctx, `UPDATE workspaces SET memory_mib = ?, layer_bytes = ? WHERE id = ?`, u.memory, u.layer, u.id); err != nil {
			return err
		}
	}
	return nil
}

// backfillWorkspaceCPUTemplate fills cpu_millis and template_key of the
// Workspaces stored before the migration that added them, from their
// documents (rowcodec.WorkspaceCPUTemplate).
func backfillWorkspaceCPUTemplate(ctx context.Context, tx *sql.Tx) error {
	type fill struct {
		id, template string
		cpu          int64
	}
	var fills []fill
	if err := eachWorkspaceDoc(ctx, tx, func(id string, doc []byte) error {
		cpu, template, _ := rowcodec.WorkspaceCPUTemplate(doc)
		if cpu == 0 && template == "" {
			return nil
		}
		c, err := rowcodec.U2I("cpu", cpu)
		if err != nil {
			return err
		}
		fills = append(fills, fill{id, template, c})
		return nil
	}); err != nil {
		return err
	}
	for _, f := range fills {
		if _, err := tx.ExecContext(ctx, `UPDATE workspaces SET cpu_millis = ?, template_key = ? WHERE id = ?`, f.cpu, f.template, f.id); err != nil {
			return err
		}
	}
	return nil
}
