package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// The armed expirations are range scans of the workspaces_expiration
// partial index (migration 7).
const (
	dueExpirationsSQL = `SELECT id, expiration_deadline FROM workspaces
		WHERE expiration_deadline IS NOT NULL AND expiration_deadline <= $1 AND (expiration_deadline, id) > ($2, $3)
		ORDER BY expiration_deadline, id LIMIT $4`
	nextExpirationSQL = `SELECT expiration_deadline FROM workspaces
		WHERE expiration_deadline IS NOT NULL AND expiration_deadline > $1
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
	err := t.query(ctx, dueExpirationsSQL, []any{rowcodec.Micros(before), afterUS, afterID, limit}, func(rows pgx.Rows) error {
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
	err := t.query(ctx, nextExpirationSQL, []any{rowcodec.Micros(after)}, func(rows pgx.Rows) error {
		ok = true
		return rows.Scan(&us)
	})
	if err != nil || !ok {
		return time.Time{}, false, err
	}
	return rowcodec.FromMicros(us), true, nil
}
