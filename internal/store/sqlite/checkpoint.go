package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"time"
)

// Checkpoints. In WAL mode SQLite copies the log back into the database file (a
// checkpoint) when a COMMIT finds more than 1,000 pages in the log
// (wal_autocheckpoint): in the committing connection, before its COMMIT
// returns, with an fsync of the database file. Here that connection is
// the writer, so the batch committing, and every request queued behind
// it, waited for the checkpoint: with 100,000 Workspaces, COMMITs of
// 30–90 ms every few seconds and whole stalls of every write of 110–170
// ms (bench/results/2026-12-03-reload-off-pass.md). So the writer runs
// with wal_autocheckpoint(0), and the checkpointer, a goroutine with a
// connection of its own, runs a PASSIVE checkpoint every
// checkpointEvery: it copies what no reader still needs, waits for no
// one, and the writer goes on appending to the log meanwhile. The log is
// reused from its start once a checkpoint has copied all of it.
//
// When readers keep the log from being copied whole and it passes
// walLimitPages anyway, the checkpointer runs a RESTART checkpoint, which
// waits for the readers of the old log (Views last milliseconds) and
// holds the writer while it does: a bound on the log's size, at the cost
// of one stall.

const (
	// checkpointEvery is how often the checkpointer runs.
	checkpointEvery = time.Second
	// walLimitPages is the size of the log (in pages of 4 KiB: 256 MiB)
	// past which the checkpointer restarts it (RESTART) rather than
	// copying what it can (PASSIVE).
	walLimitPages = 64 << 10
)

// openCheckpointer opens the checkpointer's connection: neither the
// writer's nor a query_only reader's (a checkpoint writes the database
// file).
func openCheckpointer(path string, common url.Values) (*sql.DB, error) {
	db, err := sql.Open("sqlite", path+"?"+common.Encode())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	return db, nil
}

// checkpointLoop runs checkpoint every checkpointEvery until the store is
// closed, then closes s.cdb.
func (s *Store) checkpointLoop() {
	defer close(s.cdone)
	tick := time.NewTicker(checkpointEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-tick.C:
			// A failed checkpoint leaves the log to the next one.
			_, _ = s.checkpoint(context.Background(), false)
		}
	}
}

// walState is what a checkpoint reports: the pages in the log, and those
// of them copied into the database file.
type walState struct {
	logPages, copiedPages int64
}

// checkpoint runs one checkpoint on the checkpointer's connection:
// PASSIVE, or RESTART when restart or the log has passed walLimitPages.
func (s *Store) checkpoint(ctx context.Context, restart bool) (walState, error) {
	mode := "PASSIVE"
	if restart {
		mode = "RESTART"
	}
	var busy int64
	var st walState
	if err := s.cdb.QueryRowContext(ctx, "PRAGMA wal_checkpoint("+mode+")").Scan(&busy, &st.logPages, &st.copiedPages); err != nil {
		return st, fmt.Errorf("store/sqlite: checkpoint: %w", err)
	}
	if !restart && st.logPages > walLimitPages {
		return s.checkpoint(ctx, true)
	}
	return st, nil
}
