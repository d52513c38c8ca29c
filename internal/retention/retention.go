// Package retention prunes what ctrl keeps only for a while: completed
// command records (the idempotency records of command IDs) and the rows of
// Workspaces and Volumes whose deletion completed, once they are older than
// the configured retention (kibotos-ctrl --command-retention and
// --deleted-retention, at least MinRetention). A pass runs every Interval,
// each in batches of Batch rows, one transaction a batch, until a batch
// comes back short. Every replica runs its own loop, but only the holder
// of the fleet lease prunes (Pruner.Leader), and each batch's transaction
// checks it still holds it (Pruner.Fence); the deletes are idempotent
// anyway, so two passes at once would delete each row once.
package retention

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// MinRetention is the shortest retention: a command ID resent after its
// record was pruned executes again as a new command, so a record must
// outlive every retry a caller may still send.
const MinRetention = 24 * time.Hour

// DefaultRetention is the retention of both flags by default.
const DefaultRetention = 7 * 24 * time.Hour

// Defaults of Pruner.
const (
	DefaultInterval = time.Minute
	DefaultBatch    = 1000
)

// Check refuses a retention shorter than MinRetention, naming flag.
func Check(flag string, d time.Duration) error {
	if d < MinRetention {
		return fmt.Errorf("--%s %v is shorter than the minimum of %v: a command ID resent after its record is pruned executes again as a new command, so records are kept at least that long", flag, d, MinRetention)
	}
	return nil
}

// Pruner is the pruning loop of one ctrl.
type Pruner struct {
	Store store.Store
	// Commands is how long a completed command record is kept after it
	// completed; zero is DefaultRetention.
	Commands time.Duration
	// Deleted is how long a Workspace or Volume is kept after its deletion
	// completed; zero is DefaultRetention.
	Deleted time.Duration
	// KeepMethods are the methods whose command records are never pruned
	// (records other records are found from).
	KeepMethods []string
	// DeletedKinds are the resource kinds that hold only deleted objects
	// (volume.KindDeleted), pruned by their last update.
	DeletedKinds []store.ResourceKind
	// Interval is the time between passes (zero: DefaultInterval); Batch
	// the rows of one transaction (zero: DefaultBatch).
	Interval time.Duration
	Batch    int
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	Log *slog.Logger
	// Leader, when set, reports whether this replica holds the fleet
	// lease (internal/lease): only then does a pass prune, asking before
	// each batch. Nil: always (one ctrl).
	Leader func() bool
	// Fence, when set, is called inside each batch's transaction before
	// it deletes (lease.Keeper.Check): an error — the lease moved to
	// another replica — rolls the batch back and ends the pass. Nil: no
	// check (one ctrl).
	Fence func(ctx context.Context, tx store.Tx) error
}

func (p *Pruner) leads() bool { return p.Leader == nil || p.Leader() }

// Counts is what one pass deleted.
type Counts struct {
	Commands, Workspaces, Resources int
}

// Validate checks the retentions (zero is the default).
func (p *Pruner) Validate() error {
	if p.Commands != 0 {
		if err := Check("command-retention", p.Commands); err != nil {
			return err
		}
	}
	if p.Deleted != 0 {
		return Check("deleted-retention", p.Deleted)
	}
	return nil
}

func orDefault[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// Run runs a pass at once and then every Interval until ctx is done. A
// failed pass is logged and tried again at the next.
func (p *Pruner) Run(ctx context.Context) error {
	tick := time.NewTicker(orDefault(p.Interval, DefaultInterval))
	defer tick.Stop()
	for {
		c, err := p.Pass(ctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			p.log().WarnContext(ctx, "retention pass failed", "error", err.Error())
		case c != Counts{}:
			p.log().InfoContext(ctx, "retention pass", "commands", c.Commands, "workspaces", c.Workspaces, "volumes", c.Resources)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (p *Pruner) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Log
}

// Pass prunes everything due now, batch by batch; with Leader set, only
// while this replica holds the fleet lease.
func (p *Pruner) Pass(ctx context.Context) (Counts, error) {
	now := time.Now()
	if p.Now != nil {
		now = p.Now()
	}
	commandsBefore := now.Add(-orDefault(p.Commands, DefaultRetention))
	deletedBefore := now.Add(-orDefault(p.Deleted, DefaultRetention))
	var c Counts
	var err error
	if c.Commands, err = p.drain(ctx, func(ctx context.Context, tx store.Tx, limit int) (int, error) {
		return tx.PruneCommands(ctx, commandsBefore, p.KeepMethods, limit)
	}); err != nil {
		return c, fmt.Errorf("commands: %w", err)
	}
	if c.Workspaces, err = p.drain(ctx, func(ctx context.Context, tx store.Tx, limit int) (int, error) {
		return tx.PruneDeletedWorkspaces(ctx, deletedBefore, limit)
	}); err != nil {
		return c, fmt.Errorf("workspaces: %w", err)
	}
	for _, kind := range p.DeletedKinds {
		n, err := p.drain(ctx, func(ctx context.Context, tx store.Tx, limit int) (int, error) {
			return tx.PruneResources(ctx, kind, deletedBefore, limit)
		})
		c.Resources += n
		if err != nil {
			return c, fmt.Errorf("%s: %w", kind, err)
		}
	}
	return c, nil
}

// drain runs batch in one transaction after another until a batch deletes
// fewer rows than its limit.
func (p *Pruner) drain(ctx context.Context, batch func(ctx context.Context, tx store.Tx, limit int) (int, error)) (int, error) {
	limit := orDefault(p.Batch, DefaultBatch)
	total := 0
	for {
		if !p.leads() {
			return total, nil // not the fleet lease's holder: its pass prunes
		}
		var n int
		fenced := false
		err := p.Store.InTx(ctx, func(tx store.Tx) (err error) {
			n, fenced = 0, false
			if p.Fence != nil {
				if err := p.Fence(ctx, tx); err != nil {
					fenced = true
					return err
				}
			}
			n, err = batch(ctx, tx, limit)
			return err
		})
		if fenced {
			return total, nil // the lease moved on: its holder prunes
		}
		if err != nil {
			return total, err
		}
		total += n
		if n < limit || ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
