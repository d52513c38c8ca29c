package rowcodec

import (
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/store"
)

// TestArgsMatchColumns checks that every Args function returns one value per
// column of the list it goes with.
func TestArgsMatchColumns(t *testing.T) {
	count := func(columns string) int { return len(strings.Split(columns, ",")) }
	ws, err := WorkspaceArgs(&store.Workspace{})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := NodeArgs(&store.Node{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		args, columns int
	}{
		{"CommandArgs", len(CommandArgs(&store.Command{})), count(CommandColumns)},
		{"CommandUpdateArgs", len(CommandUpdateArgs(&store.Command{})), 5},
		{"WorkspaceArgs", len(ws), len(WorkspaceMutable)},
		{"WorkspaceColumns", count(WorkspaceColumns), 2 + len(WorkspaceMutable)}, // id, created_at
		{"NodeArgs", len(nodes), count(NodeColumns)},
		{"ResourceColumnsWithLabels", count(ResourceColumnsWithLabels), count(ResourceColumns) + 1},
	} {
		if tc.args != tc.columns {
			t.Errorf("%s: %d values for %d columns", tc.name, tc.args, tc.columns)
		}
	}
}

func TestU2I(t *testing.T) {
	if v, err := U2I("revision", 1<<63-1); err != nil || v != 1<<63-1 {
		t.Errorf("U2I(MaxInt64) = %d, %v", v, err)
	}
	if _, err := U2I("revision", 1<<63); err == nil {
		t.Error("U2I(MaxInt64+1): no error")
	}
}
