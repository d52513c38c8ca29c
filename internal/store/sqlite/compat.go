package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/kibotos/kibotos/internal/store/migration"
)

// schema_compat holds one row (id 1), migration.Compat: the version of the
// newest breaking change applied, which every binary opening the database
// must know (migration.Plan). No row: nothing asked (a new database before
// its first breaking change). It lives beside schema_migrations, outside the
// numbered migrations, so that a binary can read it before it decides to
// migrate.
const createCompat = `CREATE TABLE IF NOT EXISTS schema_compat (
	id          INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
	min_version INTEGER NOT NULL,
	change_name TEXT    NOT NULL,
	updated_at  INTEGER NOT NULL
) STRICT`

// readCompat creates schema_compat when missing and reads its row.
func readCompat(ctx context.Context, tx *sql.Tx) (migration.Compat, error) {
	var c migration.Compat
	if _, err := tx.ExecContext(ctx, createCompat); err != nil {
		return c, err
	}
	err := tx.QueryRowContext(ctx, `SELECT min_version, change_name FROM schema_compat WHERE id = 1`).Scan(&c.MinVersion, &c.Change)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	return c, err
}

// raiseCompat records c unless the row already asks for a newer version.
func raiseCompat(ctx context.Context, tx *sql.Tx, c migration.Compat) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO schema_compat (id, min_version, change_name, updated_at) VALUES (1, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET min_version = excluded.min_version, change_name = excluded.change_name, updated_at = excluded.updated_at
		WHERE schema_compat.min_version < excluded.min_version`,
		c.MinVersion, c.Change, time.Now().UnixMicro())
	return err
}
