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
// The store's Notifier carries notifications between the ctrl replicas of
// one database with LISTEN/NOTIFY. Notify wakes this process's waiters at
// once (a store.LocalNotifier) and queues the topic for a goroutine that
// sends it, batched, with pg_notify on the channel "kibotos/<schema>" (the
// schema the tables live in, so deployments in other schemas of the
// database are not woken), on a connection of its own, outside the pool,
// so that a notification never waits for a pool connection behind
// transactions; the payload is the store's random ID and the topic. Every
// caller of Notify calls it after the commit (the Notifier contract), so
// the NOTIFY runs in a transaction of its own, after the change is
// visible. Each store holds another connection of its own, outside the
// pool, that LISTENs on the channel and wakes the local waiters of each
// topic it hears, skipping the store's own notifications: a waiter is woken
// once per Notify, whichever replica calls it.
//
// A notification is a hint: a topic that cannot be carried (one whose
// payload would reach PostgreSQL's 8000 bytes, or past 10,000 topics not
// sent yet) or a send that fails wakes the other replicas' waiters only at
// their next re-read of the store, at most store.RecheckInterval later.
// When the listening connection is lost (noticed at once when the server
// ends it, within about 35 s on a silent network cut), it reconnects with
// jittered backoff (50 ms doubling to 5 s) and then wakes every local
// waiter once, since a notification may have been missed meanwhile.
//
// # Losing the database
//
// A store that cannot reach its database (cannot connect, connection lost
// or timed out, the server shutting down or starting up, too many
// connections, a statement_timeout or lock_timeout) fails every InTx, View,
// Secret and Ping with an unavailable, retryable fault (internal/fault;
// stage "store", a message that names no host, user or URL; the cause goes
// to logs only). unavailable (unavailable.go) is the one mapping of
// database errors to it. Nothing is served from memory meanwhile, so a
// replica that lost the database neither writes nor reads; when the
// database is back, the pool connects again and the same store serves
// again, without a restart.
//
// No operation waits long for a connection: getting one from the pool and
// its BEGIN are bounded by the URL's pool_acquire_timeout (default 5 s),
// one connection attempt by connect_timeout (default 5 s), and every TCP
// connection has keepalives and TCP_USER_TIMEOUT (15 s), so a statement sent
// into a network partition fails in about 15 s. A COMMIT whose answer is
// lost says that the write may or may not have been applied: the caller
// resends the same command ID, which executes once. A write transaction
// refused as read-only (a standby) is unavailable too. Connections get
// application_name kibotos-ctrl unless the URL names another.
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

	"github.com/kibotos/kibotos/internal/fault"
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
	// LocalNotifier holds this process's waiters (Subscribe); Notify wakes
	// them and, through notify, those of the other replicas.
	store.LocalNotifier

	notify  *notifier
	pool    *pgxpool.Pool
	retries atomic.Int64 // InTx attempts that ended in a retry
	// acquire bounds getting a connection and its BEGIN
	// (pool_acquire_timeout).
	acquire time.Duration
	// maxConns is the pool's size.
	maxConns int32
}

var _ store.Store = (*Store)(nil)

// Open connects to the database at url (a PostgreSQL URL or keyword/value
// string, with pgxpool's pool_* parameters, pool_acquire_timeout, and any
// server setting such as statement_timeout as a parameter), applies the
// pending migrations and returns the store. Close releases it.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, parseError(err)
	}
	return openConfig(ctx, cfg)
}

// parseError reports a URL that does not parse without the URL: pgconn
// masks the password only on a best-effort basis.
func parseError(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return fmt.Errorf("store/postgres: %w", err)
	}
	if inner := pe.Unwrap(); inner != nil {
		return fmt.Errorf("store/postgres: the store URL does not parse: %v", inner)
	}
	return errors.New("store/postgres: the store URL does not parse")
}

func openConfig(ctx context.Context, cfg *pgxpool.Config) (*Store, error) {
	acquire, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	// Migrations may rewrite large tables: a statement_timeout meant for
	// requests does not apply to them.
	mcfg := cfg.ConnConfig.Copy()
	mcfg.RuntimeParams["statement_timeout"] = "0"
	if err := migrate(ctx, mcfg); err != nil {
		if ue := unavailable(err); ue != nil {
			err = ue
		}
		return nil, fmt.Errorf("store/postgres: migrate: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store/postgres: %w", err)
	}
	s := &Store{pool: pool, acquire: acquire, maxConns: cfg.MaxConns}
	s.notify, err = startNotifier(ctx, &s.LocalNotifier, pool, cfg.ConnConfig.Copy())
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Notify implements store.Notifier: it wakes this process's subscribers of
// topic at once and queues the topic for the other replicas (see the
// package documentation, "Notifications").
func (s *Store) Notify(topic string) {
	s.LocalNotifier.Notify(topic)
	s.notify.publish(topic)
}

// Retries returns how many InTx attempts ended in a retry (a
// serialization failure or a deadlock) since Open.
func (s *Store) Retries() int64 { return s.retries.Load() }

// InTx implements store.Store; see the package documentation for retries.
// fn may run up to 10 times; a panic in fn rolls back and goes on to the
// caller.
func (s *Store) InTx(ctx context.Context, fn func(store.Tx) error) error {
	return s.inTx(ctx, func(t *txn) error { return fn(t) })
}

func (s *Store) inTx(ctx context.Context, fn func(*txn) error) error {
	return s.run(ctx, pgx.Serializable, fn)
}

// run runs fn in a write transaction of isolation level iso, with InTx's
// retries.
func (s *Store) run(ctx context.Context, iso pgx.TxIsoLevel, fn func(*txn) error) error {
	for attempt := 1; ; attempt++ {
		retry, err := s.attempt(ctx, iso, fn)
		if !retry {
			if errors.Is(err, store.ErrReadOnly) {
				// A write transaction is read-only only on a
				// database that accepts no writes.
				return readOnly(err)
			}
			return exit(ctx, err)
		}
		if attempt >= maxAttempts {
			// Contention, not a bug: the transaction was rolled back each
			// time, so the same request can be sent again.
			return newUnavailable(fault.ReasonUnavailable, err, "the database refused the transaction %d times under contention", attempt)
		}
		s.retries.Add(1)
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return err
		}
	}
}

// attempt runs fn once in a new transaction of isolation level iso; retry
// reports a serialization failure or deadlock (seen by any statement of fn,
// even one whose error fn swallowed, or by COMMIT).
func (s *Store) attempt(ctx context.Context, iso pgx.TxIsoLevel, fn func(*txn) error) (retry bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	tx, err := s.begin(ctx, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		return false, err
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
		if ue := commitLost(err); ue != nil {
			return false, ue
		}
		return retryable(err), fmt.Errorf("store/postgres: commit: %w", classify(err))
	}
	committed = true
	return false, nil
}

// begin gets a connection from the pool and begins a transaction on it,
// within s.acquire: when it cannot, the error is the store's unavailable
// fault (or the caller's cancellation). A pooled connection found dead (a
// database restarted, a proxy or balancer that closed it) is dropped and
// the next one tried, up to as many as the pool holds: a BEGIN has no
// effect, so trying again is safe. A failed new connection is not tried
// again: the database is down.
func (s *Store) begin(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	actx, cancel := context.WithTimeout(ctx, s.acquire)
	defer cancel()
	for try := 0; ; try++ {
		tx, err := s.pool.BeginTx(actx, opts)
		switch {
		case err == nil:
			return tx, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("store/postgres: begin: %w", ctx.Err())
		case actx.Err() != nil:
			return nil, newUnavailable(fault.ReasonUnavailable, err, "no database connection within %v", s.acquire)
		case try <= int(s.maxConns) && deadConn(err):
			continue
		}
		if ue := unavailable(err); ue != nil {
			return nil, ue
		}
		return nil, fmt.Errorf("store/postgres: begin: %w", err)
	}
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
	tx, err := s.begin(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	t := &txn{tx: tx}
	defer func() {
		t.finish()
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}()
	return exit(ctx, fn(t))
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

// Ping implements store.Store, within the acquire bound.
func (s *Store) Ping(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, s.acquire)
	defer cancel()
	if err := s.pool.Ping(pctx); err != nil {
		if ctx.Err() == nil && pctx.Err() != nil {
			return newUnavailable(fault.ReasonUnavailable, err, "no database connection within %v", s.acquire)
		}
		if ue := unavailable(err); ue != nil {
			return exit(ctx, ue)
		}
		return fmt.Errorf("store/postgres: ping: %w", err)
	}
	return nil
}

// Close implements store.Store: it stops the notifications (topics not sent
// yet are dropped) and closes every connection of the pool, waiting for
// those in use to be released.
func (s *Store) Close() error {
	s.notify.stop()
	s.pool.Close()
	return nil
}

// classify maps PostgreSQL errors to the store's errors: unique_violation is
// store.ErrDuplicate, read_only_sql_transaction store.ErrReadOnly, no row
// store.ErrNotFound, a database that cannot serve its unavailable fault
// (unavailable). Other errors (serialization failures included, which InTx
// recognizes with retryable) are returned unchanged.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	if ue := unavailable(err); ue != nil {
		return ue
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
