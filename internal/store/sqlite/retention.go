package sqlite

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// PruneCommands implements store.Tx: one DELETE of the oldest completed
// commands, found by a range scan of the commands_completed partial index
// (its WHERE term status = 2 is spelled as written), each checked against
// the workspaces_command partial index.
func (t *txn) PruneCommands(ctx context.Context, before time.Time, keep []string, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	args := []any{rowcodec.Micros(before)}
	for _, m := range keep {
		args = append(args, m)
	}
	args = append(args, limit)
	n, err := t.execN(ctx, pruneCommandsSQL(len(keep)), args...)
	return int(n), err
}

// pruneCommandsSQL is the DELETE of PruneCommands with keep methods kept;
// its arguments are the cutoff, the methods and the limit.
func pruneCommandsSQL(keep int) string {
	var b strings.Builder
	b.WriteString(`DELETE FROM commands WHERE command_id IN (
		SELECT c.command_id FROM commands c
		WHERE c.status = ` + strconv.Itoa(int(store.CommandCompleted)) + ` AND c.completed_at < ?`)
	if keep > 0 {
		b.WriteString(` AND c.method NOT IN (?` + strings.Repeat(`, ?`, keep-1) + `)`)
	}
	b.WriteString(`
		AND NOT EXISTS (SELECT 1 FROM workspaces w WHERE w.command_id = c.command_id AND w.command_id != '')
		ORDER BY c.completed_at LIMIT ?)`)
	return b.String()
}

// prunableWorkspacesSQL selects the oldest deletions for
// PruneDeletedWorkspaces: the cutoff, the limit.
const prunableWorkspacesSQL = `SELECT id FROM workspaces WHERE deleted_at IS NOT NULL AND deleted_at < ?
	ORDER BY deleted_at LIMIT ?`

// PruneDeletedWorkspaces implements store.Tx: the oldest deletions, found
// by a range scan of the workspaces_deleted partial index, then each
// Workspace's labels, references and row.
func (t *txn) PruneDeletedWorkspaces(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	ids, err := t.ids(ctx, prunableWorkspacesSQL, rowcodec.Micros(before), limit)
	if err != nil {
		return 0, err
	}
	for _, id := range ids {
		if _, err := t.exec(ctx, `DELETE FROM labels WHERE kind = ? AND object_id = ?`, string(store.KindWorkspace), id); err != nil {
			return 0, err
		}
		if _, err := t.exec(ctx, `DELETE FROM refs WHERE workspace_id = ?`, id); err != nil {
			return 0, err
		}
		if _, err := t.exec(ctx, `DELETE FROM workspaces WHERE id = ?`, id); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}

// PruneResources implements store.Tx: the resources of kind (a range of
// the primary key) last updated before before, then each one's labels and
// row.
func (t *txn) PruneResources(ctx context.Context, kind store.ResourceKind, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	ids, err := t.ids(ctx, `SELECT id FROM resources WHERE kind = ? AND updated_at < ? ORDER BY updated_at, id LIMIT ?`,
		string(kind), rowcodec.Micros(before), limit)
	if err != nil {
		return 0, err
	}
	for _, id := range ids {
		if _, err := t.exec(ctx, `DELETE FROM labels WHERE kind = ? AND object_id = ?`, string(kind), id); err != nil {
			return 0, err
		}
		if _, err := t.exec(ctx, `DELETE FROM resources WHERE kind = ? AND id = ?`, string(kind), id); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}

// ids runs a query of one text column.
func (t *txn) ids(ctx context.Context, query string, args ...any) ([]string, error) {
	var out []string
	err := t.query(ctx, query, args, func(rows *sql.Rows) error {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		out = append(out, id)
		return nil
	})
	return out, err
}
