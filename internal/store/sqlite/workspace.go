package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// scanCommand and scanWorkspace read nullable BIGINTs as database/sql does.
var (
	scanCommand   = rowcodec.ScanCommand[sql.NullInt64]
	scanWorkspace = rowcodec.ScanWorkspace[sql.NullInt64]
)

// GetWorkspace implements store.Tx.
func (t *txn) GetWorkspace(ctx context.Context, id string) (*store.Workspace, error) {
	w, err := queryOne(ctx, t, scanWorkspace, `SELECT `+rowcodec.WorkspaceColumns+` FROM workspaces w WHERE w.id = ?`, id)
	if err != nil {
		return nil, err
	}
	err = t.query(ctx, `SELECT key, value FROM labels WHERE kind = ? AND object_id = ?`, []any{string(store.KindWorkspace), id},
		func(rows *sql.Rows) error {
			var k, v string
			if err := rows.Scan(&k, &v); err != nil {
				return err
			}
			w.Labels[k] = v
			return nil
		})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// InsertWorkspace implements store.Tx.
func (t *txn) InsertWorkspace(ctx context.Context, w *store.Workspace) error {
	args, err := rowcodec.WorkspaceArgs(w)
	if err != nil {
		return err
	}
	n, err := t.execN(ctx, `INSERT INTO workspaces (id, created_at, `+strings.Join(rowcodec.WorkspaceMutable, ", ")+`)
		VALUES (?, ?`+strings.Repeat(", ?", len(rowcodec.WorkspaceMutable))+`)
		ON CONFLICT (id) DO NOTHING`,
		append([]any{w.ID, rowcodec.Micros(w.CreatedAt)}, args...)...)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: workspace %q", store.ErrDuplicate, w.ID)
	}
	labels, err := rowcodec.MapJSON(w.Labels)
	if err != nil {
		return err
	}
	return t.insertLabels(ctx, store.KindWorkspace, w.ID, rowcodec.Micros(w.CreatedAt), labels)
}

// updateWorkspaceSQL sets every mutable column.
var updateWorkspaceSQL = func() string {
	set := make([]string, len(rowcodec.WorkspaceMutable))
	for i, c := range rowcodec.WorkspaceMutable {
		set[i] = c + " = ?"
	}
	return `UPDATE workspaces SET ` + strings.Join(set, ", ") + ` WHERE id = ? RETURNING created_at`
}()

// UpdateWorkspace implements store.Tx. CreatedAt is not mutable and is kept
// from the stored row. Only the labels that changed are written: the
// reconciler updates Workspaces often, mostly without touching their labels.
func (t *txn) UpdateWorkspace(ctx context.Context, w *store.Workspace) error {
	args, err := rowcodec.WorkspaceArgs(w)
	if err != nil {
		return err
	}
	var created int64
	if err := t.queryRow(ctx, updateWorkspaceSQL, append(args, w.ID), &created); err != nil {
		return err
	}
	j, err := rowcodec.MapJSON(w.Labels)
	if err != nil {
		return err
	}
	kind := string(store.KindWorkspace)
	// Drop the labels that are gone or whose value changed, then add those
	// not stored as they are.
	if _, err := t.exec(ctx, `DELETE FROM labels
		WHERE kind = ? AND object_id = ?
		AND NOT EXISTS (SELECT 1 FROM json_each(?) AS j WHERE j.key = labels.key AND j.value = labels.value)`,
		kind, w.ID, j); err != nil {
		return err
	}
	if len(w.Labels) == 0 {
		return nil
	}
	_, err = t.exec(ctx, `INSERT INTO labels (kind, object_id, key, value, object_created_at)
		SELECT ?1, ?2, j.key, j.value, ?3 FROM json_each(?4) AS j
		WHERE NOT EXISTS (SELECT 1 FROM labels l WHERE l.kind = ?1 AND l.object_id = ?2 AND l.key = j.key)`,
		kind, w.ID, created, j)
	return err
}

// workspaceListSQL returns the statement and arguments of one ListWorkspaces
// page (q.Limit > 0).
//
//   - With a selector, the page is driven by the labels_selector index as in
//     ListResources (range scan of the first entry from the cursor, primary
//     key probes for the others), and the state and guest condition filters
//     are checked on the rows it finds.
//   - With one state, it is a range scan of workspaces_state from the cursor.
//   - With several, it is the merge of one such range scan per state, each
//     stopping after Limit rows: at most Limit rows per state are read,
//     however many Workspaces are in those states.
//   - Otherwise it is a range scan of workspaces_guest for a guest
//     condition, else of workspaces_live (deleted Workspaces left out) or
//     workspaces_list (included).
//
// SQLite picks these indexes from the shape of the statement, whatever the
// parameter values, so they are parameters; TestWorkspaceQueryPlans pins
// the plans. The exception is store.WorkspaceStateDeleted, spelled as a
// literal like every constant a partial index tests (workspaces_live): SQLite
// uses a partial index only when the query's WHERE clause contains the
// index's terms as written.
func workspaceListSQL(q store.WorkspaceQuery) (string, []any) {
	var b strings.Builder
	var args []any
	st := rowcodec.States(q.States)
	keys := rowcodec.SortedKeys(q.Selector)
	guest := func() {
		if q.GuestCondition != 0 {
			b.WriteString(` AND w.guest_condition = ?`)
			args = append(args, int64(q.GuestCondition))
		}
	}
	after := func(createdAt, id string) {
		if q.After != nil {
			b.WriteString(` AND (` + createdAt + `, ` + id + `) > (?, ?)`)
			args = append(args, rowcodec.Micros(q.After.CreatedAt), q.After.ID)
		}
	}

	if len(keys) > 0 {
		b.WriteString(`SELECT ` + rowcodec.WorkspaceColumns + ` FROM labels l0 CROSS JOIN workspaces w
			WHERE l0.kind = ? AND l0.key = ? AND l0.value = ? AND w.id = l0.object_id`)
		args = append(args, string(store.KindWorkspace), keys[0], q.Selector[keys[0]])
		after("l0.object_created_at", "l0.object_id")
		for _, k := range keys[1:] {
			b.WriteString(` AND EXISTS (SELECT 1 FROM labels l
				WHERE l.kind = l0.kind AND l.object_id = l0.object_id AND l.key = ? AND l.value = ?)`)
			args = append(args, k, q.Selector[k])
		}
		switch {
		case len(st) > 0:
			b.WriteString(` AND w.state IN (?` + strings.Repeat(", ?", len(st)-1) + `)`)
			for _, s := range st {
				args = append(args, int64(s))
			}
		case !q.IncludeDeleted:
			b.WriteString(` AND w.state != ` + strconv.Itoa(int(store.WorkspaceStateDeleted)))
		}
		guest()
		b.WriteString(` ORDER BY l0.object_created_at, l0.object_id LIMIT ?`)
		args = append(args, q.Limit)
		return b.String(), args
	}

	// one writes the scan of one state.
	one := func(s int32) {
		b.WriteString(`SELECT ` + rowcodec.WorkspaceColumns + ` FROM workspaces w WHERE w.state = ?`)
		args = append(args, int64(s))
		after("w.created_at", "w.id")
		guest()
		b.WriteString(` ORDER BY w.created_at, w.id LIMIT ?`)
		args = append(args, q.Limit)
	}
	switch {
	case len(st) == 1:
		one(st[0])
	case len(st) > 1:
		b.WriteString(`SELECT * FROM (`)
		for i, s := range st {
			if i > 0 {
				b.WriteString(` UNION ALL `)
			}
			b.WriteString(`SELECT * FROM (`)
			one(s)
			b.WriteString(`)`)
		}
		b.WriteString(`) ORDER BY created_at, id LIMIT ?`)
		args = append(args, q.Limit)
	default:
		b.WriteString(`SELECT ` + rowcodec.WorkspaceColumns + ` FROM workspaces w WHERE true`)
		if !q.IncludeDeleted {
			b.WriteString(` AND w.state != ` + strconv.Itoa(int(store.WorkspaceStateDeleted)))
		}
		after("w.created_at", "w.id")
		guest()
		b.WriteString(` ORDER BY w.created_at, w.id LIMIT ?`)
		args = append(args, q.Limit)
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
	WHERE w.node_id = ? AND w.deleted_at IS NULL
	ORDER BY w.created_at, w.id`

// WorkspacesOnNode implements store.Tx.
func (t *txn) WorkspacesOnNode(ctx context.Context, nodeID string) ([]*store.Workspace, error) {
	return t.workspaces(ctx, workspacesOnNodeSQL, nodeID)
}

// nodeUsageSQL sums the covering partial index workspaces_node_usage
// (migration 11): it reads no document and no table row. Its WHERE
// clause repeats the index's.
var nodeUsageSQL = `SELECT COALESCE(SUM(CASE WHEN w.power = ` + strconv.Itoa(int(store.PowerRunning)) + ` THEN w.memory_mib ELSE 0 END), 0),
		COALESCE(SUM(w.layer_bytes), 0),
		COALESCE(SUM(CASE WHEN w.power = ` + strconv.Itoa(int(store.PowerRunning)) + ` THEN w.cpu_millis ELSE 0 END), 0)
	FROM workspaces w WHERE w.node_id = ? AND w.deleted_at IS NULL`

// nodeUsagesSQL is nodeUsageSQL for every node, grouped: one scan of the
// same covering partial index, in its node_id order.
var nodeUsagesSQL = `SELECT w.node_id, COALESCE(SUM(CASE WHEN w.power = ` + strconv.Itoa(int(store.PowerRunning)) + ` THEN w.memory_mib ELSE 0 END), 0),
		COALESCE(SUM(w.layer_bytes), 0),
		COALESCE(SUM(CASE WHEN w.power = ` + strconv.Itoa(int(store.PowerRunning)) + ` THEN w.cpu_millis ELSE 0 END), 0)
	FROM workspaces w WHERE w.node_id != '' AND w.deleted_at IS NULL GROUP BY w.node_id`

// NodeUsages implements store.Tx.
func (t *txn) NodeUsages(ctx context.Context) (map[string]store.NodeUsage, error) {
	out := map[string]store.NodeUsage{}
	err := t.query(ctx, nodeUsagesSQL, nil, func(rows *sql.Rows) error {
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
	err := t.query(ctx, nodeUsageSQL, []any{nodeID}, func(rows *sql.Rows) error {
		return rows.Scan(&memory, &layer, &cpu)
	})
	if err != nil {
		return store.NodeUsage{}, err
	}
	return store.NodeUsage{RunningMemoryMiB: uint64(memory), LayerBytes: uint64(layer), RunningCPUMillis: uint64(cpu)}, nil
}

// templateCountSQL counts in the covering partial index
// workspaces_template (migration 11); its WHERE clause repeats the
// index's.
const templateCountSQL = `SELECT count(*) FROM workspaces w WHERE w.template_key = ? AND w.deleted_at IS NULL`

// CountWorkspacesWithTemplate implements store.Tx.
func (t *txn) CountWorkspacesWithTemplate(ctx context.Context, templateKey string) (int, error) {
	var n int
	if err := t.queryRow(ctx, templateCountSQL, []any{templateKey}, &n); err != nil {
		return 0, err
	}
	return n, nil
}

// pendingWorkspacesSQL is a scan of the workspaces_pending partial index,
// which holds only the Workspaces it returns; its WHERE clause repeats the
// index's.
const pendingWorkspacesSQL = `SELECT ` + rowcodec.WorkspaceColumns + ` FROM workspaces w
	WHERE w.deleted_at IS NULL AND (w.generation > w.observed_generation OR w.node_id = '')
		AND (w.node_id != '' OR w.command_id != '')
	ORDER BY w.created_at, w.id LIMIT ?`

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
	err := t.query(ctx, query, args, func(rows *sql.Rows) error {
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
	idsJSON, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	err = t.query(ctx, labelsSQL, []any{string(store.KindWorkspace), string(idsJSON)}, func(rows *sql.Rows) error {
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
	WHERE object_kind = ? AND status = ` + strconv.Itoa(int(store.CommandProcessing)) + `
	ORDER BY created_at, command_id LIMIT ?`

// ProcessingCommands implements store.Tx, oldest (by CreatedAt, then ID)
// first. A limit of 0 or less returns nothing.
func (t *txn) ProcessingCommands(ctx context.Context, objectKind string, limit int) ([]*store.Command, error) {
	if limit <= 0 {
		return nil, nil
	}
	var out []*store.Command
	err := t.query(ctx, processingCommandsSQL, []any{objectKind, limit}, func(rows *sql.Rows) error {
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
// was first stored with.
func (t *txn) UpsertNode(ctx context.Context, n *store.Node) error {
	args, err := rowcodec.NodeArgs(n)
	if err != nil {
		return err
	}
	_, err = t.exec(ctx, `INSERT INTO nodes (`+rowcodec.NodeColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, memory_mib = excluded.memory_mib,
			cpu_millis = excluded.cpu_millis, storage_bytes = excluded.storage_bytes, doc = excluded.doc,
			cert_key_hash = excluded.cert_key_hash, epoch = excluded.epoch, revision = nodes.revision + 1`,
		args...)
	return err
}

// GetNode implements store.Tx.
func (t *txn) GetNode(ctx context.Context, id string) (*store.Node, error) {
	return queryOne(ctx, t, rowcodec.ScanNode, `SELECT `+rowcodec.NodeColumns+` FROM nodes WHERE id = ?`, id)
}

// ListNodes implements store.Tx.
func (t *txn) ListNodes(ctx context.Context) ([]*store.Node, error) {
	var out []*store.Node
	err := t.query(ctx, `SELECT `+rowcodec.NodeColumns+` FROM nodes ORDER BY id`, nil, func(rows *sql.Rows) error {
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
	_, err = t.exec(ctx, `INSERT INTO denied_node_keys (`+rowcodec.DeniedNodeKeyColumns+`) VALUES (?, ?, ?, ?)
		ON CONFLICT (key_hash) DO NOTHING`, args...)
	return err
}

// GetDeniedNodeKey implements store.Tx.
func (t *txn) GetDeniedNodeKey(ctx context.Context, keyHash []byte) (*store.DeniedNodeKey, error) {
	return queryOne(ctx, t, rowcodec.ScanDeniedNodeKey,
		`SELECT `+rowcodec.DeniedNodeKeyColumns+` FROM denied_node_keys WHERE key_hash = ?`, rowcodec.NonNil(keyHash))
}
