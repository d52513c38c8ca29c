package sqlite

import (
	"context"
	"database/sql"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// The armed expirations are range scans of the workspaces_expiration
// partial index (migration 8); the IS NOT NULL term repeats the index's, as
// SQLite's planner wants to use a partial index.
const (
	dueExpirationsSQL = `SELECT id, expiration_deadline FROM workspaces
		WHERE expiration_deadline IS NOT NULL AND expiration_deadline <= ? AND (expiration_deadline, id) > (?, ?)
		ORDER BY expiration_deadline, id LIMIT ?`
	nextExpirationSQL = `SELECT expiration_deadline FROM workspaces
		WHERE expiration_deadline IS NOT NULL AND expiration_deadline > ?
		ORDER BY expiration_deadline, id LIMIT 1`
)

// DueExpirations implements store.Tx. A limit of 0 or less returns nothing.
func (t *txn) DueExpirations(ctx context.Context, before time.Time, after *store.ArmedExpiration, limit int) ([]store.ArmedExpiration, error) {
	if limit <= 0 {
		return nil, nil
	}
	afterUS, afterID := int64(-1<<63), ""
	if after != nil {
		afterUS, afterID = rowcodec.Micros(after.Deadline), after.WorkspaceID
	}
	var out []store.ArmedExpiration
	err := t.query(ctx, dueExpirationsSQL, []any{rowcodec.Micros(before), afterUS, afterID, limit}, func(rows *sql.Rows) error {
		var (
			e  store.ArmedExpiration
			us int64
		)
		if err := rows.Scan(&e.WorkspaceID, &us); err != nil {
			return err
		}
		e.Deadline = rowcodec.FromMicros(us)
		out = append(out, e)
		return nil
	})
	return out, err
}

// NextExpiration implements store.Tx.
func (t *txn) NextExpiration(ctx context.Context, after time.Time) (time.Time, bool, error) {
	var (
		us int64
		ok bool
	)
	err := t.query(ctx, nextExpirationSQL, []any{rowcodec.Micros(after)}, func(rows *sql.Rows) error {
		ok = true
		return rows.Scan(&us)
	})
	if err != nil || !ok {
		return time.Time{}, false, err
	}
	return rowcodec.FromMicros(us), true, nil
}
