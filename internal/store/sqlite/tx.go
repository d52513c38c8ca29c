package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// errTxDone is returned when a Tx is used after its fn has returned.
var errTxDone = errors.New("store/sqlite: transaction used after its function returned")

// txn implements store.Tx on a connection in a transaction: a request's
// savepoint inside a writer batch, or a View's read transaction.
type txn struct {
	c *conn
	// detach runs statements without the caller's cancellation (inside a
	// writer batch, where an interrupted statement would roll back the whole
	// batch); ctx is checked before each statement instead.
	detach bool
	done   atomic.Bool
	// broken is set after an error that may have lost the transaction; every
	// later statement fails with it.
	broken error
}

var _ store.Tx = (*txn)(nil)

func (t *txn) finish() { t.done.Store(true) }

func (t *txn) stmtCtx(ctx context.Context) (context.Context, error) {
	if t.done.Load() {
		return nil, errTxDone
	}
	if t.broken != nil {
		return nil, t.broken
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if t.detach {
		return context.WithoutCancel(ctx), nil
	}
	return ctx, nil
}

// fail classifies err and marks the transaction broken when err may have
// rolled it back.
func (t *txn) fail(err error) error {
	err = classify(err)
	if !recoverable(err) {
		t.broken = fmt.Errorf("store/sqlite: transaction unusable after an earlier error: %w", err)
	}
	return err
}

func (t *txn) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	c, err := t.stmtCtx(ctx)
	if err != nil {
		return nil, err
	}
	res, err := t.c.exec(c, query, args...)
	if err != nil {
		return nil, t.fail(err)
	}
	return res, nil
}

// execN runs a write and returns the number of rows it changed.
func (t *txn) execN(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := t.exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, t.fail(err)
	}
	return n, nil
}

// queryRow runs a query expected to return at most one row and scans it;
// no row is store.ErrNotFound.
func (t *txn) queryRow(ctx context.Context, query string, args []any, dest ...any) error {
	c, err := t.stmtCtx(ctx)
	if err != nil {
		return err
	}
	if err := t.c.queryRow(c, query, args...).Scan(dest...); err != nil {
		return t.fail(err)
	}
	return nil
}

// queryOne runs a query expected to return at most one row and scans it
// with scan; no row is store.ErrNotFound.
func queryOne[T any](ctx context.Context, t *txn, scan func(rowcodec.Scanner) (T, error), query string, args ...any) (T, error) {
	var zero T
	c, err := t.stmtCtx(ctx)
	if err != nil {
		return zero, err
	}
	v, err := scan(t.c.queryRow(c, query, args...))
	if err != nil {
		return zero, t.fail(err)
	}
	return v, nil
}

// query runs a query and calls each for every row.
func (t *txn) query(ctx context.Context, query string, args []any, each func(*sql.Rows) error) error {
	c, err := t.stmtCtx(ctx)
	if err != nil {
		return err
	}
	rows, err := t.c.query(c, query, args...)
	if err != nil {
		return t.fail(err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return t.fail(err)
		}
	}
	if err := rows.Err(); err != nil {
		return t.fail(err)
	}
	return nil
}

func (t *txn) secret(ctx context.Context, name string) ([]byte, error) {
	var v []byte
	if err := t.queryRow(ctx, `SELECT value FROM secrets WHERE name = ?`, []any{name}, &v); err != nil {
		return nil, err
	}
	if v == nil {
		v = []byte{}
	}
	return v, nil
}

// LockCommand implements store.Tx. It is a no-op: there is one writer, so
// write transactions are serialized already.
func (t *txn) LockCommand(ctx context.Context, commandID string) error {
	_, err := t.stmtCtx(ctx)
	return err
}

// GetCommand implements store.Tx.
func (t *txn) GetCommand(ctx context.Context, commandID string) (*store.Command, error) {
	return queryOne(ctx, t, scanCommand, `SELECT `+rowcodec.CommandColumns+` FROM commands WHERE command_id = ?`, commandID)
}

// InsertCommand implements store.Tx.
func (t *txn) InsertCommand(ctx context.Context, c *store.Command) error {
	n, err := t.execN(ctx, `INSERT INTO commands (`+rowcodec.CommandColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (command_id) DO NOTHING`,
		rowcodec.CommandArgs(c)...)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: command %q", store.ErrDuplicate, c.ID)
	}
	return nil
}

// UpdateCommand implements store.Tx.
func (t *txn) UpdateCommand(ctx context.Context, c *store.Command) error {
	n, err := t.execN(ctx, `UPDATE commands
		SET status = ?, result = ?, error_code = ?, error_detail = ?, completed_at = ?
		WHERE command_id = ?`,
		append(rowcodec.CommandUpdateArgs(c), c.ID)...)
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// GetResource implements store.Tx: a search of resources_id, then of the
// primary key.
func (t *txn) GetResource(ctx context.Context, kind store.ResourceKind, id string) (*store.Resource, error) {
	return queryOne(ctx, t, rowcodec.ScanResourceWithLabels,
		`SELECT `+rowcodec.ResourceColumnsWithLabels+` FROM resources r WHERE r.kind = ? AND r.id = ?`, string(kind), id)
}

// InsertResource implements store.Tx. The labels are stored twice: in the
// row, and in the labels table for selectors.
func (t *txn) InsertResource(ctx context.Context, r *store.Resource) error {
	rev, labelsRev, annotationsRev, annotations, err := rowcodec.ResourceArgs(r)
	if err != nil {
		return err
	}
	labels, err := rowcodec.MapJSON(r.Labels)
	if err != nil {
		return err
	}
	// Any conflict is a duplicate (kind, id): resources_id, or the
	// primary key, which holds it.
	n, err := t.execN(ctx, `INSERT INTO resources (kind, id, created_at, updated_at, revision, spec,
			labels, labels_revision, annotations, annotations_revision, drain_seconds)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT DO NOTHING`,
		string(r.Kind), r.ID, rowcodec.Micros(r.CreatedAt), rowcodec.Micros(r.UpdatedAt), rev, rowcodec.NonNil(r.Spec),
		labels, labelsRev, annotations, annotationsRev, int64(r.DrainSeconds))
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: %s %q", store.ErrDuplicate, r.Kind, r.ID)
	}
	return t.insertLabels(ctx, r.Kind, r.ID, rowcodec.Micros(r.CreatedAt), labels)
}

// insertLabels inserts labels, a JSON object as mapJSON encodes it, in one
// statement, reading them with json_each.
func (t *txn) insertLabels(ctx context.Context, kind store.ResourceKind, id string, createdAt int64, labels string) error {
	if labels == "{}" {
		return nil
	}
	_, err := t.exec(ctx, `INSERT INTO labels (kind, object_id, key, value, object_created_at)
		SELECT ?, ?, j.key, j.value, ? FROM json_each(?) AS j`,
		string(kind), id, createdAt, labels)
	return err
}

// UpdateResource implements store.Tx. The labels are replaced wholesale;
// CreatedAt is not mutable and is kept from the stored row.
func (t *txn) UpdateResource(ctx context.Context, r *store.Resource) error {
	rev, labelsRev, annotationsRev, annotations, err := rowcodec.ResourceArgs(r)
	if err != nil {
		return err
	}
	labels, err := rowcodec.MapJSON(r.Labels)
	if err != nil {
		return err
	}
	var created int64
	err = t.queryRow(ctx, `UPDATE resources
		SET updated_at = ?, revision = ?, spec = ?, labels = ?, labels_revision = ?, annotations = ?, annotations_revision = ?,
			drain_seconds = ?
		WHERE kind = ? AND id = ?
		RETURNING created_at`,
		[]any{rowcodec.Micros(r.UpdatedAt), rev, rowcodec.NonNil(r.Spec), labels, labelsRev, annotations, annotationsRev,
			int64(r.DrainSeconds), string(r.Kind), r.ID},
		&created)
	if err != nil {
		return err
	}
	if _, err := t.exec(ctx, `DELETE FROM labels WHERE kind = ? AND object_id = ?`, string(r.Kind), r.ID); err != nil {
		return err
	}
	return t.insertLabels(ctx, r.Kind, r.ID, created, labels)
}

// DeleteResource implements store.Tx.
func (t *txn) DeleteResource(ctx context.Context, kind store.ResourceKind, id string) error {
	if _, err := t.exec(ctx, `DELETE FROM labels WHERE kind = ? AND object_id = ?`, string(kind), id); err != nil {
		return err
	}
	n, err := t.execN(ctx, `DELETE FROM resources WHERE kind = ? AND id = ?`, string(kind), id)
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// listSQL returns the statement and arguments of one ListResources page.
//
// Without a selector the page is a range scan of the resources primary key,
// which is in list order. With one, the page is driven by the
// labels_selector index of the first selector entry (in key order): a range
// scan of (kind, key, value) from the cursor on (object_created_at,
// object_id), already in list order, joined to resources by primary key
// (kind, created_at, id), so that the rows of a page are close together;
// every other entry is an EXISTS probe of the labels primary key. CROSS JOIN
// pins labels as the outer loop.
func listSQL(q store.ListQuery) (string, []any) {
	var b strings.Builder
	var args []any
	keys := rowcodec.SortedKeys(q.Selector)
	b.WriteString(`SELECT ` + rowcodec.ResourceColumnsWithLabels)
	if len(keys) == 0 {
		b.WriteString(` FROM resources r WHERE r.kind = ?`)
		args = append(args, string(q.Kind))
		if q.After != nil {
			b.WriteString(` AND (r.created_at, r.id) > (?, ?)`)
			args = append(args, rowcodec.Micros(q.After.CreatedAt), q.After.ID)
		}
		b.WriteString(` ORDER BY r.created_at, r.id LIMIT ?`)
		args = append(args, q.Limit)
		return b.String(), args
	}
	b.WriteString(` FROM labels l0 CROSS JOIN resources r
		WHERE l0.kind = ? AND l0.key = ? AND l0.value = ?
		AND r.kind = l0.kind AND r.created_at = l0.object_created_at AND r.id = l0.object_id`)
	args = append(args, string(q.Kind), keys[0], q.Selector[keys[0]])
	if q.After != nil {
		b.WriteString(` AND (l0.object_created_at, l0.object_id) > (?, ?)`)
		args = append(args, rowcodec.Micros(q.After.CreatedAt), q.After.ID)
	}
	for _, k := range keys[1:] {
		b.WriteString(` AND EXISTS (SELECT 1 FROM labels l
			WHERE l.kind = l0.kind AND l.object_id = l0.object_id AND l.key = ? AND l.value = ?)`)
		args = append(args, k, q.Selector[k])
	}
	b.WriteString(` ORDER BY l0.object_created_at, l0.object_id LIMIT ?`)
	args = append(args, q.Limit)
	return b.String(), args
}

// labelsSQL reads the labels of a page of Workspaces in one statement: the
// IDs come as a JSON array, each one a probe of the labels primary key.
// (Resources have theirs in their row.)
const labelsSQL = `SELECT object_id, key, value FROM labels
	WHERE kind = ? AND object_id IN (SELECT j.value FROM json_each(?) AS j)`

// ListResources implements store.Tx: one statement, labels included. A
// Limit of 0 or less returns nothing.
func (t *txn) ListResources(ctx context.Context, q store.ListQuery) ([]*store.Resource, error) {
	if q.Limit <= 0 {
		return nil, nil
	}
	query, args := listSQL(q)
	var page []*store.Resource
	err := t.query(ctx, query, args, func(rows *sql.Rows) error {
		r, err := rowcodec.ScanResourceWithLabels(rows)
		if err != nil {
			return err
		}
		page = append(page, r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

// SetReferences implements store.Tx. Duplicate references count once.
func (t *txn) SetReferences(ctx context.Context, workspaceID string, refs []store.Reference) error {
	if _, err := t.exec(ctx, `DELETE FROM refs WHERE workspace_id = ?`, workspaceID); err != nil {
		return err
	}
	for _, r := range refs {
		if _, err := t.exec(ctx, `INSERT INTO refs (workspace_id, ref_kind, target_id) VALUES (?, ?, ?)
			ON CONFLICT DO NOTHING`, workspaceID, string(r.Kind), r.TargetID); err != nil {
			return err
		}
	}
	return nil
}

// CountReferences implements store.Tx.
func (t *txn) CountReferences(ctx context.Context, kind store.RefKind, targetID string) (int, error) {
	var n int
	if err := t.queryRow(ctx, `SELECT count(*) FROM refs WHERE ref_kind = ? AND target_id = ?`,
		[]any{string(kind), targetID}, &n); err != nil {
		return 0, err
	}
	return n, nil
}

// ReferencingWorkspaces implements store.Tx: a range scan of the refs
// primary key, in workspace ID order.
func (t *txn) ReferencingWorkspaces(ctx context.Context, kind store.RefKind, targetID string) ([]string, error) {
	var ids []string
	err := t.query(ctx, `SELECT workspace_id FROM refs WHERE ref_kind = ? AND target_id = ? ORDER BY workspace_id`,
		[]any{string(kind), targetID}, func(rows *sql.Rows) error {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
			return nil
		})
	if err != nil {
		return nil, err
	}
	return ids, nil
}
