package sqlite

import (
	"context"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// AcquireLease implements store.Tx: the row is created empty when missing,
// then read (SQLite has one writer at a time: nothing races it) and
// changed by store.NextLease.
func (t *txn) AcquireLease(ctx context.Context, name, holder string, now time.Time, ttl time.Duration) (store.Lease, error) {
	if _, err := t.exec(ctx, `INSERT INTO leases (name, holder, fence, expires_at) VALUES (?, '', 0, 0)
		ON CONFLICT (name) DO NOTHING`, name); err != nil {
		return store.Lease{}, err
	}
	cur := store.Lease{Name: name}
	var exp int64
	if err := t.queryRow(ctx, `SELECT holder, fence, expires_at FROM leases WHERE name = ?`,
		[]any{name}, &cur.Holder, &cur.Fence, &exp); err != nil {
		return store.Lease{}, err
	}
	cur.ExpiresAt = rowcodec.FromMicros(exp)
	next, changed := store.NextLease(cur, holder, now, ttl)
	if !changed {
		return cur, nil
	}
	if _, err := t.exec(ctx, `UPDATE leases SET holder = ?, fence = ?, expires_at = ? WHERE name = ?`,
		next.Holder, next.Fence, rowcodec.Micros(next.ExpiresAt), name); err != nil {
		return store.Lease{}, err
	}
	next.ExpiresAt = rowcodec.FromMicros(rowcodec.Micros(next.ExpiresAt))
	return next, nil
}
