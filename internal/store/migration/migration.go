// Package migration loads the versioned SQL migrations each store dialect
// embeds (migrations/NNNN_name.sql) and holds Changes, the table of which
// version each dialect gives each schema change; applying them is the
// dialect's business.
package migration

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one NNNN_name.sql file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Change is the name of the change m applies: its file name between
// "NNNN_" and ".sql", as migration.Changes lists it.
func (m Migration) Change() string {
	_, name, _ := strings.Cut(strings.TrimSuffix(m.Name, ".sql"), "_")
	return name
}

// Load reads the .sql files of dir in fsys in version order. A name that
// does not start with a positive version and '_', and two files with one
// version, are errors.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var ms []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		prefix, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version and '_'", name)
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d", other, name, v)
		}
		seen[v] = name
		b, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}
