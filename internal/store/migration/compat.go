package migration

import (
	"fmt"
	"strings"
)

// Breaking lists, by Change name, the schema changes a binary that does not
// know them cannot work with, and why: once one is applied, a binary whose
// newest migration is older than it refuses to start on the database. Every
// other change is additive: a binary that predates it runs on the migrated
// database as it did before (it ignores the new tables and columns, whose
// defaults stand for what it writes), which is what lets the previous release
// keep serving during a rolling upgrade (docs/operations.md, "Upgrades").
//
// A change belongs here when an older binary's writes would leave the new
// schema wrong for the newer binaries (a query column it does not fill, a
// table it does not keep up to date) or when an older binary would ignore a
// refusal the change records. Mark a new change here only when it cannot be
// made additive: it stops rolling upgrades across it.
var Breaking = map[string]string{
	"resources_list_order":   "resources gained a labels column that the resource writes of earlier binaries do not fill, and lists read it",
	"node_cert_key":          "earlier binaries enroll nodes without recording the key of the certificate they issue, so re-enrollment would no longer shut out the replaced machine",
	"denied_node_keys":       "earlier binaries do not read denied_node_keys and would let denied node certificates connect and renew",
	"workspace_usage":        "earlier binaries store Workspaces without memory_mib and layer_bytes, which placement sums",
	"workspace_cpu_template": "earlier binaries store Workspaces without cpu_millis and template_key, which placement sums and template deletion checks",
}

// Breaks reports whether m is a breaking change (listed in Breaking).
func (m Migration) Breaks() bool {
	_, ok := Breaking[m.Change()]
	return ok
}

// Compat is what a database records of its compatibility (the schema_compat
// table of every dialect): the version of the newest breaking change applied
// to it, which every binary using it must know, and that change's name. The
// zero Compat (no row) asks nothing.
type Compat struct {
	MinVersion int
	Change     string
}

// TooOldError is the refusal of a binary whose newest migration is older
// than the database's Compat.
type TooOldError struct {
	Dialect Dialect
	Known   int // the binary's newest migration
	Need    Compat
}

func (e *TooOldError) Error() string {
	return fmt.Sprintf("this kibotos-ctrl knows %s schema version %d, the database needs at least version %d (change %s): upgrade kibotos-ctrl",
		e.Dialect, e.Known, e.Need.MinVersion, e.Need.Change)
}

// Plan decides what a binary whose migrations are ms (in version order, of
// dialect d) does with a database that has applied the versions in applied
// and records rec:
//
//   - it refuses with a *TooOldError when rec asks for a version newer than
//     its newest migration;
//   - when the database has applied a version the binary does not know (a
//     newer binary migrated it, compatibly), it applies nothing: pending is
//     empty, and every migration the binary knows must have been applied;
//   - otherwise pending are the migrations not applied yet, in order.
//
// raise, when not nil, is the Compat to record before applying pending, for
// the breaking changes already applied that rec does not cover (databases
// migrated before schema_compat existed); each pending migration that Breaks
// raises the record itself, in its own transaction.
func Plan(d Dialect, ms []Migration, applied map[int]bool, rec Compat) (pending []Migration, raise *Compat, err error) {
	known := 0
	if len(ms) > 0 {
		known = ms[len(ms)-1].Version
	}
	if rec.MinVersion > known {
		return nil, nil, &TooOldError{Dialect: d, Known: known, Need: rec}
	}
	newest := 0
	for v := range applied {
		newest = max(newest, v)
	}
	if newest > known {
		var missing []string
		for _, m := range ms {
			if !applied[m.Version] {
				missing = append(missing, m.Name)
			}
		}
		if len(missing) > 0 {
			return nil, nil, fmt.Errorf("the database has %s schema version %d, newer than this kibotos-ctrl knows (%d), but lacks %s, which it knows: it was migrated by a binary with other migrations",
				d, newest, known, strings.Join(missing, ", "))
		}
		return nil, nil, nil
	}
	need := rec
	for _, m := range ms {
		if !applied[m.Version] {
			pending = append(pending, m)
		} else if m.Breaks() && m.Version > need.MinVersion {
			need = Compat{MinVersion: m.Version, Change: m.Change()}
		}
	}
	if need != rec {
		raise = &need
	}
	return pending, raise, nil
}
