package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
)

// maxStmts bounds the statements a conn keeps prepared. The store's
// statements are a fixed set plus list statements whose shape depends on the
// number of selector entries and filters, so a full cache means unusual
// queries; they run unprepared rather than evict the common ones.
const maxStmts = 256

// conn is one SQLite connection the Store holds for as long as it is open:
// the writer's, or one of the readers'. It keeps every statement it has run
// prepared (a *sql.Stmt bound to the connection, that is one sqlite3_stmt
// reset and rebound on each run), so that SQLite parses and plans a
// statement once per connection instead of on every call.
//
// A conn is used by one goroutine at a time: the writer goroutine, or the
// View holding it.
type conn struct {
	c     *sql.Conn
	stmts map[string]*sql.Stmt
}

func openConn(ctx context.Context, db *sql.DB) (*conn, error) {
	c, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{c: c, stmts: map[string]*sql.Stmt{}}, nil
}

// stmt returns query prepared on c, preparing it on first use; nil (and no
// error) when the cache is full.
func (c *conn) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st, ok := c.stmts[query]; ok {
		return st, nil
	}
	if len(c.stmts) >= maxStmts {
		return nil, nil
	}
	st, err := c.c.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.stmts[query] = st
	return st, nil
}

func (c *conn) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := c.stmt(ctx, query)
	switch {
	case err != nil:
		return nil, err
	case st == nil:
		return c.c.ExecContext(ctx, query, args...)
	}
	return st.ExecContext(ctx, args...)
}

func (c *conn) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := c.stmt(ctx, query)
	switch {
	case err != nil:
		return nil, err
	case st == nil:
		return c.c.QueryContext(ctx, query, args...)
	}
	return st.QueryContext(ctx, args...)
}

// scanner is a *sql.Row, or the error of preparing its statement.
type scanner interface{ Scan(dest ...any) error }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func (c *conn) queryRow(ctx context.Context, query string, args ...any) scanner {
	st, err := c.stmt(ctx, query)
	switch {
	case err != nil:
		return errRow{err}
	case st == nil:
		return c.c.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

// close finalizes the statements and closes the connection. With discard,
// the connection is dropped rather than returned to its sql.DB's pool (it
// may be left inside a transaction).
func (c *conn) close(discard bool) error {
	var errs []error
	for _, st := range c.stmts {
		errs = append(errs, st.Close())
	}
	c.stmts = nil
	if discard {
		// driver.ErrBadConn makes database/sql close the connection (and
		// the Conn) instead of putting it back in the pool.
		_ = c.c.Raw(func(any) error { return driver.ErrBadConn })
	} else {
		errs = append(errs, c.c.Close())
	}
	return errors.Join(errs...)
}
