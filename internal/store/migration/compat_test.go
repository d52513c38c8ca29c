package migration

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestBreakingNamesChanges: every name in Breaking is a change of Changes.
func TestBreakingNamesChanges(t *testing.T) {
	names := map[string]bool{}
	for _, c := range Changes {
		names[c.Name] = true
	}
	for name, why := range Breaking {
		if !names[name] {
			t.Errorf("Breaking lists %s, which is not in Changes", name)
		}
		if why == "" {
			t.Errorf("Breaking %s does not say why", name)
		}
	}
}

func TestPlan(t *testing.T) {
	Breaking["plan_test_breaking"] = "test"
	t.Cleanup(func() { delete(Breaking, "plan_test_breaking") })
	ms := []Migration{
		{Version: 1, Name: "0001_a.sql"},
		{Version: 2, Name: "0002_plan_test_breaking.sql"},
		{Version: 3, Name: "0003_c.sql"},
	}
	set := func(vs ...int) map[int]bool {
		m := map[int]bool{}
		for _, v := range vs {
			m[v] = true
		}
		return m
	}
	names := func(ms []Migration) string {
		var s []string
		for _, m := range ms {
			s = append(s, m.Name)
		}
		return strings.Join(s, ",")
	}
	breaking := Compat{MinVersion: 2, Change: "plan_test_breaking"}
	for _, tc := range []struct {
		name    string
		applied map[int]bool
		rec     Compat
		pending string
		raise   *Compat
		tooOld  bool
		err     string
	}{
		{name: "empty database", applied: set(), pending: "0001_a.sql,0002_plan_test_breaking.sql,0003_c.sql"},
		{name: "up to date", applied: set(1, 2, 3), rec: breaking},
		{name: "older database", applied: set(1), pending: "0002_plan_test_breaking.sql,0003_c.sql"},
		{name: "breaking change applied before schema_compat", applied: set(1, 2), pending: "0003_c.sql", raise: &breaking},
		{name: "newer database, compatible", applied: set(1, 2, 3, 4, 5), rec: Compat{MinVersion: 3, Change: "c"}},
		{name: "newer database without a record", applied: set(1, 2, 3, 4)},
		{name: "database needs a newer binary", applied: set(1, 2, 3, 4), rec: Compat{MinVersion: 4, Change: "d"}, tooOld: true},
		{name: "empty database asking for more", applied: set(), rec: Compat{MinVersion: 9, Change: "x"}, tooOld: true},
		{name: "newer database missing a known version", applied: set(1, 3, 4), err: "lacks 0002_plan_test_breaking.sql"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pending, raise, err := Plan(SQLite, ms, tc.applied, tc.rec)
			var tooOld *TooOldError
			switch {
			case tc.tooOld:
				if !errors.As(err, &tooOld) || tooOld.Known != 3 || tooOld.Need != tc.rec {
					t.Fatalf("err = %v, want a TooOldError", err)
				}
				want := fmt.Sprintf("this kibotos-ctrl knows sqlite schema version 3, the database needs at least version %d (change %s): upgrade kibotos-ctrl", tc.rec.MinVersion, tc.rec.Change)
				if err.Error() != want {
					t.Errorf("message %q, want %q", err, want)
				}
				return
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if got := names(pending); got != tc.pending {
				t.Errorf("pending = %s, want %s", got, tc.pending)
			}
			if (raise == nil) != (tc.raise == nil) || raise != nil && *raise != *tc.raise {
				t.Errorf("raise = %v, want %v", raise, tc.raise)
			}
		})
	}
}
