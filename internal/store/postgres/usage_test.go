package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
)

// TestNodeUsageQueryPlan checks that NodeUsage is an index-only scan of
// workspaces_node_usage, custom and generic: it reads no document, whatever
// the number of Workspaces on the node.
func TestNodeUsageQueryPlan(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 5000 {
			w := &store.Workspace{ID: fmt.Sprintf("w%04d", i), CreatedAt: base, State: 3, NodeID: fmt.Sprintf("node-%d", i%50),
				Power: store.PowerRunning, MemoryMiB: 16, LayerBytes: 64 << 20, Doc: make([]byte, 2048)}
			if i%7 == 0 {
				w.State, w.DeletedAt = store.WorkspaceStateDeleted, base
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE workspaces"); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"custom", "generic"} {
		plan := explainSQL(t, s, nodeUsageSQL, []any{"node-1"}, mode)
		if !strings.Contains(plan, "Index Only Scan using workspaces_node_usage") {
			t.Errorf("%s: plan\n%s\nwant an index-only scan of workspaces_node_usage", mode, plan)
		}
	}
}

// TestMigrateWorkspaceUsage takes a store back to before migration 9 (its
// columns and index dropped, its version forgotten) with Workspaces in it,
// and opens it again: the migration fills memory_mib and layer_bytes of
// each from its document, which NodeUsage then sums; a document that does
// not decode asks nothing.
func TestMigrateWorkspaceUsage(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	doc := func(mib uint32, layer uint64) []byte {
		b, err := proto.Marshal(&ctrlv1.Workspace{Resources: &ctrlv1.Resources{MemoryMib: mib, CpuMillis: 100},
			WritableLayer: &ctrlv1.WritableLayer{CapacityBytes: layer}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rows := []*store.Workspace{
		{ID: "w1", Doc: doc(512, 1<<30), NodeID: "node-a", Power: store.PowerRunning},
		{ID: "w2", Doc: doc(256, 2<<30), NodeID: "node-a", Power: store.PowerStopped},
		{ID: "w3", Doc: []byte{0xff}, NodeID: "node-a", Power: store.PowerRunning},
		{ID: "w4", Doc: doc(1024, 4<<30), NodeID: "node-a", Power: store.PowerDeleted, DeletedAt: base},
		{ID: "w5", Doc: doc(64, 8<<30), NodeID: "node-b", Power: store.PowerRunning},
	}
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for _, w := range rows {
			w.CreatedAt, w.UpdatedAt, w.State = base, base, 3
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `DROP INDEX workspaces_node_usage;
		ALTER TABLE workspaces DROP COLUMN memory_mib, DROP COLUMN layer_bytes;
		DELETE FROM schema_migrations WHERE name = '0009_workspace_usage.sql'`); err != nil {
		t.Fatal(err)
	}
	var schema string
	if err := s.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cfg := s.pool.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	again, err := openConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	want := map[string][2]uint64{"w1": {512, 1 << 30}, "w2": {256, 2 << 30}, "w3": {0, 0}, "w4": {1024, 4 << 30}, "w5": {64, 8 << 30}}
	if err := again.View(ctx, func(tx store.Tx) error {
		for id, w := range want {
			got, err := tx.GetWorkspace(ctx, id)
			if err != nil {
				return err
			}
			if got.MemoryMiB != w[0] || got.LayerBytes != w[1] {
				t.Errorf("%s after migrating: memory %d MiB, layer %d; want %d and %d", id, got.MemoryMiB, got.LayerBytes, w[0], w[1])
			}
		}
		u, err := tx.NodeUsage(ctx, "node-a")
		if err != nil {
			return err
		}
		if want := (store.NodeUsage{RunningMemoryMiB: 512, LayerBytes: 3 << 30}); u != want {
			t.Errorf("NodeUsage(node-a) after migrating = %+v, want %+v", u, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
