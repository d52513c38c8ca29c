// Package postgres implements store.Store on PostgreSQL with pgx (pgxpool),
// for running several ctrl replicas against one database.
//
// # Isolation
//
// InTx runs fn in a SERIALIZABLE transaction and, when PostgreSQL aborts it
// with serialization_failure (40001) or deadlock_detected (40P01), runs fn
// again in a new transaction after a short jittered backoff, up to 10
// attempts and never past ctx. SERIALIZABLE (rather than READ COMMITTED with
// explicit row locks) is chosen because store.Store promises serializable
// transactions and ctrl's invariants are of the check-then-write kind that
// row locks do not cover without care at every call site: "no Workspace
// references this Egress" (CountReferences) followed by DeleteResource is a
// write skew under READ COMMITTED against a concurrent SetReferences, while
// SSI detects it. ctrl's write rate is low, so the occasional retry is cheap.
//
// LockCommand takes a transaction-scoped advisory lock on a hash of the
// command ID, so transactions that use one command ID run one after the
// other; a transaction that waited for the lock still holds the snapshot it
// took before waiting, and the stale read it makes is reported as a
// serialization failure and retried, so the retry sees the committed
// command.
//
// InsertCommand, InsertResource and InsertWorkspace run their INSERTs inside
// a savepoint, so an ErrDuplicate does not abort the transaction (fn may go
// on), as in the SQLite dialect. They are plain INSERTs, not INSERT … ON
// CONFLICT, and labels have no foreign key: both would read an index and
// take SSI predicate locks on its pages, making concurrent inserts of
// neighbouring keys fail each other although none reads what another
// writes. A duplicate key whose row the transaction's snapshot cannot see
// (committed by a concurrent transaction) is a serialization failure, so fn
// runs again and sees it. (UpsertNode is an INSERT … ON CONFLICT: see there.)
//
// View runs fn in a READ ONLY REPEATABLE READ transaction: one snapshot for
// all of fn's reads, never a serialization failure, and a write fails with
// store.ErrReadOnly.
//
// # Schema
//
// Open applies the embedded migrations (migrations/*.sql) in order under a
// session advisory lock, recording them in schema_migrations, so replicas
// starting together migrate once. Tables live in the first schema of the
// URL's search_path (a search_path connection parameter), public by default.
// Tests open stores in fresh schemas with store/postgres/pgtest.
//
// # Conventions
//
// Timestamps are stored as BIGINT microseconds since the Unix epoch and come
// back in UTC at microsecond precision; a zero Command.CompletedAt,
// Workspace.DeletedAt or Workspace.ObservedAt is stored as NULL and comes
// back zero. Labels and Annotations always come back as non-nil maps, empty
// when there are none. Byte fields come back nil when empty. Workspace labels
// live in the labels table with kind "workspace", beside those of resources.
// Key columns use the "C" collation, so IDs order bytewise.
//
// # Notifications
//
// The store's Notifier is a store.LocalNotifier: Notify wakes the waiters of
// this process only. Replicas do not notify each other yet (LISTEN/NOTIFY
// is the way to carry them), so a waiter on one replica sees a command that
// another replica completed at its next re-read of the store, at most
// store.RecheckInterval later.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

const (
	// maxAttempts bounds the runs of one InTx fn.
	maxAttempts = 10
	// backoffBase and backoffMax bound the pause before a retry: attempt n
	// waits about backoffBase·2ⁿ⁻¹, at most backoffMax, jittered ±50%.
	backoffBase = 2 * time.Millisecond
	backoffMax  = 100 * time.Millisecond
)

// SQLSTATE codes the store handles.
const (
	codeUniqueViolation      = "23505"
	codeReadOnlyTransaction  = "25006"
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
)

// Store is a store.Store on a PostgreSQL database. It is safe for concurrent
// use.
type Store struct {
	// LocalNotifier is the store's Notifier, within this process only:
	// notifications do not cross ctrl replicas yet (LISTEN/NOTIFY would
	// carry them), so a waiter on one replica learns of a completion
	// committed by another at its next recheck (store.RecheckInterval).
	store.LocalNotifier

	pool    *pgxpool.Pool
	retries atomic.Int64 // InTx attempts that ended in a retry
}

var _ store.Store = (*Store)(nil)

// Open connects to the database at url (a PostgreSQL URL or keyword/value
// string, with pgxpool's pool_* parameters), applies the pending migrations
// and returns the store. Close releases it.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("store/postgres: %w", err)
	}
	return openConfig(ctx, cfg)
}

func openConfig(ctx context.Context, cfg *pgxpool.Config) (*Store, error) {
	if err := migrate(ctx, cfg.ConnConfig.Copy()); err != nil {
		return nil, fmt.Errorf("store/postgres: migrate: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store/postgres: %w", err)
	}
	return &Store{pool: pool}, nil
}

// InTx implements store.Store; see the package documentation for retries.
// fn may run up to 10 times; a panic in fn rolls back and goes on to the
// caller.
func (s *Store) InTx(ctx context.Context, fn func(store.Tx) error) error {
	return s.inTx(ctx, func(t *txn) error { return fn(t) })
}

func (s *Store) inTx(ctx context.Context, fn func(*txn) error) error {
	for attempt := 1; ; attempt++ {
		retry, err := s.attempt(ctx, fn)
		if !retry {
			return err
		}
		if attempt >= maxAttempts {
			return fmt.Errorf("store/postgres: giving up after %d attempts: %w", attempt, err)
		}
		s.retries.Add(1)
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return err
		}
	}
}

// attempt runs fn once in a new SERIALIZABLE transaction; retry reports a
// serialization failure or deadlock (seen by any statement of fn, even one
// whose error fn swallowed, or by COMMIT).
func (s *Store) attempt(ctx context.Context, fn func(*txn) error) (retry bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		return retryable(err), fmt.Errorf("store/postgres: begin: %w", err)
	}
	t := &txn{tx: tx}
	committed := false
	defer func() {
		t.finish()
		if !committed {
			// Also runs when fn panics; the panic goes on to the caller.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	fnErr := fn(t)
	if t.retry != nil {
		return true, t.retry
	}
	if retryable(fnErr) {
		return true, fnErr
	}
	if fnErr != nil {
		return false, fnErr
	}
	if err := tx.Commit(ctx); err != nil {
		committed = true // pgx has ended the transaction either way
		return retryable(err), fmt.Errorf("store/postgres: commit: %w", classify(err))
	}
	committed = true
	return false, nil
}

// backoff returns the jittered pause before attempt+1.
func backoff(attempt int) time.Duration {
	d := backoffBase << (attempt - 1)
	if d > backoffMax || d <= 0 {
		d = backoffMax
	}
	return d/2 + rand.N(d)
}

func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// View implements store.Store: fn runs in a READ ONLY REPEATABLE READ
// transaction, which is rolled back afterwards.
func (s *Store) View(ctx context.Context, fn func(store.Tx) error) error {
	return s.view(ctx, func(t *txn) error { return fn(t) })
}

func (s *Store) view(ctx context.Context, fn func(*txn) error) error {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("store/postgres: begin read: %w", err)
	}
	t := &txn{tx: tx}
	defer func() {
		t.finish()
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}()
	return fn(t)
}

// Secret implements store.Store: it reads the secret and, when absent,
// inserts create()'s value unless another replica got there first, then
// reads back whichever value won.
func (s *Store) Secret(ctx context.Context, name string, create func() []byte) ([]byte, error) {
	var v []byte
	err := s.view(ctx, func(t *txn) (err error) {
		v, err = t.secret(ctx, name)
		return err
	})
	if err == nil {
		return v, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	nv := rowcodec.NonNil(create())
	err = s.inTx(ctx, func(t *txn) (err error) {
		if _, err := t.exec(ctx, `INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, nv); err != nil {
			return err
		}
		v, err = t.secret(ctx, name)
		return err
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("store/postgres: ping: %w", err)
	}
	return nil
}

// Close implements store.Store: it closes every connection of the pool,
// waiting for those in use to be released.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// classify maps PostgreSQL errors to the store's errors: unique_violation is
// store.ErrDuplicate, read_only_sql_transaction store.ErrReadOnly, no row
// store.ErrNotFound. Other errors (serialization failures included, which
// InTx recognizes with retryable) are returned unchanged.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case codeUniqueViolation:
			return fmt.Errorf("%w: %v", store.ErrDuplicate, err)
		case codeReadOnlyTransaction:
			return fmt.Errorf("%w: %v", store.ErrReadOnly, err)
		}
	}
	return err
}

// retryable reports whether err means the transaction lost a race and should
// run again.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == codeSerializationFailure || pe.Code == codeDeadlockDetected
	}
	return false
}
