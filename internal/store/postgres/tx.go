package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// errTxDone is returned when a Tx is used after its fn has returned.
var errTxDone = errors.New("store/postgres: transaction used after its function returned")

// txn implements store.Tx on a pgx transaction.
type txn struct {
	tx   pgx.Tx
	done atomic.Bool
	// retry is the first serialization failure or deadlock a statement hit:
	// the transaction is lost and InTx runs fn again, whatever fn returns.
	retry error
}

var _ store.Tx = (*txn)(nil)

func (t *txn) finish() { t.done.Store(true) }

func (t *txn) check() error {
	if t.done.Load() {
		return errTxDone
	}
	return nil
}

// fail records a retryable error and classifies err.
func (t *txn) fail(err error) error {
	if retryable(err) && t.retry == nil {
		t.retry = err
	}
	return classify(err)
}

func (t *txn) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.check(); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := t.tx.Exec(ctx, sql, args...)
	if err != nil {
		return tag, t.fail(err)
	}
	return tag, nil
}

func (t *txn) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	if err := t.check(); err != nil {
		return err
	}
	if err := t.tx.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		return t.fail(err)
	}
	return nil
}

// queryOne runs a query expected to return at most one row and scans it
// with scan; no row is store.ErrNotFound.
func queryOne[T any](ctx context.Context, t *txn, scan func(rowcodec.Scanner) (T, error), sql string, args ...any) (T, error) {
	var zero T
	if err := t.check(); err != nil {
		return zero, err
	}
	v, err := scan(t.tx.QueryRow(ctx, sql, args...))
	if err != nil {
		return zero, t.fail(err)
	}
	return v, nil
}

// query runs a query and calls each for every row.
func (t *txn) query(ctx context.Context, sql string, args []any, each func(pgx.Rows) error) error {
	if err := t.check(); err != nil {
		return err
	}
	rows, err := t.tx.Query(ctx, sql, args...)
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
	if err := t.queryRow(ctx, `SELECT value FROM secrets WHERE name = $1`, []any{name}, &v); err != nil {
		return nil, err
	}
	if v == nil {
		v = []byte{}
	}
	return v, nil
}

// LockCommand implements store.Tx with a transaction-scoped advisory lock on
// a 64-bit hash of commandID; it is released at COMMIT or ROLLBACK.
func (t *txn) LockCommand(ctx context.Context, commandID string) error {
	_, err := t.exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, commandID)
	return err
}

// GetCommand implements store.Tx.
func (t *txn) GetCommand(ctx context.Context, commandID string) (*store.Command, error) {
	return queryOne(ctx, t, scanCommand, `SELECT `+rowcodec.CommandColumns+` FROM commands WHERE command_id = $1`, commandID)
}

// InsertCommand implements store.Tx.
func (t *txn) InsertCommand(ctx context.Context, c *store.Command) error {
	return t.insertUnique(ctx,
		fmt.Sprintf("command %q", c.ID),
		stmt{`SELECT EXISTS (SELECT 1 FROM commands WHERE command_id = $1)`, []any{c.ID}},
		stmt{`INSERT INTO commands (` + rowcodec.CommandColumns + `)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
			rowcodec.CommandArgs(c)})
}

// stmt is a statement and its arguments.
type stmt struct {
	sql  string
	args []any
}

// insertUnique runs inserts, the first of which may violate a primary key,
// inside a savepoint, sent together in one round trip. A unique violation
// rolls back to the savepoint, leaving the transaction usable, and is
// ErrDuplicate when exists (a query for the conflicting row) sees the row,
// or a serialization failure when it does not: the row was committed by a
// transaction this one's snapshot does not see, and running fn again will
// see it.
//
// A plain INSERT rather than INSERT … ON CONFLICT DO NOTHING because the
// latter reads the unique index first, taking an SSI predicate lock on its
// leaf page: concurrent inserts of neighbouring keys then fail each other
// with serialization failures although none reads what another writes.
func (t *txn) insertUnique(ctx context.Context, what string, exists stmt, inserts ...stmt) error {
	if err := t.check(); err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(`SAVEPOINT store_insert`)
	for _, s := range inserts {
		b.Queue(s.sql, s.args...)
	}
	b.Queue(`RELEASE SAVEPOINT store_insert`)
	err := t.tx.SendBatch(ctx, b).Close()
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != codeUniqueViolation {
		return t.fail(err)
	}
	if _, err := t.tx.Exec(ctx, `ROLLBACK TO SAVEPOINT store_insert; RELEASE SAVEPOINT store_insert`); err != nil {
		return t.fail(err)
	}
	var visible bool
	if err := t.queryRow(ctx, exists.sql, exists.args, &visible); err != nil {
		return err
	}
	if !visible {
		return t.fail(&pgconn.PgError{
			Severity: "ERROR",
			Code:     codeSerializationFailure,
			Message:  "store/postgres: " + what + " was inserted by a concurrent transaction",
		})
	}
	return fmt.Errorf("%w: %s", store.ErrDuplicate, what)
}

// UpdateCommand implements store.Tx.
func (t *txn) UpdateCommand(ctx context.Context, c *store.Command) error {
	tag, err := t.exec(ctx, `UPDATE commands
		SET status = $1, result = $2, error_code = $3, error_detail = $4, completed_at = $5
		WHERE command_id = $6`,
		append(rowcodec.CommandUpdateArgs(c), c.ID)...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// GetResource implements store.Tx.
func (t *txn) GetResource(ctx context.Context, kind store.ResourceKind, id string) (*store.Resource, error) {
	r, err := queryOne(ctx, t, rowcodec.ScanResource, `SELECT `+rowcodec.ResourceColumns+` FROM resources r WHERE r.kind = $1 AND r.id = $2`, string(kind), id)
	if err != nil {
		return nil, err
	}
	err = t.query(ctx, `SELECT key, value FROM labels WHERE kind = $1 AND object_id = $2`, []any{string(kind), id}, func(rows pgx.Rows) error {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return err
		}
		r.Labels[k] = v
		return nil
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// InsertResource implements store.Tx.
func (t *txn) InsertResource(ctx context.Context, r *store.Resource) error {
	rev, labelsRev, annotationsRev, annotations, err := rowcodec.ResourceArgs(r)
	if err != nil {
		return err
	}
	inserts := []stmt{{`INSERT INTO resources (kind, id, created_at, updated_at, revision, spec,
			labels_revision, annotations, annotations_revision, drain_seconds)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		[]any{string(r.Kind), r.ID, rowcodec.Micros(r.CreatedAt), rowcodec.Micros(r.UpdatedAt), rev, rowcodec.NonNil(r.Spec),
			labelsRev, annotations, annotationsRev, int64(r.DrainSeconds)}}}
	if len(r.Labels) > 0 {
		inserts = append(inserts, insertLabels(r.Kind, r.ID, rowcodec.Micros(r.CreatedAt), r.Labels))
	}
	return t.insertUnique(ctx,
		fmt.Sprintf("%s %q", r.Kind, r.ID),
		stmt{`SELECT EXISTS (SELECT 1 FROM resources WHERE kind = $1 AND id = $2)`, []any{string(r.Kind), r.ID}},
		inserts...)
}

// labelArrays returns labels as two parallel arrays, for unnest.
func labelArrays(labels map[string]string) (keys, values []string) {
	keys = make([]string, 0, len(labels))
	values = make([]string, 0, len(labels))
	for k, v := range labels {
		keys = append(keys, k)
		values = append(values, v)
	}
	return keys, values
}

// insertLabels returns the statement inserting labels, from two parallel
// arrays.
func insertLabels(kind store.ResourceKind, id string, createdAt int64, labels map[string]string) stmt {
	keys, values := labelArrays(labels)
	return stmt{`INSERT INTO labels (kind, object_id, key, value, object_created_at)
		SELECT $1, $2, u.k, u.v, $3 FROM unnest($4::text[], $5::text[]) AS u(k, v)`,
		[]any{string(kind), id, createdAt, keys, values}}
}

// UpdateResource implements store.Tx. The labels are replaced wholesale;
// CreatedAt is not mutable and is kept from the stored row.
func (t *txn) UpdateResource(ctx context.Context, r *store.Resource) error {
	rev, labelsRev, annotationsRev, annotations, err := rowcodec.ResourceArgs(r)
	if err != nil {
		return err
	}
	var created int64
	err = t.queryRow(ctx, `UPDATE resources
		SET updated_at = $1, revision = $2, spec = $3, labels_revision = $4, annotations = $5, annotations_revision = $6,
			drain_seconds = $7
		WHERE kind = $8 AND id = $9
		RETURNING created_at`,
		[]any{rowcodec.Micros(r.UpdatedAt), rev, rowcodec.NonNil(r.Spec), labelsRev, annotations, annotationsRev,
			int64(r.DrainSeconds), string(r.Kind), r.ID},
		&created)
	if err != nil {
		return err
	}
	if _, err := t.exec(ctx, `DELETE FROM labels WHERE kind = $1 AND object_id = $2`, string(r.Kind), r.ID); err != nil {
		return err
	}
	if len(r.Labels) == 0 {
		return nil
	}
	l := insertLabels(r.Kind, r.ID, created, r.Labels)
	_, err = t.exec(ctx, l.sql, l.args...)
	return err
}

// DeleteResource implements store.Tx.
func (t *txn) DeleteResource(ctx context.Context, kind store.ResourceKind, id string) error {
	if _, err := t.exec(ctx, `DELETE FROM labels WHERE kind = $1 AND object_id = $2`, string(kind), id); err != nil {
		return err
	}
	tag, err := t.exec(ctx, `DELETE FROM resources WHERE kind = $1 AND id = $2`, string(kind), id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// listSQL returns the statement and arguments of one ListResources page.
//
// Without a selector the page is a range scan of resources_list. With one,
// the page is driven by the labels_selector index of the first selector entry
// (in key order): a range scan of (kind, key, value) from the cursor on
// (object_created_at, object_id), already in list order, joined to resources
// by primary key; every other entry is an EXISTS probe of the labels primary
// key. The OFFSET 0 keeps the planner from turning the EXISTS into a
// semi-join (simplify_EXISTS_query gives up on an OFFSET), which it otherwise
// does, hashing every row of the other entries' labels and sorting the
// result: a page would then cost as much as all the rows that carry those
// labels.
func listSQL(q store.ListQuery) (string, []any) {
	var b strings.Builder
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	keys := rowcodec.SortedKeys(q.Selector)
	b.WriteString(`SELECT ` + rowcodec.ResourceColumns)
	if len(keys) == 0 {
		b.WriteString(` FROM resources r WHERE r.kind = ` + arg(string(q.Kind)))
		if q.After != nil {
			b.WriteString(` AND (r.created_at, r.id) > (` + arg(rowcodec.Micros(q.After.CreatedAt)) + `, ` + arg(q.After.ID) + `)`)
		}
		b.WriteString(` ORDER BY r.created_at, r.id LIMIT ` + arg(q.Limit))
		return b.String(), args
	}
	b.WriteString(` FROM labels l0 JOIN resources r ON r.kind = l0.kind AND r.id = l0.object_id
		WHERE l0.kind = ` + arg(string(q.Kind)) + ` AND l0.key = ` + arg(keys[0]) + ` AND l0.value = ` + arg(q.Selector[keys[0]]))
	if q.After != nil {
		b.WriteString(` AND (l0.object_created_at, l0.object_id) > (` + arg(rowcodec.Micros(q.After.CreatedAt)) + `, ` + arg(q.After.ID) + `)`)
	}
	for _, k := range keys[1:] {
		b.WriteString(` AND EXISTS (SELECT 1 FROM labels l
			WHERE l.kind = l0.kind AND l.object_id = l0.object_id AND l.key = ` + arg(k) + ` AND l.value = ` + arg(q.Selector[k]) + `
			OFFSET 0)`)
	}
	b.WriteString(` ORDER BY l0.object_created_at, l0.object_id LIMIT ` + arg(q.Limit))
	return b.String(), args
}

// labelsSQL reads the labels of a page of resources in one statement, each
// ID a probe of the labels primary key.
const labelsSQL = `SELECT object_id, key, value FROM labels WHERE kind = $1 AND object_id = ANY($2::text[])`

// ListResources implements store.Tx. A Limit of 0 or less returns nothing.
func (t *txn) ListResources(ctx context.Context, q store.ListQuery) ([]*store.Resource, error) {
	if q.Limit <= 0 {
		return nil, nil
	}
	query, args := listSQL(q)
	var page []*store.Resource
	byID := map[string]*store.Resource{}
	err := t.query(ctx, query, args, func(rows pgx.Rows) error {
		r, err := rowcodec.ScanResource(rows)
		if err != nil {
			return err
		}
		page = append(page, r)
		byID[r.ID] = r
		return nil
	})
	if err != nil || len(page) == 0 {
		return page, err
	}
	ids := make([]string, len(page))
	for i, r := range page {
		ids[i] = r.ID
	}
	err = t.query(ctx, labelsSQL, []any{string(q.Kind), ids}, func(rows pgx.Rows) error {
		var id, k, v string
		if err := rows.Scan(&id, &k, &v); err != nil {
			return err
		}
		if r := byID[id]; r != nil {
			r.Labels[k] = v
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

// SetReferences implements store.Tx. Duplicate references count once.
func (t *txn) SetReferences(ctx context.Context, workspaceID string, refs []store.Reference) error {
	if _, err := t.exec(ctx, `DELETE FROM refs WHERE workspace_id = $1`, workspaceID); err != nil {
		return err
	}
	if len(refs) == 0 {
		return nil
	}
	kinds := make([]string, len(refs))
	targets := make([]string, len(refs))
	for i, r := range refs {
		kinds[i], targets[i] = string(r.Kind), r.TargetID
	}
	// The workspace has no rows left, so DISTINCT is all it takes to avoid
	// a conflict (ON CONFLICT would read the index: see insertUnique).
	_, err := t.exec(ctx, `INSERT INTO refs (workspace_id, ref_kind, target_id)
		SELECT DISTINCT $1::text, u.k, u.t FROM unnest($2::text[], $3::text[]) AS u(k, t)`, workspaceID, kinds, targets)
	return err
}

// CountReferences implements store.Tx.
func (t *txn) CountReferences(ctx context.Context, kind store.RefKind, targetID string) (int, error) {
	var n int64
	if err := t.queryRow(ctx, `SELECT count(*) FROM refs WHERE ref_kind = $1 AND target_id = $2`,
		[]any{string(kind), targetID}, &n); err != nil {
		return 0, err
	}
	return int(n), nil
}

// ReferencingWorkspaces implements store.Tx: a range scan of the refs
// primary key, in workspace ID order.
func (t *txn) ReferencingWorkspaces(ctx context.Context, kind store.RefKind, targetID string) ([]string, error) {
	var ids []string
	err := t.query(ctx, `SELECT workspace_id FROM refs WHERE ref_kind = $1 AND target_id = $2 ORDER BY workspace_id`,
		[]any{string(kind), targetID}, func(rows pgx.Rows) error {
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
