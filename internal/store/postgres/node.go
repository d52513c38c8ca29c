package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// NodeStates implements store.Tx.
func (t *txn) NodeStates(ctx context.Context) ([]store.NodeState, error) {
	var out []store.NodeState
	err := t.query(ctx, `SELECT `+rowcodec.NodeStateColumns+` FROM nodes ORDER BY id`, nil, func(rows pgx.Rows) error {
		n, err := rowcodec.ScanNodeState(rows)
		if err != nil {
			return err
		}
		out = append(out, n)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// TouchNode implements store.Tx.
func (t *txn) TouchNode(ctx context.Context, id string, epoch int64, seen time.Time) (bool, error) {
	tag, err := t.exec(ctx, `UPDATE nodes SET last_seen = $1 WHERE id = $2 AND epoch = $3`, rowcodec.Micros(seen), id, epoch)
	return tag.RowsAffected() == 1, err
}

// NodeEpoch implements store.Tx.
func (t *txn) NodeEpoch(ctx context.Context, id string) (int64, error) {
	return queryOne(ctx, t, rowcodec.ScanInt64, `SELECT epoch FROM nodes WHERE id = $1`, id)
}

// GetLease implements store.Tx: a plain read (no FOR SHARE), so that the
// renewals of the holder never wait for its units of work; under
// SERIALIZABLE a takeover that commits concurrently with a unit that read
// the row conflicts with it.
func (t *txn) GetLease(ctx context.Context, name string) (store.Lease, error) {
	return queryOne(ctx, t, scanLease, `SELECT name, holder, fence, expires_at FROM leases WHERE name = $1`, name)
}

func scanLease(row rowcodec.Scanner) (store.Lease, error) {
	var l store.Lease
	var exp int64
	if err := row.Scan(&l.Name, &l.Holder, &l.Fence, &exp); err != nil {
		return l, err
	}
	l.ExpiresAt = rowcodec.FromMicros(exp)
	return l, nil
}
