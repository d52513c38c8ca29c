// Package expiration is ctrl's expiration engine: it fires the armed
// expiration deadlines of Workspaces as the commands ctrl starts itself
// (workspace.Service.FireExpiration: `expiration/<workspace>/<expiration
// revision>`, initiator EXPIRATION).
//
// The store is the only authority. Armed deadlines live in an indexed
// column of the workspaces table (store.WorkspaceTx.DueExpirations,
// NextExpiration), which workspace.Save keeps equal to each Workspace's
// document; the engine keeps nothing it needs across a restart. It sleeps
// until the earliest deadline, or until an admission that may arm one
// notifies workspace.ExpirationTopic (on any replica: the PostgreSQL store
// carries notifications between them), or at most Recheck (so that a
// deadline whose notification was lost is seen within it); each wake
// reads the due deadlines and the next one from the index, so an idle
// engine costs the same whatever the number of armed deadlines.
//
// Firing once is the store's guarantee, not the engine's: each firing is a
// transaction that checks the deadline is due and still armed at its
// revision, moves the revision, and inserts the command under its
// deterministic ID (unique). Any number of engines (replicas, a ctrl
// restarted mid-firing) may try the same deadline; one fires it. With
// several replicas only the holder of the fleet lease runs the engine
// (Engine.Leader), so the others do not even try.
package expiration

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// pageSize is how many due deadlines one read returns.
const pageSize = 256

// DefaultWorkers is how many firings run at once by default: firings are
// short transactions, and concurrent ones share the SQLite store's group
// commit.
const DefaultWorkers = 8

// Engine fires due expirations.
type Engine struct {
	// Store holds the armed deadlines; its Notifier wakes the engine.
	Store store.Store
	// Fire carries out the expiration of one Workspace if it is armed and
	// due (workspace.Service.FireExpiration).
	Fire func(ctx context.Context, workspaceID string) (workspace.Firing, string, error)
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Log receives a line per firing and per failure; nil discards.
	Log *slog.Logger
	// Recheck is the longest sleep without a notification
	// (store.RecheckInterval by default): what was armed with a lost
	// notification, and a Workspace whose state had to settle, are looked
	// at again within it.
	Recheck time.Duration
	// Workers is how many firings run at once (DefaultWorkers when 0).
	Workers int
	// Leader, when set, reports whether this replica holds the fleet
	// lease (internal/lease): only then does the engine fire, asking
	// before each page of due deadlines; otherwise it looks again every
	// LeaderRecheck. Nil: always (one ctrl).
	Leader func() bool
}

// LeaderRecheck is how often an engine without the fleet lease looks
// whether it got it.
const LeaderRecheck = time.Second

func (e *Engine) leads() bool { return e.Leader == nil || e.Leader() }

func (e *Engine) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

func (e *Engine) recheck() time.Duration {
	if e.Recheck > 0 {
		return e.Recheck
	}
	return store.RecheckInterval
}

func (e *Engine) log() *slog.Logger {
	if e.Log != nil {
		return e.Log
	}
	return slog.New(slog.DiscardHandler)
}

// Run fires due expirations until ctx is done.
func (e *Engine) Run(ctx context.Context) error {
	// waiting holds the Workspaces whose due expiration waits for their
	// state to settle, and when to try each again: a hint that spares
	// retrying them on every notification, never the authority.
	waiting := map[string]time.Time{}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		// Subscribe before reading: a deadline armed after the read
		// cannot be missed.
		changed, release := e.Store.Subscribe(workspace.ExpirationTopic)
		wake, err := e.pass(ctx, waiting)
		if err != nil {
			if ctx.Err() != nil {
				release()
				return nil
			}
			e.log().Warn("expiration pass failed", "error", err.Error())
			wake = e.now().Add(e.recheck())
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(time.Until(wake), 0))
		select {
		case <-ctx.Done():
			release()
			return nil
		case <-changed:
		case <-timer.C:
		}
		release()
	}
}

// pass fires every due expiration not waiting for a retry and returns when
// the engine must look again: the next deadline, a retry, or Recheck.
func (e *Engine) pass(ctx context.Context, waiting map[string]time.Time) (time.Time, error) {
	now := e.now()
	if !e.leads() {
		return now.Add(min(LeaderRecheck, e.recheck())), nil
	}
	wake := now.Add(e.recheck())
	seen := map[string]bool{}
	var after *store.ArmedExpiration
	for {
		var page []store.ArmedExpiration
		if err := e.Store.View(ctx, func(tx store.Tx) error {
			var err error
			page, err = tx.DueExpirations(ctx, now, after, pageSize)
			return err
		}); err != nil {
			return wake, err
		}
		var due []store.ArmedExpiration
		for _, x := range page {
			seen[x.WorkspaceID] = true
			if retry, ok := waiting[x.WorkspaceID]; ok && now.Before(retry) {
				wake = minTime(wake, retry)
				continue
			}
			due = append(due, x)
		}
		if !e.leads() {
			return now.Add(min(LeaderRecheck, e.recheck())), nil // the lease moved on
		}
		e.fireAll(ctx, now, due, waiting)
		for _, x := range due {
			if retry, ok := waiting[x.WorkspaceID]; ok {
				wake = minTime(wake, retry)
			}
		}
		if len(page) < pageSize {
			break
		}
		after = &page[len(page)-1]
	}
	for id := range waiting {
		if !seen[id] {
			delete(waiting, id) // no longer due: cleared, moved or fired elsewhere
		}
	}
	var (
		next time.Time
		ok   bool
	)
	if err := e.Store.View(ctx, func(tx store.Tx) error {
		var err error
		next, ok, err = tx.NextExpiration(ctx, now)
		return err
	}); err != nil {
		return wake, err
	}
	if ok {
		wake = minTime(wake, next)
	}
	return wake, nil
}

// fireAll fires due with at most Workers at once and records in waiting
// the Workspaces whose state must settle first.
func (e *Engine) fireAll(ctx context.Context, now time.Time, due []store.ArmedExpiration, waiting map[string]time.Time) {
	if len(due) == 0 {
		return
	}
	n := e.Workers
	if n <= 0 {
		n = DefaultWorkers
	}
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, n)
	)
	for _, x := range due {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			firing, id, err := e.Fire(ctx, x.WorkspaceID)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				if ctx.Err() == nil {
					e.log().Warn("expiration firing failed", "workspace_id", x.WorkspaceID, "error", err.Error())
				}
				waiting[x.WorkspaceID] = now.Add(e.recheck())
			case firing == workspace.FiringWaits:
				waiting[x.WorkspaceID] = now.Add(e.recheck())
			default:
				delete(waiting, x.WorkspaceID)
				if id != "" {
					e.log().Info("expiration fired", "workspace_id", x.WorkspaceID, "command_id", id, "firing", firing.String(),
						"deadline", x.Deadline, "late_ms", float64(e.now().Sub(x.Deadline).Microseconds())/1000)
				}
			}
		}()
	}
	wg.Wait()
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
