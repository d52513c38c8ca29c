package postgres

import (
	"context"
	"fmt"
	"strconv"
)

// The predicate-lock settings ctrl needs of the server, and the least it
// wants of each. PostgreSQL's defaults (64 and 2) make a serializable
// transaction that reads more than 2 rows of a heap page lock the whole
// page, and one that locks more than 32 pages of a table lock the table:
// placement batches and report chunks then conflict with nearly every
// concurrent write and fail to serialize over and over. Measured with
// bench/hollow (1,000 nodes, 200 commands/s, one replica): creates p99
// 2.3 s with the defaults, 150 ms with these (docs/operations.md,
// "PostgreSQL").
var predicateLockFloors = []struct {
	name  string
	least int64
	note  string
}{
	{"max_pred_locks_per_transaction", 1024, "a server restart applies it"},
	{"max_pred_locks_per_page", 16, "a reload applies it"},
}

// SettingAdvice reads the server's predicate-lock settings and returns,
// for each below what ctrl wants, a line saying what to set; none when
// all are. ctrl logs them at start.
func (s *Store) SettingAdvice(ctx context.Context) ([]string, error) {
	got := map[string]int64{}
	names := make([]string, len(predicateLockFloors))
	for i, f := range predicateLockFloors {
		names[i] = f.name
	}
	rows, err := s.pool.Query(ctx, `SELECT name, setting FROM pg_settings WHERE name = ANY($1)`, names)
	if err != nil {
		return nil, fmt.Errorf("store/postgres: read settings: %w", classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var name, setting string
		if err := rows.Scan(&name, &setting); err != nil {
			return nil, fmt.Errorf("store/postgres: read settings: %w", err)
		}
		v, err := strconv.ParseInt(setting, 10, 64)
		if err != nil {
			continue // not a number: nothing to advise on
		}
		got[name] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store/postgres: read settings: %w", classify(err))
	}
	return advice(got), nil
}

// advice is SettingAdvice's judgement of the settings read.
func advice(got map[string]int64) []string {
	var out []string
	for _, f := range predicateLockFloors {
		v, ok := got[f.name]
		if !ok || v >= f.least {
			continue
		}
		out = append(out, fmt.Sprintf("PostgreSQL %s is %d; set it to %d or more (%s): below that, concurrent serializable transactions fail to serialize far more often (docs/operations.md, \"PostgreSQL\")",
			f.name, v, f.least, f.note))
	}
	return out
}
