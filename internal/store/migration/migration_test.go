package migration

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoad(t *testing.T) {
	ms, err := Load(fstest.MapFS{
		"m/0002_b.sql": {Data: []byte("B")},
		"m/0001_a.sql": {Data: []byte("A")},
		"m/README":     {Data: []byte("ignored")},
		"m/10_c.sql":   {Data: []byte("C")},
	}, "m")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.Name+"="+m.SQL)
	}
	if strings.Join(got, ",") != "0001_a.sql=A,0002_b.sql=B,10_c.sql=C" || ms[2].Version != 10 {
		t.Errorf("Load = %v", ms)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"no version":     {"m/a.sql": {}},
		"zero version":   {"m/0000_a.sql": {}},
		"shared version": {"m/0001_a.sql": {}, "m/1_b.sql": {}},
	} {
		if _, err := Load(fsys, "m"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestChanges checks the table itself: every change is in some dialect, a
// change in one dialect only says why, and each dialect's versions increase
// along the table, so that the dialects apply their common changes in the
// same order.
func TestChanges(t *testing.T) {
	names := map[string]bool{}
	last := map[Dialect]int{}
	for _, c := range Changes {
		if names[c.Name] {
			t.Errorf("change %s listed twice", c.Name)
		}
		names[c.Name] = true
		var in []Dialect
		for _, d := range []Dialect{SQLite, Postgres} {
			v := c.Version(d)
			if v == 0 {
				continue
			}
			in = append(in, d)
			if v <= last[d] {
				t.Errorf("change %s: %s version %d does not follow %d", c.Name, d, v, last[d])
			}
			last[d] = v
		}
		switch {
		case len(in) == 0:
			t.Errorf("change %s is in no dialect", c.Name)
		case len(in) == 1 && c.Why == "":
			t.Errorf("change %s is in %s only and does not say why", c.Name, in[0])
		case len(in) > 1 && c.Why != "":
			t.Errorf("change %s is in every dialect but has a Why", c.Name)
		}
	}
}

func TestLoadDialect(t *testing.T) {
	changes := []Change{
		{Name: "a", SQLite: 1, Postgres: 1},
		{Name: "b", SQLite: 2, Why: "x"},
		{Name: "c", SQLite: 3, Postgres: 2},
	}
	for _, tc := range []struct {
		name  string
		d     Dialect
		files []string
		ok    bool
	}{
		{"sqlite", SQLite, []string{"0001_a.sql", "0002_b.sql", "0003_c.sql"}, true},
		{"postgres", Postgres, []string{"0001_a.sql", "0002_c.sql"}, true},
		{"renumbered", Postgres, []string{"0001_a.sql", "0003_c.sql"}, false},
		{"renamed", Postgres, []string{"0001_a.sql", "0002_d.sql"}, false},
		{"missing", SQLite, []string{"0001_a.sql", "0003_c.sql"}, false},
		{"not listed", Postgres, []string{"0001_a.sql", "0002_c.sql", "0003_d.sql"}, false},
		{"other order", Postgres, []string{"0001_c.sql", "0002_a.sql"}, false},
	} {
		fsys := fstest.MapFS{}
		for _, f := range tc.files {
			fsys["m/"+f] = &fstest.MapFile{}
		}
		ms, err := Load(fsys, "m")
		if err != nil {
			t.Fatal(err)
		}
		if err := check(tc.d, ms, changes); (err == nil) != tc.ok {
			t.Errorf("%s: check(%s, %v) = %v, want ok %v", tc.name, tc.d, tc.files, err, tc.ok)
		}
	}
}
