package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
)

// TestNodeUsageQueryPlan checks that NodeUsage reads only the covering
// index workspaces_node_usage: no document, no table row, whatever the
// number of Workspaces on the node.
func TestNodeUsageQueryPlan(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 2000 {
			w := &store.Workspace{ID: fmt.Sprintf("w%04d", i), CreatedAt: base, State: 3, NodeID: fmt.Sprintf("node-%d", i%3),
				Power: store.PowerRunning, MemoryMiB: 16, LayerBytes: 64 << 20, Doc: make([]byte, 2048)}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			writerExec(t, s, "ANALYZE")
		}
		plan := strings.Join(explainSQL(t, s, nodeUsageSQL, "node-1"), "; ")
		if !strings.Contains(plan, "USING COVERING INDEX workspaces_node_usage (node_id=?)") {
			t.Errorf("analyzed=%v: plan %q, want a search of the covering index workspaces_node_usage", analyzed, plan)
		}
	}
}

// TestMigrateWorkspaceUsage opens a database created at schema version 9
// with Workspaces in it: migration 10 fills memory_mib and layer_bytes of
// each from its document, which NodeUsage then sums; a document that does
// not decode asks nothing.
func TestMigrateWorkspaceUsage(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ctrl.db")
	doc := func(mib uint32, layer uint64) string {
		b, err := proto.Marshal(&ctrlv1.Workspace{Resources: &ctrlv1.Resources{MemoryMib: mib, CpuMillis: 100},
			WritableLayer: &ctrlv1.WritableLayer{CapacityBytes: layer}})
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("x'%x'", b)
	}
	insert := func(id, doc, node string, power store.Power, deleted string) string {
		return fmt.Sprintf(`INSERT INTO workspaces (id, created_at, updated_at, deleted_at, doc, state, guest_condition, node_id, power,
			force_stop, generation, command_id, observed_generation, observed_state, holds_execution)
			VALUES ('%s', 1, 1, %s, %s, 3, 0, '%s', %d, 0, 1, '', 1, 1, 1)`, id, deleted, doc, node, power)
	}
	createAtVersion(t, path, 9,
		insert("w1", doc(512, 1<<30), "node-a", store.PowerRunning, "NULL"),
		insert("w2", doc(256, 2<<30), "node-a", store.PowerStopped, "NULL"),
		insert("w3", "x'ff'", "node-a", store.PowerRunning, "NULL"),
		insert("w4", doc(1024, 4<<30), "node-a", store.PowerDeleted, "5"),
		insert("w5", doc(64, 8<<30), "node-b", store.PowerRunning, "NULL"))
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := map[string][2]uint64{"w1": {512, 1 << 30}, "w2": {256, 2 << 30}, "w3": {0, 0}, "w4": {1024, 4 << 30}, "w5": {64, 8 << 30}}
	if err := s.View(ctx, func(tx store.Tx) error {
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
		// Migration 11 fills cpu_millis too (TestMigrateWorkspaceCPUTemplate).
		if want := (store.NodeUsage{RunningMemoryMiB: 512, LayerBytes: 3 << 30, RunningCPUMillis: 100}); u != want {
			t.Errorf("NodeUsage(node-a) after migrating = %+v, want %+v", u, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
