package postgres

import (
	"strings"
	"testing"
)

// TestAdvice: a line for each predicate-lock setting below ctrl's floor,
// none for one at or above it or not read.
func TestAdvice(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  map[string]int64
		want []string // the settings advised on
	}{
		{"defaults", map[string]int64{"max_pred_locks_per_transaction": 64, "max_pred_locks_per_page": 2},
			[]string{"max_pred_locks_per_transaction", "max_pred_locks_per_page"}},
		{"floors", map[string]int64{"max_pred_locks_per_transaction": 1024, "max_pred_locks_per_page": 16}, nil},
		{"one below", map[string]int64{"max_pred_locks_per_transaction": 4096, "max_pred_locks_per_page": 15},
			[]string{"max_pred_locks_per_page"}},
		{"not read", map[string]int64{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := advice(tc.got)
			if len(lines) != len(tc.want) {
				t.Fatalf("advice = %q, want lines for %v", lines, tc.want)
			}
			for i, name := range tc.want {
				if !strings.HasPrefix(lines[i], "PostgreSQL "+name+" is ") {
					t.Errorf("line %d = %q, want one for %s", i, lines[i], name)
				}
			}
		})
	}
}

// TestSettingAdvice reads the test server's settings.
func TestSettingAdvice(t *testing.T) {
	s := openTest(t)
	lines, err := s.SettingAdvice(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("advice for the test server: %q", lines)
}
