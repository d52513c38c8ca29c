package migration

import (
	"fmt"
	"io/fs"
	"strings"
)

// Dialect is a store dialect, a column of Changes.
type Dialect int

// The dialects.
const (
	SQLite Dialect = iota
	Postgres
)

func (d Dialect) String() string {
	switch d {
	case SQLite:
		return "sqlite"
	case Postgres:
		return "postgres"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Change is one schema change: its name (the file name between "NNNN_" and
// ".sql", alike in every dialect that has it) and the version each dialect
// records it under in schema_migrations, 0 where the dialect has no such
// change.
type Change struct {
	Name     string
	SQLite   int
	Postgres int
	// Why a change exists in one dialect only.
	Why string
}

// Version is the version d records c under, 0 when d has no such change.
func (c Change) Version(d Dialect) int {
	if d == Postgres {
		return c.Postgres
	}
	return c.SQLite
}

// Changes is every schema change, in the order every dialect applies them.
// The versions of one change differ between dialects because SQLite has a
// change of its own (resources_list_order), and they stay so: a database
// records the versions it applied, and migrating skips those versions, so a
// renumbered file would be skipped or run again on the databases already
// deployed (docs/operations.md, "Stores"). A new change takes the next
// version of each dialect that has it.
var Changes = []Change{
	{Name: "init", SQLite: 1, Postgres: 1},
	{Name: "workspaces", SQLite: 2, Postgres: 2},
	{Name: "resources_list_order", SQLite: 3,
		Why: "SQLite clusters a table by its primary key only, so resources was rebuilt in list order with its labels in the row; PostgreSQL lists through the resources_list index"},
	{Name: "pending_without_failed_placements", SQLite: 4, Postgres: 3},
	{Name: "node_cert_key", SQLite: 5, Postgres: 4},
	{Name: "denied_node_keys", SQLite: 6, Postgres: 5},
	{Name: "network", SQLite: 7, Postgres: 6},
	{Name: "expiration_deadline", SQLite: 8, Postgres: 7},
	{Name: "command_message", SQLite: 9, Postgres: 8},
	{Name: "workspace_usage", SQLite: 10, Postgres: 9},
	{Name: "workspace_cpu_template", SQLite: 11, Postgres: 10},
	{Name: "command_caller", SQLite: 12, Postgres: 11},
	{Name: "retention", SQLite: 13, Postgres: 12},
	{Name: "leases", SQLite: 14, Postgres: 13},
	{Name: "node_epoch", SQLite: 15, Postgres: 14},
}

// LoadDialect is Load, checking that the files are those Changes lists for
// d, with the same versions, in the same order.
func LoadDialect(d Dialect, fsys fs.FS, dir string) ([]Migration, error) {
	ms, err := Load(fsys, dir)
	if err != nil {
		return nil, err
	}
	if err := check(d, ms, Changes); err != nil {
		return nil, err
	}
	return ms, nil
}

// check compares the migrations of d with the changes of d in changes.
func check(d Dialect, ms []Migration, changes []Change) error {
	var want []string
	for _, c := range changes {
		if v := c.Version(d); v != 0 {
			want = append(want, fmt.Sprintf("%d %s", v, c.Name))
		}
	}
	got := make([]string, len(ms))
	for i, m := range ms {
		got[i] = fmt.Sprintf("%d %s", m.Version, m.Change())
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		return fmt.Errorf("%s migrations [%s] are not those migration.Changes lists [%s]",
			d, strings.Join(got, ", "), strings.Join(want, ", "))
	}
	return nil
}
