package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kibotos/kibotos/internal/store"
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

const commandColumns = `command_id, method, fingerprint, object_kind, object_id, kind, initiator,
	status, result, error_code, error_detail, created_at, completed_at`

// GetCommand implements store.Tx.
func (t *txn) GetCommand(ctx context.Context, commandID string) (*store.Command, error) {
	var (
		c           store.Command
		created     int64
		completed   sql.NullInt64
		status      int64
		kind, initr int64
	)
	err := t.queryRow(ctx, `SELECT `+commandColumns+` FROM commands WHERE command_id = ?`, []any{commandID},
		&c.ID, &c.Method, &c.Fingerprint, &c.ObjectKind, &c.ObjectID, &kind, &initr,
		&status, &c.Result, &c.ErrorCode, &c.ErrorDetail, &created, &completed)
	if err != nil {
		return nil, err
	}
	c.Kind, c.Initiator, c.Status = int(kind), int(initr), store.CommandStatus(status)
	c.Fingerprint, c.Result, c.ErrorDetail = emptyNil(c.Fingerprint), emptyNil(c.Result), emptyNil(c.ErrorDetail)
	c.CreatedAt = fromMicros(created)
	if completed.Valid {
		c.CompletedAt = fromMicros(completed.Int64)
	}
	return &c, nil
}

// InsertCommand implements store.Tx.
func (t *txn) InsertCommand(ctx context.Context, c *store.Command) error {
	n, err := t.execN(ctx, `INSERT INTO commands (`+commandColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (command_id) DO NOTHING`,
		c.ID, c.Method, nonNil(c.Fingerprint), c.ObjectKind, c.ObjectID, int64(c.Kind), int64(c.Initiator),
		int64(c.Status), nonNil(c.Result), c.ErrorCode, nonNil(c.ErrorDetail), micros(c.CreatedAt), optMicros(c.CompletedAt))
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
		int64(c.Status), nonNil(c.Result), c.ErrorCode, nonNil(c.ErrorDetail), optMicros(c.CompletedAt), c.ID)
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

const resourceColumns = `r.kind, r.id, r.created_at, r.updated_at, r.revision, r.spec,
	r.labels, r.labels_revision, r.annotations, r.annotations_revision`

// scanResource scans resourceColumns.
func scanResource(row scanner) (*store.Resource, error) {
	var (
		r                              store.Resource
		kind, labels, annotations      string
		created, updated               int64
		rev, labelsRev, annotationsRev int64
	)
	if err := row.Scan(&kind, &r.ID, &created, &updated, &rev, &r.Spec, &labels, &labelsRev, &annotations, &annotationsRev); err != nil {
		return nil, err
	}
	r.Kind = store.Kind(kind)
	r.CreatedAt, r.UpdatedAt = fromMicros(created), fromMicros(updated)
	r.Revision, r.LabelsRevision, r.AnnotationsRevision = uint64(rev), uint64(labelsRev), uint64(annotationsRev)
	r.Spec = emptyNil(r.Spec)
	var err error
	if r.Labels, err = jsonMap(labels); err != nil {
		return nil, fmt.Errorf("store/sqlite: resource %s/%s: labels: %w", kind, r.ID, err)
	}
	if r.Annotations, err = jsonMap(annotations); err != nil {
		return nil, fmt.Errorf("store/sqlite: resource %s/%s: annotations: %w", kind, r.ID, err)
	}
	return &r, nil
}

// jsonMap decodes a JSON object of strings, as mapJSON (or SQLite's
// json_group_object) encodes it, into a non-nil map.
func jsonMap(j string) (map[string]string, error) {
	if j == "{}" {
		return map[string]string{}, nil
	}
	if m, ok := plainJSONMap(j); ok {
		return m, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(j), &m); err != nil {
		return nil, err
	}
	if m == nil {
		m = map[string]string{}
	}
	return m, nil
}

// plainJSONMap decodes the common case of jsonMap without encoding/json: a
// compact object {"k":"v",...} of strings without escapes, whose keys and
// values are then the bytes between the quotes. It reports false for
// anything else (an escape, white space, another type), which jsonMap
// leaves to encoding/json.
func plainJSONMap(j string) (map[string]string, bool) {
	if len(j) < 2 || j[0] != '{' || j[len(j)-1] != '}' || strings.IndexByte(j, '\\') >= 0 {
		return nil, false
	}
	m := make(map[string]string, strings.Count(j, `":"`))
	// str reads a string token at the start of s: its content and the rest.
	str := func(s string) (string, string, bool) {
		if len(s) == 0 || s[0] != '"' {
			return "", "", false
		}
		end := strings.IndexByte(s[1:], '"')
		if end < 0 {
			return "", "", false
		}
		return s[1 : 1+end], s[2+end:], true
	}
	rest := j[1 : len(j)-1]
	for len(rest) > 0 {
		k, r, ok := str(rest)
		if !ok || len(r) == 0 || r[0] != ':' {
			return nil, false
		}
		v, r, ok := str(r[1:])
		if !ok {
			return nil, false
		}
		if _, dup := m[k]; dup {
			return nil, false
		}
		m[k] = v
		switch {
		case len(r) == 0:
			rest = r
		case r[0] == ',' && len(r) > 1:
			rest = r[1:]
		default:
			return nil, false
		}
	}
	return m, true
}

// GetResource implements store.Tx: a search of resources_id, then of the
// primary key.
func (t *txn) GetResource(ctx context.Context, kind store.Kind, id string) (*store.Resource, error) {
	c, err := t.stmtCtx(ctx)
	if err != nil {
		return nil, err
	}
	r, err := scanResource(t.c.queryRow(c, `SELECT `+resourceColumns+` FROM resources r WHERE r.kind = ? AND r.id = ?`, string(kind), id))
	if err != nil {
		return nil, t.fail(err)
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

// InsertResource implements store.Tx. The labels are stored twice: in the
// row, and in the labels table for selectors.
func (t *txn) InsertResource(ctx context.Context, r *store.Resource) error {
	rev, labelsRev, annotationsRev, annotations, err := resourceArgs(r)
	if err != nil {
		return err
	}
	labels, err := mapJSON(r.Labels)
	if err != nil {
		return err
	}
	// Any conflict is a duplicate (kind, id): resources_id, or the
	// primary key, which holds it.
	n, err := t.execN(ctx, `INSERT INTO resources (kind, id, created_at, updated_at, revision, spec,
			labels, labels_revision, annotations, annotations_revision)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT DO NOTHING`,
		string(r.Kind), r.ID, micros(r.CreatedAt), micros(r.UpdatedAt), rev, nonNil(r.Spec),
		labels, labelsRev, annotations, annotationsRev)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: %s %q", store.ErrDuplicate, r.Kind, r.ID)
	}
	return t.insertLabels(ctx, r.Kind, r.ID, micros(r.CreatedAt), labels)
}

// insertLabels inserts labels, a JSON object as mapJSON encodes it, in one
// statement, reading them with json_each.
func (t *txn) insertLabels(ctx context.Context, kind store.Kind, id string, createdAt int64, labels string) error {
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
	rev, labelsRev, annotationsRev, annotations, err := resourceArgs(r)
	if err != nil {
		return err
	}
	labels, err := mapJSON(r.Labels)
	if err != nil {
		return err
	}
	var created int64
	err = t.queryRow(ctx, `UPDATE resources
		SET updated_at = ?, revision = ?, spec = ?, labels = ?, labels_revision = ?, annotations = ?, annotations_revision = ?
		WHERE kind = ? AND id = ?
		RETURNING created_at`,
		[]any{micros(r.UpdatedAt), rev, nonNil(r.Spec), labels, labelsRev, annotations, annotationsRev, string(r.Kind), r.ID},
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
func (t *txn) DeleteResource(ctx context.Context, kind store.Kind, id string) error {
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
	keys := make([]string, 0, len(q.Selector))
	for k := range q.Selector {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b.WriteString(`SELECT ` + resourceColumns)
	if len(keys) == 0 {
		b.WriteString(` FROM resources r WHERE r.kind = ?`)
		args = append(args, string(q.Kind))
		if q.After != nil {
			b.WriteString(` AND (r.created_at, r.id) > (?, ?)`)
			args = append(args, micros(q.After.CreatedAt), q.After.ID)
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
		args = append(args, micros(q.After.CreatedAt), q.After.ID)
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
		r, err := scanResource(rows)
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
		return 0, fmt.Errorf("store/sqlite: %s %d out of range", what, v)
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

// nonNil stores nil bytes as an empty blob (the columns are NOT NULL).
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
