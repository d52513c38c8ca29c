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

// TestTemplateAndBlobQueryPlans checks, custom and generic, that
// CountWorkspacesWithTemplate is a scan of workspaces_template,
// and that BlobChunks is a scan of the primary key of artifact_chunks with
// no sort (its subquery a backward scan of the same index), whatever
// the tables hold.
func TestTemplateAndBlobQueryPlans(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 5000 {
			w := &store.Workspace{ID: fmt.Sprintf("w%04d", i), CreatedAt: base, State: 3, NodeID: "node-1",
				Power: store.PowerRunning, TemplateKey: fmt.Sprintf("t%d@1", i%50), Doc: make([]byte, 2048)}
			if i%7 == 0 {
				w.State, w.DeletedAt = store.WorkspaceStateDeleted, base
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		for b := range 50 {
			for c := range 40 {
				if err := tx.PutBlobChunk(ctx, fmt.Sprintf("blob-%d", b), uint64(c*1024), make([]byte, 1024)); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"workspaces", "artifact_chunks"} {
		if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []string{"custom", "generic"} {
		plan := explainSQL(t, s, templateCountSQL, []any{"t1@1"}, mode)
		// Index-only when VACUUM could mark the pages all-visible; a
		// bitmap scan of the same index when another session's snapshot
		// kept it from doing so (PostgreSQL shared with other tests).
		if !strings.Contains(plan, "Index Only Scan using workspaces_template") &&
			!strings.Contains(plan, "Bitmap Index Scan on workspaces_template") || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s: count plan\n%s\nwant a scan of workspaces_template", mode, plan)
		}
		plan = explainSQL(t, s, blobChunksSQL, []any{"blob-3", int64(5000), 4}, mode)
		if !strings.Contains(plan, "Index Scan using artifact_chunks_pkey on artifact_chunks") ||
			!strings.Contains(plan, "Scan Backward using artifact_chunks_pkey on artifact_chunks c") ||
			strings.Contains(plan, "Seq Scan") || hasSortNode(plan) {
			t.Errorf("%s: BlobChunks plan\n%s\nwant scans of artifact_chunks_pkey and no sort", mode, plan)
		}
	}
}

// TestMigrateWorkspaceCPUTemplate takes a store back to before migration 10
// (its columns, indexes and table dropped, its version forgotten) with
// Workspaces in it, and opens it again: the migration fills cpu_millis and
// template_key of each from its document, which NodeUsage and
// CountWorkspacesWithTemplate then read; a document that does not decode
// has neither.
func TestMigrateWorkspaceCPUTemplate(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	doc := func(cpu uint32, template, version string) []byte {
		pub := &ctrlv1.Workspace{Resources: &ctrlv1.Resources{MemoryMib: 128, CpuMillis: cpu}}
		if template != "" {
			pub.Template = &ctrlv1.TemplateRef{TemplateId: template, Version: version}
		}
		b, err := proto.Marshal(pub)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rows := []*store.Workspace{
		{ID: "w1", Doc: doc(1500, "default", "3"), NodeID: "node-a", Power: store.PowerRunning},
		{ID: "w2", Doc: doc(500, "default", "3"), NodeID: "node-a", Power: store.PowerStopped},
		{ID: "w3", Doc: []byte{0xff}, NodeID: "node-a", Power: store.PowerRunning},
		{ID: "w4", Doc: doc(4000, "default", "3"), NodeID: "node-a", Power: store.PowerDeleted, DeletedAt: base},
		{ID: "w5", Doc: doc(250, "python", ""), NodeID: "", Power: store.PowerRunning},
		{ID: "w6", Doc: doc(100, "", ""), NodeID: "node-a", Power: store.PowerRunning},
	}
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for _, w := range rows {
			w.CreatedAt, w.UpdatedAt, w.State, w.MemoryMiB = base, base, 3, 128
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `DROP INDEX workspaces_node_usage, workspaces_template;
		ALTER TABLE workspaces DROP COLUMN cpu_millis, DROP COLUMN template_key;
		CREATE INDEX workspaces_node_usage ON workspaces (node_id) INCLUDE (power, memory_mib, layer_bytes) WHERE deleted_at IS NULL;
		DROP TABLE artifact_chunks;
		DELETE FROM schema_migrations WHERE name = '0010_workspace_cpu_template.sql'`); err != nil {
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
	type cols struct {
		cpu      uint64
		template string
	}
	want := map[string]cols{"w1": {1500, "default@3"}, "w2": {500, "default@3"}, "w3": {0, ""},
		"w4": {4000, "default@3"}, "w5": {250, "python@"}, "w6": {100, ""}}
	if err := again.View(ctx, func(tx store.Tx) error {
		for id, c := range want {
			got, err := tx.GetWorkspace(ctx, id)
			if err != nil {
				return err
			}
			if got.CPUMillis != c.cpu || got.TemplateKey != c.template || got.MemoryMiB != 128 {
				t.Errorf("%s after migrating: cpu %d, template %q, memory %d; want %d, %q and the memory kept",
					id, got.CPUMillis, got.TemplateKey, got.MemoryMiB, c.cpu, c.template)
			}
		}
		u, err := tx.NodeUsage(ctx, "node-a")
		if err != nil {
			return err
		}
		if want := (store.NodeUsage{RunningMemoryMiB: 3 * 128, RunningCPUMillis: 1600}); u != want {
			t.Errorf("NodeUsage(node-a) after migrating = %+v, want %+v", u, want)
		}
		for key, n := range map[string]int{"default@3": 2, "python@": 1, "": 2} {
			if got, err := tx.CountWorkspacesWithTemplate(ctx, key); err != nil || got != n {
				t.Errorf("CountWorkspacesWithTemplate(%q) after migrating = %d, %v; want %d", key, got, err, n)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
