package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kibotos/kibotos/internal/store"
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

const commandColumns = `command_id, method, fingerprint, object_kind, object_id, kind, initiator,
	status, result, error_code, error_detail, created_at, completed_at`

// GetCommand implements store.Tx.
func (t *txn) GetCommand(ctx context.Context, commandID string) (*store.Command, error) {
	var (
		c                   store.Command
		kind, initr, status int64
		created             int64
		completed           *int64
	)
	err := t.queryRow(ctx, `SELECT `+commandColumns+` FROM commands WHERE command_id = $1`, []any{commandID},
		&c.ID, &c.Method, &c.Fingerprint, &c.ObjectKind, &c.ObjectID, &kind, &initr,
		&status, &c.Result, &c.ErrorCode, &c.ErrorDetail, &created, &completed)
	if err != nil {
		return nil, err
	}
	c.Kind, c.Initiator, c.Status = int(kind), int(initr), store.CommandStatus(status)
	c.Fingerprint, c.Result, c.ErrorDetail = emptyNil(c.Fingerprint), emptyNil(c.Result), emptyNil(c.ErrorDetail)
	c.CreatedAt = fromMicros(created)
	if completed != nil {
		c.CompletedAt = fromMicros(*completed)
	}
	return &c, nil
}

// InsertCommand implements store.Tx.
func (t *txn) InsertCommand(ctx context.Context, c *store.Command) error {
	return t.insertUnique(ctx,
		fmt.Sprintf("command %q", c.ID),
		stmt{`SELECT EXISTS (SELECT 1 FROM commands WHERE command_id = $1)`, []any{c.ID}},
		stmt{`INSERT INTO commands (` + commandColumns + `)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
			[]any{c.ID, c.Method, nonNil(c.Fingerprint), c.ObjectKind, c.ObjectID, int64(c.Kind), int64(c.Initiator),
				int64(c.Status), nonNil(c.Result), c.ErrorCode, nonNil(c.ErrorDetail), micros(c.CreatedAt), optMicros(c.CompletedAt)}})
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
		int64(c.Status), nonNil(c.Result), c.ErrorCode, nonNil(c.ErrorDetail), optMicros(c.CompletedAt), c.ID)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

const resourceColumns = `r.kind, r.id, r.created_at, r.updated_at, r.revision, r.spec,
	r.labels_revision, r.annotations, r.annotations_revision`

// scanResource scans resourceColumns; Labels is left empty.
func scanResource(row pgx.Row) (*store.Resource, error) {
	var (
		r                              store.Resource
		kind, annotations              string
		created, updated               int64
		rev, labelsRev, annotationsRev int64
	)
	if err := row.Scan(&kind, &r.ID, &created, &updated, &rev, &r.Spec, &labelsRev, &annotations, &annotationsRev); err != nil {
		return nil, err
	}
	r.Kind = store.Kind(kind)
	r.CreatedAt, r.UpdatedAt = fromMicros(created), fromMicros(updated)
	r.Revision, r.LabelsRevision, r.AnnotationsRevision = uint64(rev), uint64(labelsRev), uint64(annotationsRev)
	r.Spec = emptyNil(r.Spec)
	r.Labels = map[string]string{}
	if err := json.Unmarshal([]byte(annotations), &r.Annotations); err != nil {
		return nil, fmt.Errorf("store/postgres: resource %s/%s: annotations: %w", kind, r.ID, err)
	}
	if r.Annotations == nil {
		r.Annotations = map[string]string{}
	}
	return &r, nil
}

// GetResource implements store.Tx.
func (t *txn) GetResource(ctx context.Context, kind store.Kind, id string) (*store.Resource, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	r, err := scanResource(t.tx.QueryRow(ctx, `SELECT `+resourceColumns+` FROM resources r WHERE r.kind = $1 AND r.id = $2`, string(kind), id))
	if err != nil {
		return nil, t.fail(err)
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

// resourceArgs returns the values of the mutable columns of r.
func resourceArgs(r *store.Resource) (rev, labelsRev, annotationsRev int64, annotations string, err error) {
	if rev, err = u2i("revision", r.Revision); err != nil {
		return
	}
	if labelsRev, err = u2i("labels revision", r.LabelsRevision); err != nil {
		return
	}
	if annotationsRev, err = u2i("annotations revision", r.AnnotationsRevision); err != nil {
		return
	}
	annotations, err = mapJSON(r.Annotations)
	return
}

// InsertResource implements store.Tx.
func (t *txn) InsertResource(ctx context.Context, r *store.Resource) error {
	rev, labelsRev, annotationsRev, annotations, err := resourceArgs(r)
	if err != nil {
		return err
	}
	inserts := []stmt{{`INSERT INTO resources (kind, id, created_at, updated_at, revision, spec,
			labels_revision, annotations, annotations_revision)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		[]any{string(r.Kind), r.ID, micros(r.CreatedAt), micros(r.UpdatedAt), rev, nonNil(r.Spec),
			labelsRev, annotations, annotationsRev}}}
	if len(r.Labels) > 0 {
		inserts = append(inserts, insertLabels(r.Kind, r.ID, micros(r.CreatedAt), r.Labels))
	}
	return t.insertUnique(ctx,
		fmt.Sprintf("%s %q", r.Kind, r.ID),
		stmt{`SELECT EXISTS (SELECT 1 FROM resources WHERE kind = $1 AND id = $2)`, []any{string(r.Kind), r.ID}},
		inserts...)
}

// insertLabels returns the statement inserting labels, from two parallel
// arrays.
func insertLabels(kind store.Kind, id string, createdAt int64, labels map[string]string) stmt {
	keys := make([]string, 0, len(labels))
	values := make([]string, 0, len(labels))
	for k, v := range labels {
		keys = append(keys, k)
		values = append(values, v)
	}
	return stmt{`INSERT INTO labels (kind, object_id, key, value, object_created_at)
		SELECT $1, $2, u.k, u.v, $3 FROM unnest($4::text[], $5::text[]) AS u(k, v)`,
		[]any{string(kind), id, createdAt, keys, values}}
}

// UpdateResource implements store.Tx. The labels are replaced wholesale;
// CreatedAt is not mutable and is kept from the stored row.
func (t *txn) UpdateResource(ctx context.Context, r *store.Resource) error {
	rev, labelsRev, annotationsRev, annotations, err := resourceArgs(r)
	if err != nil {
		return err
	}
	var created int64
	err = t.queryRow(ctx, `UPDATE resources
		SET updated_at = $1, revision = $2, spec = $3, labels_revision = $4, annotations = $5, annotations_revision = $6
		WHERE kind = $7 AND id = $8
		RETURNING created_at`,
		[]any{micros(r.UpdatedAt), rev, nonNil(r.Spec), labelsRev, annotations, annotationsRev, string(r.Kind), r.ID},
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
func (t *txn) DeleteResource(ctx context.Context, kind store.Kind, id string) error {
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
	keys := make([]string, 0, len(q.Selector))
	for k := range q.Selector {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b.WriteString(`SELECT ` + resourceColumns)
	if len(keys) == 0 {
		b.WriteString(` FROM resources r WHERE r.kind = ` + arg(string(q.Kind)))
		if q.After != nil {
			b.WriteString(` AND (r.created_at, r.id) > (` + arg(micros(q.After.CreatedAt)) + `, ` + arg(q.After.ID) + `)`)
		}
		b.WriteString(` ORDER BY r.created_at, r.id LIMIT ` + arg(q.Limit))
		return b.String(), args
	}
	b.WriteString(` FROM labels l0 JOIN resources r ON r.kind = l0.kind AND r.id = l0.object_id
		WHERE l0.kind = ` + arg(string(q.Kind)) + ` AND l0.key = ` + arg(keys[0]) + ` AND l0.value = ` + arg(q.Selector[keys[0]]))
	if q.After != nil {
		b.WriteString(` AND (l0.object_created_at, l0.object_id) > (` + arg(micros(q.After.CreatedAt)) + `, ` + arg(q.After.ID) + `)`)
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
		r, err := scanResource(rows)
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

// micros is t in microseconds since the Unix epoch.
func micros(t time.Time) int64 { return t.UnixMicro() }

// optMicros is micros(t), or NULL for the zero time.
func optMicros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

// fromMicros is the UTC time v microseconds after the Unix epoch.
func fromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

// u2i converts a revision to the signed 64-bit column type.
func u2i(what string, v uint64) (int64, error) {
	if v > math.MaxInt64 {
		return 0, fmt.Errorf("store/postgres: %s %d out of range", what, v)
	}
	return int64(v), nil
}

// mapJSON encodes m as a JSON object ("{}" when empty).
func mapJSON(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// nonNil stores nil bytes as an empty bytea (the columns are NOT NULL).
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// emptyNil returns nil for an empty slice.
func emptyNil(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}
