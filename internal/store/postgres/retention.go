package postgres

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// PruneCommands implements store.Tx: one DELETE of the oldest completed
// commands, found by a range scan of the commands_completed partial index,
// each checked against the workspaces_command partial index. SKIP LOCKED
// leaves a row another replica's pass is deleting to that pass.
func (t *txn) PruneCommands(ctx context.Context, before time.Time, keep []string, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	if keep == nil {
		keep = []string{}
	}
	tag, err := t.exec(ctx, `DELETE FROM commands WHERE command_id IN (
		SELECT c.command_id FROM commands c
		WHERE c.status = `+strconv.Itoa(int(store.CommandCompleted))+` AND c.completed_at < $1
			AND NOT (c.method = ANY($2))
			AND NOT EXISTS (SELECT 1 FROM workspaces w WHERE w.command_id = c.command_id AND w.command_id != '')
		ORDER BY c.completed_at LIMIT $3
		FOR UPDATE SKIP LOCKED)`, rowcodec.Micros(before), keep, limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// PruneDeletedWorkspaces implements store.Tx: the oldest deletions, found
// by a range scan of the workspaces_deleted partial index, then their
// labels, references and rows, one statement each.
func (t *txn) PruneDeletedWorkspaces(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	ids, err := t.ids(ctx, `SELECT id FROM workspaces WHERE deleted_at IS NOT NULL AND deleted_at < $1
		ORDER BY deleted_at LIMIT $2 FOR UPDATE SKIP LOCKED`, rowcodec.Micros(before), limit)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	if _, err := t.exec(ctx, `DELETE FROM labels WHERE kind = $1 AND object_id = ANY($2)`, string(store.KindWorkspace), ids); err != nil {
		return 0, err
	}
	if _, err := t.exec(ctx, `DELETE FROM refs WHERE workspace_id = ANY($1)`, ids); err != nil {
		return 0, err
	}
	tag, err := t.exec(ctx, `DELETE FROM workspaces WHERE id = ANY($1)`, ids)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// PruneResources implements store.Tx: the resources of kind last updated
// before before, then their labels and rows.
func (t *txn) PruneResources(ctx context.Context, kind store.ResourceKind, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	ids, err := t.ids(ctx, `SELECT id FROM resources WHERE kind = $1 AND updated_at < $2
		ORDER BY updated_at, id LIMIT $3 FOR UPDATE SKIP LOCKED`, string(kind), rowcodec.Micros(before), limit)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	if _, err := t.exec(ctx, `DELETE FROM labels WHERE kind = $1 AND object_id = ANY($2)`, string(kind), ids); err != nil {
		return 0, err
	}
	tag, err := t.exec(ctx, `DELETE FROM resources WHERE kind = $1 AND id = ANY($2)`, string(kind), ids)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// ids runs a query of one text column.
func (t *txn) ids(ctx context.Context, sql string, args ...any) ([]string, error) {
	var out []string
	err := t.query(ctx, sql, args, func(rows pgx.Rows) error {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		out = append(out, id)
		return nil
	})
	return out, err
}
