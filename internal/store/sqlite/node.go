package sqlite

import (
	"context"
	"database/sql"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// NodeStates implements store.Tx.
func (t *txn) NodeStates(ctx context.Context) ([]store.NodeState, error) {
	var out []store.NodeState
	err := t.query(ctx, `SELECT `+rowcodec.NodeStateColumns+` FROM nodes ORDER BY id`, nil, func(rows *sql.Rows) error {
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

// TouchNodes implements store.Store: one write transaction of an UPDATE
// per touch.
func (s *Store) TouchNodes(ctx context.Context, touches []store.NodeTouch) ([]string, error) {
	if len(touches) == 0 {
		return nil, nil
	}
	var stale []string
	err := s.inTx(ctx, func(t *txn) error {
		stale = nil
		for _, n := range touches {
			c, err := t.execN(ctx, `UPDATE nodes SET last_seen = ? WHERE id = ? AND epoch = ?`, rowcodec.Micros(n.Seen), n.ID, n.Epoch)
			if err != nil {
				return err
			}
			if c == 0 {
				stale = append(stale, n.ID)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return stale, nil
}

// NodeEpoch implements store.Tx.
func (t *txn) NodeEpoch(ctx context.Context, id string) (int64, error) {
	return queryOne(ctx, t, rowcodec.ScanInt64, `SELECT epoch FROM nodes WHERE id = ?`, id)
}

// GetLease implements store.Tx.
func (t *txn) GetLease(ctx context.Context, name string) (store.Lease, error) {
	return queryOne(ctx, t, scanLease, `SELECT name, holder, fence, expires_at FROM leases WHERE name = ?`, name)
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
