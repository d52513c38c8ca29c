package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kibotos/kibotos/internal/store"
)

// queueLockClass is the first key of the session advisory locks of
// InTxQueued; the second is a hash of the store's schema and the queue's
// name, so that deployments in other schemas of the database queue apart.
// Like the migrations' two-key locks it lives apart from LockCommand's
// one-key ones.
const queueLockClass = 0x71756575 // "queu"

// defaultQueueWait is how long InTxQueued waits for its queue's turn
// before it runs its transaction unqueued: far longer than any placement
// transaction, so only a holder that is stuck (its connection cut while
// PostgreSQL has not noticed) makes it run out.
const defaultQueueWait = 2 * time.Second

const (
	queueLockSQL   = `SELECT pg_advisory_lock($1, hashtext(current_schema() || '/' || $2))`
	queueUnlockSQL = `SELECT pg_advisory_unlock($1, hashtext(current_schema() || '/' || $2))`
)

// InTxQueued implements store.Store. It takes a connection of the pool
// and, on it, the session advisory lock of queue, and runs fn as InTx does
// (with its retries) in transactions on that connection, then releases the
// lock: the transactions of one queue, on every replica of the database,
// run one after another. Each begins after the one before committed, so
// its snapshot holds what that one wrote, and SSI has no reason to abort
// either of them for the other; two replicas placing the same pending
// Workspaces on their own nodes aborted each other's batches again and
// again without it (bench/results/2026-12-02-hollow-queue.md).
//
// The lock orders, it guarantees nothing: every transaction is as
// serializable as InTx's. So when the turn does not come within the wait
// bound, the lock is given up and fn runs unqueued (InTx), and when no
// connection is to be had, InTx reports that as it would. A replica that
// dies holding the lock loses it with its connection.
func (s *Store) InTxQueued(ctx context.Context, queue string, fn func(store.Tx) error) error {
	conn, err := s.queued(ctx, queue)
	if err != nil {
		return err
	}
	if conn == nil {
		return s.InTx(ctx, fn)
	}
	defer s.unqueue(ctx, conn, queue)
	begin := func(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
		tx, err := conn.BeginTx(ctx, opts)
		if err != nil {
			if ue := unavailable(err); ue != nil {
				return nil, ue
			}
			return nil, fmt.Errorf("store/postgres: begin: %w", err)
		}
		return tx, nil
	}
	return s.runWith(ctx, begin, pgx.Serializable, func(t *txn) error { return fn(t) })
}

// queued returns a connection holding queue's lock, or nil when it has
// none within the bounds (no connection within the acquire bound, or the
// lock not within queueWait): the caller then runs unqueued. Its error is
// ctx's only.
func (s *Store) queued(ctx context.Context, queue string) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, s.acquire)
	conn, err := s.pool.Acquire(actx)
	cancel()
	if err != nil {
		return nil, ctx.Err()
	}
	wait := s.queueWait
	if wait <= 0 {
		wait = defaultQueueWait
	}
	lctx, cancel := context.WithTimeout(ctx, wait)
	_, err = conn.Exec(lctx, queueLockSQL, queueLockClass, queue)
	cancel()
	if err != nil {
		// A wait cut short by its context closed the connection (pgx
		// does; the pool drops it). Its server process may still stand
		// in the lock's line: it gets the lock in its turn, finds the
		// connection closed and ends, which releases it.
		conn.Release()
		return nil, ctx.Err()
	}
	return conn, nil
}

// unqueue releases queue's lock held by conn and gives conn back to the
// pool; when the unlock fails, conn is closed, which releases the lock.
func (s *Store) unqueue(ctx context.Context, conn *pgxpool.Conn, queue string) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.acquire)
	defer cancel()
	if _, err := conn.Exec(uctx, queueUnlockSQL, queueLockClass, queue); err != nil {
		_ = conn.Conn().Close(uctx)
	}
	conn.Release()
}
