package store

import (
	"context"
	"time"
)

// RetentionTx are the pruning operations of a transaction (internal/
// retention). Each deletes at most limit rows of its kind, oldest first,
// and returns how many it deleted; a limit of 0 or less deletes nothing.
// Deleting is idempotent: two replicas pruning at once delete each row
// once, and a row already gone is no error.
type RetentionTx interface {
	// PruneCommands deletes completed commands whose CompletedAt is before
	// before. It never deletes a command still PROCESSING, one whose
	// Method is in keep, nor one a Workspace names as its CommandID.
	PruneCommands(ctx context.Context, before time.Time, keep []string, limit int) (int, error)
	// PruneDeletedWorkspaces deletes Workspaces whose deletion completed
	// (DeletedAt set) before before, with their labels and references.
	PruneDeletedWorkspaces(ctx context.Context, before time.Time, limit int) (int, error)
	// PruneResources deletes resources of kind whose UpdatedAt is before
	// before, with their labels.
	PruneResources(ctx context.Context, kind ResourceKind, before time.Time, limit int) (int, error)
}
