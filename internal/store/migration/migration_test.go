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
