package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// scanCommand and scanWorkspace read nullable BIGINTs as pgx does without
// reflection.
var (
	scanCommand   = rowcodec.ScanCommand[pgtype.Int8]
	scanWorkspace = rowcodec.ScanWorkspace[pgtype.Int8]
)

// placeholders returns "$from, $from+1, ..." for n parameters.
func placeholders(from, n int) string {
	p := make([]string, n)
	for i := range p {
		p[i] = "$" + strconv.Itoa(from+i)
	}
	return strings.Join(p, ", ")
}

// GetWorkspace implements store.Tx. The row and its labels are read in one
// round trip.
func (t *txn) GetWorkspace(ctx context.Context, id string) (w *store.Workspace, err error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT `+rowcodec.WorkspaceColumns+` FROM workspaces w WHERE w.id = $1`, id)
	b.Queue(`SELECT key, value FROM labels WHERE kind = $1 AND object_id = $2`, string(store.KindWorkspace), id)
	br := t.tx.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			w, err = nil, t.fail(cerr)
		}
	}()
	w, err = scanWorkspace(br.QueryRow())
	if err != nil {
		return nil, t.fail(err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, t.fail(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, t.fail(err)
		}
		w.Labels[k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, t.fail(err)
	}
	return w, nil
}

// InsertWorkspace implements store.Tx.
func (t *txn) InsertWorkspace(ctx context.Context, w *store.Workspace) error {
	args, err := rowcodec.WorkspaceArgs(w)
	if err != nil {
		return err
	}
	inserts := []stmt{{`INSERT INTO workspaces (id, created_at, ` + strings.Join(rowcodec.WorkspaceMutable, ", ") + `)
		VALUES (` + placeholders(1, 2+len(rowcodec.WorkspaceMutable)) + `)`,
		append([]any{w.ID, rowcodec.Micros(w.CreatedAt)}, args...)}}
	if len(w.Labels) > 0 {
		inserts = append(inserts, insertLabels(store.KindWorkspace, w.ID, rowcodec.Micros(w.CreatedAt), w.Labels))
	}
	return t.insertUnique(ctx,
		fmt.Sprintf("workspace %q", w.ID),
		stmt{`SELECT EXISTS (SELECT 1 FROM workspaces WHERE id = $1)`, []any{w.ID}},
		inserts...)
}

// updateWorkspaceSQL sets every mutable column; $1 is the ID.
var updateWorkspaceSQL = func() string {
	set := make([]string, len(rowcodec.WorkspaceMutable))
	for i, c := range rowcodec.WorkspaceMutable {
		set[i] = c + " = $" + strconv.Itoa(i+2)
	}
	return `UPDATE workspaces SET ` + strings.Join(set, ", ") + ` WHERE id = $1`
}()

// The labels of an updated Workspace: drop those gone or whose value
// changed, then add those not stored as they are. A Workspace whose labels
// did not change (most updates) gets no label writes at all.
const (
	deleteStaleLabelsSQL = `DELETE FROM labels l
		WHERE l.kind = $1 AND l.object_id = $2
		AND NOT EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) AS u(k, v) WHERE u.k = l.key AND u.v = l.value)`
	insertMissingLabelsSQL = `INSERT INTO labels (kind, object_id, key, value, object_created_at)
		SELECT $1::text, w.id, u.k, u.v, w.created_at
		FROM unnest($3::text[], $4::text[]) AS u(k, v) JOIN workspaces w ON w.id = $2
		WHERE NOT EXISTS (SELECT 1 FROM labels l WHERE l.kind = $1 AND l.object_id = $2 AND l.key = u.k)`
)

// UpdateWorkspace implements store.Tx: the row and its labels are written in
// one round trip. CreatedAt is not mutable and is kept from the stored row.
func (t *txn) UpdateWorkspace(ctx context.Context, w *store.Workspace) error {
	args, err := rowcodec.WorkspaceArgs(w)
	if err != nil {
		return err
	}
	if err := t.check(); err != nil {
		return err
	}
	keys, values := labelArrays(w.Labels)
	kind := string(store.KindWorkspace)
	b := &pgx.Batch{}
	b.Queue(updateWorkspaceSQL, append([]any{w.ID}, args...)...)
	b.Queue(deleteStaleLabelsSQL, kind, w.ID, keys, values)
	if len(keys) > 0 {
		b.Queue(insertMissingLabelsSQL, kind, w.ID, keys, values)
	}
	br := t.tx.SendBatch(ctx, b)
	tag, err := br.Exec()
	for i := 1; i < b.Len() && err == nil; i++ {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return t.fail(err)
	}
	if tag.RowsAffected() == 0 {
		// The label statements found no Workspace either.
		return store.ErrNotFound
	}
	return nil
}

// workspaceListSQL returns the statement and arguments of one ListWorkspaces
// page (q.Limit > 0).
//
//   - With a selector, the page is driven by the labels_selector index as in
//     ListResources (range scan of the first entry from the cursor, primary
//     key probes for the others; see listSQL for the OFFSET 0), and the state
//     and guest condition filters are checked on the Workspaces it finds. The
//     Workspace is read by a LATERAL subquery fenced with OFFSET 0 so that
//     the planner cannot start from the workspaces side when those filters
//     look selective (a scan of every Workspace in the states, then a sort).
//   - With one state, it is a range scan from the cursor of workspaces_state
//     or, for a state most Workspaces are in, of workspaces_live.
//   - With several, it is the merge of one such scan per state, each
//     stopping after Limit rows: at most Limit rows per state are read,
//     however many Workspaces are in those states.
//   - Otherwise it is a range scan of workspaces_live (deleted Workspaces
//     left out) or workspaces_list (included), or of workspaces_guest for a
//     rare guest condition.
//
// States and the guest condition are integer literals rather than
// parameters: the planner then picks between the indexes above from the
// column statistics of those values in every plan, generic ones included.
// With a parameter, a generic plan would filter a scan of workspaces_list,
// whose cost for a rare state is the whole table. store.WorkspaceStateDeleted
// is a literal for the same reason, and because workspaces_live tests it:
// generic plans can use that partial index too.
func workspaceListSQL(q store.WorkspaceQuery) (string, []any) {
	var b strings.Builder
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	lit := func(v int32) string { return strconv.FormatInt(int64(v), 10) }
	st := rowcodec.States(q.States)
	keys := rowcodec.SortedKeys(q.Selector)
	var guest string
	if q.GuestCondition != 0 {
		guest = ` AND w.guest_condition = ` + lit(q.GuestCondition)
	}
	// The cursor and the limit are bound once, used by every branch.
	var afterAt, afterID string
	if q.After != nil {
		afterAt, afterID = arg(rowcodec.Micros(q.After.CreatedAt)), arg(q.After.ID)
	}
	limit := arg(q.Limit)
	after := func(createdAt, id string) {
		if q.After != nil {
			b.WriteString(` AND (` + createdAt + `, ` + id + `) > (` + afterAt + `, ` + afterID + `)`)
		}
	}

	if len(keys) > 0 {
		b.WriteString(`SELECT ` + rowcodec.WorkspaceColumns + ` FROM labels l0
			CROSS JOIN LATERAL (SELECT * FROM workspaces w WHERE w.id = l0.object_id`)
		switch {
		case len(st) > 0:
			lits := make([]string, len(st))
			for i, s := range st {
				lits[i] = lit(s)
			}
			b.WriteString(` AND w.state IN (` + strings.Join(lits, ", ") + `)`)
		case !q.IncludeDeleted:
			b.WriteString(` AND w.state <> ` + strconv.Itoa(int(store.WorkspaceStateDeleted)))
		}
		b.WriteString(guest + ` OFFSET 0) w
			WHERE l0.kind = ` + arg(string(store.KindWorkspace)) + ` AND l0.key = ` + arg(keys[0]) + ` AND l0.value = ` + arg(q.Selector[keys[0]]))
		after("l0.object_created_at", "l0.object_id")
		for _, k := range keys[1:] {
			b.WriteString(` AND EXISTS (SELECT 1 FROM labels l
				WHERE l.kind = l0.kind AND l.object_id = l0.object_id AND l.key = ` + arg(k) + ` AND l.value = ` + arg(q.Selector[k]) + `
				OFFSET 0)`)
		}
		b.WriteString(` ORDER BY l0.object_created_at, l0.object_id LIMIT ` + limit)
		return b.String(), args
	}

	// one writes the scan of one state.
	one := func(s int32) {
		b.WriteString(`SELECT ` + rowcodec.WorkspaceColumns + ` FROM workspaces w WHERE w.state = ` + lit(s))
		after("w.created_at", "w.id")
		b.WriteString(guest + ` ORDER BY w.created_at, w.id LIMIT ` + limit)
	}
	switch {
	case len(st) == 1:
		one(st[0])
	case len(st) > 1:
		b.WriteString(`SELECT ` + rowcodec.WorkspaceColumns + ` FROM (`)
		for i, s := range st {
			if i > 0 {
				b.WriteString(` UNION ALL `)
			}
			b.WriteString(`(`)
			one(s)
			b.WriteString(`)`)
		}
		b.WriteString(`) w ORDER BY w.created_at, w.id LIMIT ` + limit)
	default:
		b.WriteString(`SELECT ` + rowcodec.WorkspaceColumns + ` FROM workspaces w WHERE true`)
		if !q.IncludeDeleted {
			b.WriteString(` AND w.state <> ` + strconv.Itoa(int(store.WorkspaceStateDeleted)))
		}
		after("w.created_at", "w.id")
		b.WriteString(guest + ` ORDER BY w.created_at, w.id LIMIT ` + limit)
	}
	return b.String(), args
}

// ListWorkspaces implements store.Tx. A Limit of 0 or less returns nothing.
func (t *txn) ListWorkspaces(ctx context.Context, q store.WorkspaceQuery) ([]*store.Workspace, error) {
	if q.Limit <= 0 {
		return nil, nil
	}
	query, args := workspaceListSQL(q)
	return t.workspaces(ctx, query, args...)
}

// workspacesOnNodeSQL is a range scan of the workspaces_node partial index.
const workspacesOnNodeSQL = `SELECT ` + rowcodec.WorkspaceColumns + ` FROM workspaces w
	WHERE w.node_id = $1 AND w.deleted_at IS NULL
	ORDER BY w.created_at, w.id`

// WorkspacesOnNode implements store.Tx.
func (t *txn) WorkspacesOnNode(ctx context.Context, nodeID string) ([]*store.Workspace, error) {
	return t.workspaces(ctx, workspacesOnNodeSQL, nodeID)
}

// nodeUsageSQL sums the covering partial index workspaces_node_usage
// (migration 10): it reads no document and no table row. Its WHERE
// clause repeats the index's.
var nodeUsageSQL = `SELECT COALESCE(SUM(CASE WHEN w.power = ` + strconv.Itoa(int(store.PowerRunning)) + ` THEN w.memory_mib ELSE 0 END), 0)::BIGINT,
		COALESCE(SUM(w.layer_bytes), 0)::BIGINT,
		COALESCE(SUM(CASE WHEN w.power = ` + strconv.Itoa(int(store.PowerRunning)) + ` THEN w.cpu_millis ELSE 0 END), 0)::BIGINT
	FROM workspaces w WHERE w.node_id = $1 AND w.deleted_at IS NULL`

// nodeUsagesSQL is nodeUsageSQL for every node, grouped: one scan of the
// same covering partial index, in its node_id order.
var nodeUsagesSQL = `SELECT w.node_id, COALESCE(SUM(CASE WHEN w.power = ` + strconv.Itoa(int(store.PowerRunning)) + ` THEN w.memory_mib ELSE 0 END), 0)::BIGINT,
		COALESCE(SUM(w.layer_bytes), 0)::BIGINT,
		COALESCE(SUM(CASE WHEN w.power = ` + strconv.Itoa(int(store.PowerRunning)) + ` THEN w.cpu_millis ELSE 0 END), 0)::BIGINT
	FROM workspaces w WHERE w.node_id != '' AND w.deleted_at IS NULL GROUP BY w.node_id`

// NodeUsages implements store.Tx.
func (t *txn) NodeUsages(ctx context.Context) (map[string]store.NodeUsage, error) {
	out := map[string]store.NodeUsage{}
	err := t.query(ctx, nodeUsagesSQL, nil, func(rows pgx.Rows) error {
		var node string
		var memory, layer, cpu int64
		if err := rows.Scan(&node, &memory, &layer, &cpu); err != nil {
			return err
		}
		out[node] = store.NodeUsage{RunningMemoryMiB: uint64(memory), LayerBytes: uint64(layer), RunningCPUMillis: uint64(cpu)}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// NodeUsage implements store.Tx.
func (t *txn) NodeUsage(ctx context.Context, nodeID string) (store.NodeUsage, error) {
	var memory, layer, cpu int64
	err := t.query(ctx, nodeUsageSQL, []any{nodeID}, func(rows pgx.Rows) error {
		return rows.Scan(&memory, &layer, &cpu)
	})
	if err != nil {
		return store.NodeUsage{}, err
	}
	return store.NodeUsage{RunningMemoryMiB: uint64(memory), LayerBytes: uint64(layer), RunningCPUMillis: uint64(cpu)}, nil
}

// templateCountSQL counts in the partial index workspaces_template
// (migration 10); its WHERE clause repeats the index's.
const templateCountSQL = `SELECT count(*) FROM workspaces w WHERE w.template_key = $1 AND w.deleted_at IS NULL`

// CountWorkspacesWithTemplate implements store.Tx.
func (t *txn) CountWorkspacesWithTemplate(ctx context.Context, templateKey string) (int, error) {
	var n int64
	if err := t.queryRow(ctx, templateCountSQL, []any{templateKey}, &n); err != nil {
		return 0, err
	}
	return int(n), nil
}

// pendingWorkspacesSQL is a scan of the workspaces_pending partial index,
// which holds only the Workspaces it returns; its WHERE clause repeats the
// index's.
const pendingWorkspacesSQL = `SELECT ` + rowcodec.WorkspaceColumns + ` FROM workspaces w
	WHERE w.deleted_at IS NULL AND (w.generation > w.observed_generation OR w.node_id = '')
		AND (w.node_id != '' OR w.command_id != '')
	ORDER BY w.created_at, w.id LIMIT $1`

// PendingWorkspaces implements store.Tx, oldest (by CreatedAt, then ID)
// first. A limit of 0 or less returns nothing.
func (t *txn) PendingWorkspaces(ctx context.Context, limit int) ([]*store.Workspace, error) {
	if limit <= 0 {
		return nil, nil
	}
	return t.workspaces(ctx, pendingWorkspacesSQL, limit)
}

// workspaces runs a query of rowcodec.WorkspaceColumns and then reads the
// labels of every Workspace it returned with one statement.
func (t *txn) workspaces(ctx context.Context, query string, args ...any) ([]*store.Workspace, error) {
	var page []*store.Workspace
	byID := map[string]*store.Workspace{}
	err := t.query(ctx, query, args, func(rows pgx.Rows) error {
		w, err := scanWorkspace(rows)
		if err != nil {
			return err
		}
		page = append(page, w)
		byID[w.ID] = w
		return nil
	})
	if err != nil || len(page) == 0 {
		return page, err
	}
	ids := make([]string, len(page))
	for i, w := range page {
		ids[i] = w.ID
	}
	err = t.query(ctx, labelsSQL, []any{string(store.KindWorkspace), ids}, func(rows pgx.Rows) error {
		var id, k, v string
		if err := rows.Scan(&id, &k, &v); err != nil {
			return err
		}
		if w := byID[id]; w != nil {
			w.Labels[k] = v
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

// processingCommandsSQL is a range scan of the commands_processing partial
// index.
var processingCommandsSQL = `SELECT ` + rowcodec.CommandColumns + ` FROM commands
	WHERE object_kind = $1 AND status = ` + strconv.Itoa(int(store.CommandProcessing)) + `
	ORDER BY created_at, command_id LIMIT $2`

// ProcessingCommands implements store.Tx, oldest (by CreatedAt, then ID)
// first. A limit of 0 or less returns nothing.
func (t *txn) ProcessingCommands(ctx context.Context, objectKind string, limit int) ([]*store.Command, error) {
	if limit <= 0 {
		return nil, nil
	}
	var out []*store.Command
	err := t.query(ctx, processingCommandsSQL, []any{objectKind, limit}, func(rows pgx.Rows) error {
		c, err := scanCommand(rows)
		if err != nil {
			return err
		}
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// UpsertNode implements store.Tx. Replacing a node keeps the CreatedAt it
// was first stored with. Unlike the inserts of new objects this is an
// INSERT … ON CONFLICT: nodes are few and mostly replaced, and replacing one
// writes no index entry (a HOT update), so its predicate lock on the
// primary key's page conflicts only with the registration of a new node.
func (t *txn) UpsertNode(ctx context.Context, n *store.Node) error {
	args, err := rowcodec.NodeArgs(n)
	if err != nil {
		return err
	}
	_, err = t.exec(ctx, `INSERT INTO nodes (`+rowcodec.NodeColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, memory_mib = excluded.memory_mib,
			cpu_millis = excluded.cpu_millis, storage_bytes = excluded.storage_bytes, doc = excluded.doc,
			cert_key_hash = excluded.cert_key_hash, epoch = excluded.epoch, revision = nodes.revision + 1`,
		args...)
	return err
}

// GetNode implements store.Tx.
func (t *txn) GetNode(ctx context.Context, id string) (*store.Node, error) {
	return queryOne(ctx, t, rowcodec.ScanNode, `SELECT `+rowcodec.NodeColumns+` FROM nodes WHERE id = $1`, id)
}

// ListNodes implements store.Tx.
func (t *txn) ListNodes(ctx context.Context) ([]*store.Node, error) {
	var out []*store.Node
	err := t.query(ctx, `SELECT `+rowcodec.NodeColumns+` FROM nodes ORDER BY id`, nil, func(rows pgx.Rows) error {
		n, err := rowcodec.ScanNode(rows)
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

// DenyNodeKey implements store.Tx.
func (t *txn) DenyNodeKey(ctx context.Context, k *store.DeniedNodeKey) error {
	args, err := rowcodec.DeniedNodeKeyArgs(k)
	if err != nil {
		return err
	}
	_, err = t.exec(ctx, `INSERT INTO denied_node_keys (`+rowcodec.DeniedNodeKeyColumns+`) VALUES ($1, $2, $3, $4)
		ON CONFLICT (key_hash) DO NOTHING`, args...)
	return err
}

// GetDeniedNodeKey implements store.Tx.
func (t *txn) GetDeniedNodeKey(ctx context.Context, keyHash []byte) (*store.DeniedNodeKey, error) {
	return queryOne(ctx, t, rowcodec.ScanDeniedNodeKey,
		`SELECT `+rowcodec.DeniedNodeKeyColumns+` FROM denied_node_keys WHERE key_hash = $1`, rowcodec.NonNil(keyHash))
}
