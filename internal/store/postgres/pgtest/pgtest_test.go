package pgtest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

func TestWithSearchPath(t *testing.T) {
	for _, base := range []string{
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
		"postgresql://u:p@db/test?search_path=other&pool_max_conns=4",
		"host=127.0.0.1 user=postgres dbname=test sslmode=disable",
		"host=db search_path=other",
	} {
		s, err := withSearchPath(base, "kibotos_test_x")
		if err != nil {
			t.Errorf("withSearchPath(%q): %v", base, err)
			continue
		}
		cfg, err := pgxpool.ParseConfig(s)
		if err != nil {
			t.Errorf("withSearchPath(%q) = %q: %v", base, s, err)
			continue
		}
		if got := cfg.ConnConfig.RuntimeParams["search_path"]; got != "kibotos_test_x" {
			t.Errorf("withSearchPath(%q) = %q: search_path %q", base, s, got)
		}
	}
}
