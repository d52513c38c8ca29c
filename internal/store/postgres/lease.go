package postgres

import (
	"context"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// AcquireLease implements store.Tx: the row is created empty when missing,
// then locked (FOR UPDATE), so that racing replicas serialize on it, and
// changed by store.NextLease.
func (t *txn) AcquireLease(ctx context.Context, name, holder string, now time.Time, ttl time.Duration) (store.Lease, error) {
	if _, err := t.exec(ctx, `INSERT INTO leases (name, holder, fence, expires_at) VALUES ($1, '', 0, 0)
		ON CONFLICT (name) DO NOTHING`, name); err != nil {
		return store.Lease{}, err
	}
	cur := store.Lease{Name: name}
	var exp int64
	if err := t.queryRow(ctx, `SELECT holder, fence, expires_at FROM leases WHERE name = $1 FOR UPDATE`,
		[]any{name}, &cur.Holder, &cur.Fence, &exp); err != nil {
		return store.Lease{}, err
	}
	cur.ExpiresAt = rowcodec.FromMicros(exp)
	next, changed := store.NextLease(cur, holder, now, ttl)
	if !changed {
		return cur, nil
	}
	if _, err := t.exec(ctx, `UPDATE leases SET holder = $2, fence = $3, expires_at = $4 WHERE name = $1`,
		name, next.Holder, next.Fence, rowcodec.Micros(next.ExpiresAt)); err != nil {
		return store.Lease{}, err
	}
	next.ExpiresAt = rowcodec.FromMicros(rowcodec.Micros(next.ExpiresAt))
	return next, nil
}
