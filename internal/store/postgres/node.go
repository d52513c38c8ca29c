package postgres

import (
	"context"

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

// touchNodesSQL updates the last_seen of every node whose epoch is the
// touch's and returns the IDs it updated.
const touchNodesSQL = `UPDATE nodes n SET last_seen = v.seen
	FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS v(id, epoch, seen)
	WHERE n.id = v.id AND n.epoch = v.epoch RETURNING n.id`

// TouchNodes implements store.Store: one statement in a READ COMMITTED
// transaction. Each row's epoch is checked on its latest committed version
// (a concurrent registration that bumps it is waited for, then the row is
// re-checked), so a superseded stream's touch writes nothing; no
// serializable transaction can fail for it. A deadlock with another touch
// of an overlapping set is tried again as InTx does.
func (s *Store) TouchNodes(ctx context.Context, touches []store.NodeTouch) ([]string, error) {
	if len(touches) == 0 {
		return nil, nil
	}
	ids, epochs, seen := make([]string, len(touches)), make([]int64, len(touches)), make([]int64, len(touches))
	for i, t := range touches {
		ids[i], epochs[i], seen[i] = t.ID, t.Epoch, rowcodec.Micros(t.Seen)
	}
	var written map[string]bool
	err := s.run(ctx, pgx.ReadCommitted, func(t *txn) error {
		written = make(map[string]bool, len(touches))
		return t.query(ctx, touchNodesSQL, []any{ids, epochs, seen}, func(rows pgx.Rows) error {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			written[id] = true
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	var stale []string
	for _, id := range ids {
		if !written[id] {
			stale = append(stale, id)
		}
	}
	return stale, nil
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
