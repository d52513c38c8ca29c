// Package sqlite implements store.Store on an embedded SQLite database file
// (modernc.org/sqlite, pure Go, no cgo).
//
// SQLite means ONE ctrl replica. The database is a local file and the store
// assumes its process is the only writer: every write goes through a single
// connection owned by one writer goroutine. Run several replicas against
// store/postgres instead.
//
// # Durability and group commit
//
// The file is in WAL mode with synchronous=FULL, so a COMMIT fsyncs the WAL
// before it returns, and InTx returns only after that. An fsync costs
// milliseconds, so one fsync per transaction would cap the store at a few
// hundred writes per second. InTx therefore hands fn to the writer
// goroutine, which takes the first pending request, drains whatever else is
// already waiting (up to 128 requests), and runs them all in one BEGIN
// IMMEDIATE … COMMIT, each inside its own SAVEPOINT. A request whose fn fails
// (or panics) is rolled back to its savepoint and gets fn's error; the others
// in the batch are unaffected and share the single COMMIT, hence the single
// fsync. Every request of a batch sees the writes of the requests before it,
// exactly as if they had run one after the other, so each InTx is still
// serializable.
//
// Statements that run inside a batch are detached from the caller's context:
// cancelling it mid-statement would interrupt SQLite, and an interrupted
// write rolls back the whole transaction, that is every request of the batch.
// The context is checked before each statement instead, and a request whose
// context is done before it starts returns ctx.Err() without running.
//
// # Reads
//
// View runs on a separate pool of connections opened with query_only, each
// View a deferred read transaction on its own WAL snapshot, so reads never
// wait for the writer and a write attempted in View fails with
// store.ErrReadOnly.
//
// # Connections and statements
//
// The store holds its connections for as long as it is open (the writer's,
// and up to readConns readers, opened as needed), and runs its own BEGIN,
// COMMIT and ROLLBACK on them rather than database/sql transactions. Each
// connection keeps every statement it has run prepared (see conn), so a
// statement is parsed and planned once per connection, not on every call.
// The readers have a 64 MiB page cache each (readerCacheKiB), the writer
// maps up to 256 MiB of the file (writerMmapBytes).
//
// Resources are stored in list order, (kind, created_at, id), with their
// labels in the row as well as in the labels table (see migration 3), so
// that a page of a list reads consecutive rows of one table.
//
// # Conventions
//
// Timestamps are stored as INTEGER microseconds since the Unix epoch and come
// back in UTC at microsecond precision; a zero Command.CompletedAt,
// Workspace.DeletedAt or Workspace.ObservedAt is stored as NULL and comes
// back zero. Labels and Annotations always come back as non-nil maps, empty
// when there are none (nil and empty are stored alike). Byte fields (Spec,
// Result, Fingerprint, ErrorDetail, Doc) come back nil when empty. Workspace
// labels live in the labels table with kind "workspace", beside those of
// resources.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

const (
	// maxBatch is the most InTx requests one commit carries.
	maxBatch = 128
	// readConns is the size of the reader pool that serves View.
	readConns = 4
	// busyTimeout bounds waits for a lock held by another connection (the
	// WAL checkpoint, or another process opening the file).
	busyTimeout = 10 * time.Second
	// readerCacheKiB is the page cache of each reader connection, in KiB
	// (SQLite's default is 2 MiB): enough for the pages a list of a large
	// table reads, which are then read once per connection rather than
	// once per call. A reader's cache is emptied when another connection
	// has committed since its last transaction.
	readerCacheKiB = 64 << 10
	// writerMmapBytes is how much of the database file the writer maps:
	// pages read from the map are neither copied nor read with a system
	// call. Only the writer maps the file: a connection unmaps all of it
	// whenever another connection has committed since its last
	// transaction (a munmap per View after each write, measured at about
	// 5% of the server's CPU on creates), and the writer alone never sees
	// a commit of another connection. The writer keeps SQLite's default
	// page cache: a larger one costs it time at every commit.
	writerMmapBytes = 256 << 20
)

// ErrClosed is returned by InTx and View after Close.
var ErrClosed = errors.New("store/sqlite: store is closed")

// Store is a store.Store on one SQLite file. It is safe for concurrent use.
type Store struct {
	// LocalNotifier is the store's Notifier: SQLite has one ctrl replica,
	// so every waiter is in this process.
	store.LocalNotifier

	wdb *sql.DB // the single writer connection
	rdb *sql.DB // query_only readers for View
	w   *conn   // wdb's connection, owned by writeLoop

	// The pool of reader connections: a View takes one of readConns
	// tokens, then the idle connection released last (its page cache is
	// the warmest), or opens one.
	rtokens chan struct{}
	rmu     sync.Mutex
	idle    []*conn // guarded by rmu
	rclosed bool    // guarded by rmu; set by Close: released connections are closed

	reqs chan *request // unbuffered: a pending request is a blocked sender
	quit chan struct{} // closed by Close
	done chan struct{} // closed when writeLoop has returned

	closeOnce sync.Once
	closeErr  error

	// handing counts the InTx calls waiting to hand their request over.
	handing atomic.Int32

	// testHookBatch, when set before the first InTx, is called by the writer
	// with the size of every batch it starts.
	testHookBatch func(n int)
}

var _ store.Store = (*Store)(nil)

// request is one InTx call waiting for the writer.
type request struct {
	ctx context.Context
	fn  func(*txn) error
	res chan error // buffered; receives exactly one result
}

// Open opens (creating if needed) the SQLite database at path, applies the
// pending migrations and starts the writer goroutine. Close releases it.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("store/sqlite: invalid database path %q", path)
	}
	common := url.Values{}
	common.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	common.Add("_pragma", "foreign_keys(1)")

	wv := cloneValues(common)
	wv.Add("_pragma", "journal_mode(WAL)")
	wv.Add("_pragma", "synchronous(FULL)")
	wv.Set("_txlock", "immediate")
	wv.Add("_pragma", fmt.Sprintf("mmap_size(%d)", writerMmapBytes))
	wdb, err := sql.Open("sqlite", path+"?"+wv.Encode())
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: open %s: %w", path, err)
	}
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	wdb.SetConnMaxLifetime(0)
	wdb.SetConnMaxIdleTime(0)
	if err := migrate(ctx, wdb); err != nil {
		wdb.Close()
		return nil, fmt.Errorf("store/sqlite: migrate %s: %w", path, err)
	}
	w, err := openConn(ctx, wdb)
	if err != nil {
		wdb.Close()
		return nil, fmt.Errorf("store/sqlite: open %s: %w", path, err)
	}

	r := cloneValues(common)
	r.Add("_pragma", "query_only(1)")
	r.Add("_pragma", fmt.Sprintf("cache_size(%d)", -readerCacheKiB))
	rdb, err := sql.Open("sqlite", path+"?"+r.Encode())
	if err != nil {
		w.close(false)
		wdb.Close()
		return nil, fmt.Errorf("store/sqlite: open %s: %w", path, err)
	}
	rdb.SetMaxOpenConns(readConns)
	rdb.SetMaxIdleConns(readConns)
	rdb.SetConnMaxLifetime(0)
	rdb.SetConnMaxIdleTime(0)
	r0, err := openConn(ctx, rdb)
	if err == nil {
		err = r0.c.PingContext(ctx)
	}
	if err != nil {
		w.close(false)
		wdb.Close()
		rdb.Close()
		return nil, fmt.Errorf("store/sqlite: open %s: %w", path, err)
	}

	s := &Store{
		wdb:     wdb,
		rdb:     rdb,
		w:       w,
		rtokens: make(chan struct{}, readConns),
		idle:    []*conn{r0},
		reqs:    make(chan *request),
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	for range readConns {
		s.rtokens <- struct{}{}
	}
	go s.writeLoop()
	return s, nil
}

func cloneValues(v url.Values) url.Values {
	c := url.Values{}
	for k, vs := range v {
		c[k] = append([]string(nil), vs...)
	}
	return c
}

// InTx implements store.Store. fn runs on the writer goroutine, in a batch
// with other concurrent calls; see the package documentation. fn runs once;
// it holds up every other write while it runs, so it must be quick, and it
// must not call InTx (that would wait for itself). A panic in fn is
// recovered and returned as an error.
func (s *Store) InTx(ctx context.Context, fn func(store.Tx) error) error {
	return s.inTx(ctx, func(t *txn) error { return fn(t) })
}

func (s *Store) inTx(ctx context.Context, fn func(*txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := &request{ctx: ctx, fn: fn, res: make(chan error, 1)}
	s.handing.Add(1)
	select {
	case s.reqs <- r:
		s.handing.Add(-1)
	case <-ctx.Done():
		s.handing.Add(-1)
		return ctx.Err()
	case <-s.quit:
		s.handing.Add(-1)
		return ErrClosed
	}
	// Once the writer holds the request it must be waited for: returning
	// early would let fn commit after InTx reported a failure.
	return <-r.res
}

// writeLoop is the writer goroutine: it runs batches of requests until Close.
func (s *Store) writeLoop() {
	defer close(s.done)
	var batch []*request
	for {
		if len(batch) == 0 {
			select {
			case r := <-s.reqs:
				batch = append(batch, r)
			case <-s.quit:
				return
			}
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case r := <-s.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		batch = s.runBatch(batch)
	}
}

// runBatch runs batch in one transaction and delivers every result once the
// transaction has committed, a failed request's too: its fn may have failed
// on what an earlier request of the batch wrote (a duplicate command ID),
// and its caller, answered before the commit, could not read that write
// yet. When the transaction is lost midway (SQLite rolls it back by itself
// after an I/O error, a full disk and the like), the requests that have not
// run yet are returned to be run in the next transaction; the request that
// hit the error and those before it fail with it.
func (s *Store) runBatch(batch []*request) (leftover []*request) {
	if s.testHookBatch != nil {
		s.testHookBatch(len(batch))
	}
	bg := context.Background()
	w := s.w
	if _, err := w.exec(bg, "BEGIN IMMEDIATE"); err != nil {
		err = fmt.Errorf("store/sqlite: begin: %w", classify(err))
		for _, r := range batch {
			r.res <- err
		}
		return nil
	}
	var succeeded []*request
	var failed []failure
	abort := func(err error) {
		for _, r := range succeeded {
			r.res <- err
		}
		for _, f := range failed {
			f.r.res <- err
		}
		_, _ = w.exec(bg, "ROLLBACK")
	}
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.res <- err
			continue
		}
		if _, err := w.exec(bg, "SAVEPOINT req"); err != nil {
			err = fmt.Errorf("store/sqlite: savepoint: %w", err)
			r.res <- err
			abort(err)
			return batch[i+1:]
		}
		t := &txn{c: w, detach: true}
		fnErr := call(r.fn, t)
		t.finish()
		if fnErr != nil {
			_, e1 := w.exec(bg, "ROLLBACK TO req")
			_, e2 := w.exec(bg, "RELEASE req")
			failed = append(failed, failure{r, fnErr})
			if e := errors.Join(e1, e2); e != nil {
				abort(fmt.Errorf("store/sqlite: transaction lost: %w", e))
				return batch[i+1:]
			}
			continue
		}
		if _, err := w.exec(bg, "RELEASE req"); err != nil {
			err = fmt.Errorf("store/sqlite: transaction lost: %w", err)
			r.res <- err
			abort(err)
			return batch[i+1:]
		}
		succeeded = append(succeeded, r)
	}
	if _, err := w.exec(bg, "COMMIT"); err != nil {
		// A COMMIT that failed may leave the transaction open: abort rolls
		// it back.
		abort(fmt.Errorf("store/sqlite: commit: %w", classify(err)))
		return nil
	}
	for _, r := range succeeded {
		r.res <- nil
	}
	for _, f := range failed {
		f.r.res <- f.err
	}
	return nil
}

// failure is a request of a batch whose fn failed, and its error.
type failure struct {
	r   *request
	err error
}

// call runs fn, turning a panic into an error.
func call(fn func(*txn) error, t *txn) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("store/sqlite: InTx fn panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return fn(t)
}

// View implements store.Store: fn runs in a read transaction on one of the
// query_only reader connections.
func (s *Store) View(ctx context.Context, fn func(store.Tx) error) error {
	return s.view(ctx, func(t *txn) error { return fn(t) })
}

func (s *Store) view(ctx context.Context, fn func(*txn) error) error {
	c, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// Read-only: nothing to keep. A connection whose ROLLBACK failed
		// may still be in the transaction, and is dropped.
		_, err := c.exec(context.Background(), "ROLLBACK")
		s.release(c, err == nil)
	}()
	if _, err := c.exec(ctx, "BEGIN"); err != nil {
		return fmt.Errorf("store/sqlite: begin read: %w", classify(err))
	}
	t := &txn{c: c}
	defer t.finish()
	return fn(t)
}

// acquire takes a reader connection from the pool, opening it if needed.
func (s *Store) acquire(ctx context.Context) (*conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case <-s.quit:
		return nil, ErrClosed
	default:
	}
	select {
	case <-s.rtokens:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.quit:
		return nil, ErrClosed
	}
	s.rmu.Lock()
	var c *conn
	if n := len(s.idle); n > 0 {
		c, s.idle = s.idle[n-1], s.idle[:n-1]
	}
	s.rmu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := openConn(ctx, s.rdb)
	if err != nil {
		s.rtokens <- struct{}{}
		return nil, fmt.Errorf("store/sqlite: open reader: %w", err)
	}
	return c, nil
}

// release returns a reader connection to the pool. Unless ok, or after
// Close, the connection is closed instead.
func (s *Store) release(c *conn, ok bool) {
	s.rmu.Lock()
	if ok && !s.rclosed {
		s.idle = append(s.idle, c)
	} else {
		_ = c.close(!ok)
	}
	s.rmu.Unlock()
	s.rtokens <- struct{}{} // never blocks: the token taken by acquire
}

// Secret implements store.Store: it reads the secret and, when absent,
// inserts create()'s value unless a concurrent caller got there first, then
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
		if _, err := t.exec(ctx, `INSERT INTO secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`, name, nv); err != nil {
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
	select {
	case <-s.quit:
		return ErrClosed
	default:
	}
	c, err := s.acquire(ctx)
	if err != nil {
		return fmt.Errorf("store/sqlite: ping: %w", err)
	}
	var one int
	err = c.queryRow(ctx, "SELECT 1").Scan(&one)
	s.release(c, err == nil || ctx.Err() != nil)
	if err != nil {
		return fmt.Errorf("store/sqlite: ping: %w", err)
	}
	return nil
}

// Close stops the writer after the batch it is running, fails InTx calls
// still waiting, and closes the database. It is safe to call more than once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.quit)
		<-s.done
		errs := []error{s.w.close(false)}
		// Close the idle readers; those in use are closed as their View
		// releases them.
		s.rmu.Lock()
		s.rclosed = true
		for _, c := range s.idle {
			errs = append(errs, c.close(false))
		}
		s.idle = nil
		s.rmu.Unlock()
		s.closeErr = errors.Join(append(errs, s.wdb.Close(), s.rdb.Close())...)
	})
	return s.closeErr
}

// classify maps SQLite errors to the store's errors: a primary key or unique
// constraint violation is store.ErrDuplicate, a write on a query_only (or
// read-only) connection store.ErrReadOnly, a missing row store.ErrNotFound.
// Other errors are returned unchanged.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	var se *msqlite.Error
	if errors.As(err, &se) {
		switch se.Code() {
		case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE:
			return fmt.Errorf("%w: %v", store.ErrDuplicate, err)
		}
		if se.Code()&0xff == sqlite3.SQLITE_READONLY {
			return fmt.Errorf("%w: %v", store.ErrReadOnly, err)
		}
	}
	return err
}

// recoverable reports whether a statement that failed with err leaves the
// transaction intact: store errors and Go-side errors do; other SQLite errors
// (I/O, full disk, interrupt, ...) may have rolled the whole transaction back.
func recoverable(err error) bool {
	if errors.Is(err, store.ErrDuplicate) || errors.Is(err, store.ErrReadOnly) || errors.Is(err, store.ErrNotFound) {
		return true
	}
	var se *msqlite.Error
	if !errors.As(err, &se) {
		return true
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_ERROR, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_RANGE, sqlite3.SQLITE_TOOBIG:
		return true
	}
	return false
}
