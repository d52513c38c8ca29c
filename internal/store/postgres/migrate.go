package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/internal/store/migration"
	"github.com/kibotos/kibotos/internal/store/rowcodec"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrationLockClass is the first key of the session advisory lock taken
// while migrating; the second is a hash of the schema, so stores in different
// schemas migrate independently. The two-key form lives in a lock space of
// its own, apart from LockCommand's one-key locks.
const migrationLockClass = 0x6b69626f // "kibo"

// migrations returns the embedded migrations in version order, checked
// against migration.Changes.
func migrations() ([]migration.Migration, error) {
	return migration.LoadDialect(migration.Postgres, migrationFS, "migrations")
}

// migrate applies the migrations not yet recorded in schema_migrations, each
// in its own transaction, on a dedicated connection holding a session
// advisory lock: a second process migrating the same schema at the same time
// waits, then finds nothing left to do. Closing the connection releases the
// lock whatever happens. What it applies, and whether it refuses a schema
// that needs a newer binary, is migration.Plan's decision, with
// schema_compat (compat.go).
func migrate(ctx context.Context, cfg *pgx.ConnConfig) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	return migrateWith(ctx, cfg, ms)
}

// migrateWith is migrate with the migrations ms (tests pass the migrations
// of an older or a newer binary).
func migrateWith(ctx context.Context, cfg *pgx.ConnConfig, ms []migration.Migration) (err error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, conn.Close(context.WithoutCancel(ctx)))
	}()
	var schema *string
	if err := conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return err
	}
	if schema == nil {
		return errors.New("no schema of the search_path exists")
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, migrationLockClass, *schema); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER NOT NULL PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at BIGINT  NOT NULL
	)`); err != nil {
		return err
	}
	rows, err := conn.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return err
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return err
	}
	applied := map[int]bool{}
	for _, v := range versions {
		applied[int(v)] = true
	}
	rec, err := readCompat(ctx, conn)
	if err != nil {
		return err
	}
	pending, raise, err := migration.Plan(migration.Postgres, ms, applied, rec)
	if err != nil {
		return err
	}
	if raise != nil {
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return raiseCompat(ctx, tx, *raise) }); err != nil {
			return err
		}
	}
	for _, m := range pending {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// Without arguments Exec uses the simple protocol, which runs a
			// file of several statements.
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			if fill := backfills[m.Change()]; fill != nil {
				if err := fill(ctx, tx); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
				m.Version, m.Name, time.Now().UnixMicro()); err != nil {
				return err
			}
			if m.Breaks() {
				return raiseCompat(ctx, tx, migration.Compat{MinVersion: m.Version, Change: m.Change()})
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: %w", m.Name, err)
		}
	}
	return nil
}

// backfills are the Go steps of migrations whose rows SQL cannot fill,
// by migration.Change name; each runs in the migration's transaction.
var backfills = map[string]func(context.Context, pgx.Tx) error{
	rowcodec.BackfillWorkspaceUsage:       backfillWorkspaceUsage,
	rowcodec.BackfillWorkspaceCPUTemplate: backfillWorkspaceCPUTemplate,
}

// eachWorkspaceDoc calls fn with the ID and document of every stored
// Workspace; the rows are closed before it returns, so that the caller may
// write afterwards in the same transaction.
func eachWorkspaceDoc(ctx context.Context, tx pgx.Tx, fn func(id string, doc []byte) error) error {
	rows, err := tx.Query(ctx, `SELECT id, doc FROM workspaces`)
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
	rows.Close()
	return rows.Err()
}

// backfillWorkspaceUsage fills memory_mib and layer_bytes of the Workspaces
// stored before the migration that added them, from their documents
// (rowcodec.WorkspaceUsage).
func backfillWorkspaceUsage(ctx context.Context, tx pgx.Tx) error {
	var ids []string
	var memories, layers []int64
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
		ids, memories, layers = append(ids, id), append(memories, m), append(layers, l)
		return nil
	}); err != nil || len(ids) == 0 {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE workspaces w SET memory_mib = u.memory, layer_bytes = u.layer
		FROM unnest($1::TEXT[], $2::BIGINT[], $3::BIGINT[]) AS u(id, memory, layer) WHERE w.id = u.id`,
		ids, memories, layers)
	return err
}

// backfillWorkspaceCPUTemplate fills cpu_millis and template_key of the
// Workspaces stored before the migration that added them, from their
// documents (rowcodec.WorkspaceCPUTemplate).
func backfillWorkspaceCPUTemplate(ctx context.Context, tx pgx.Tx) error {
	var ids, templates []string
	var cpus []int64
	if err := eachWorkspaceDoc(ctx, tx, func(id string, doc []byte) error {
		cpu, template, _ := rowcodec.WorkspaceCPUTemplate(doc)
		if cpu == 0 && template == "" {
			return nil
		}
		c, err := rowcodec.U2I("cpu", cpu)
		if err != nil {
			return err
		}
		ids, cpus, templates = append(ids, id), append(cpus, c), append(templates, template)
		return nil
	}); err != nil || len(ids) == 0 {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE workspaces w SET cpu_millis = u.cpu, template_key = u.template
		FROM unnest($1::TEXT[], $2::BIGINT[], $3::TEXT[]) AS u(id, cpu, template) WHERE w.id = u.id`,
		ids, cpus, templates)
	return err
}
