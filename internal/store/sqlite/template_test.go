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

// TestTemplateAndBlobQueryPlans checks that CountWorkspacesWithTemplate
// reads only the covering index workspaces_template, and that BlobChunks is
// a range search of the primary key of artifact_chunks (its subquery a
// search of the same covering index), whatever the table holds.
func TestTemplateAndBlobQueryPlans(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 2000 {
			w := &store.Workspace{ID: fmt.Sprintf("w%04d", i), CreatedAt: base, State: 3, NodeID: "node-1",
				Power: store.PowerRunning, TemplateKey: fmt.Sprintf("t%d@1", i%5), Doc: make([]byte, 2048)}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		for b := range 20 {
			for c := range 20 {
				if err := tx.PutBlobChunk(ctx, fmt.Sprintf("blob-%d", b), uint64(c*1024), make([]byte, 1024)); err != nil {
					return err
				}
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
		plan := strings.Join(explainSQL(t, s, templateCountSQL, "t1@1"), "; ")
		if !strings.Contains(plan, "USING COVERING INDEX workspaces_template (template_key=?") {
			t.Errorf("analyzed=%v: count plan %q, want a search of the covering index workspaces_template", analyzed, plan)
		}
		plan = strings.Join(explainSQL(t, s, blobChunksSQL, "blob-3", 5000, 4), "; ")
		if !strings.Contains(plan, "SEARCH artifact_chunks USING INDEX sqlite_autoindex_artifact_chunks_1 (blob_id=? AND start_offset>?)") ||
			!strings.Contains(plan, "SEARCH c USING COVERING INDEX sqlite_autoindex_artifact_chunks_1 (blob_id=? AND start_offset<?)") ||
			strings.Contains(plan, "SCAN") || strings.Contains(plan, "TEMP B-TREE") {
			t.Errorf("analyzed=%v: BlobChunks plan %q, want range searches of the primary key, no sort", analyzed, plan)
		}
	}
}

// TestMigrateWorkspaceCPUTemplate opens a database created at schema
// version 10 with Workspaces in it: migration 11 fills cpu_millis and
// template_key of each from its document, which NodeUsage and
// CountWorkspacesWithTemplate then read; a document that does not decode
// has neither.
func TestMigrateWorkspaceCPUTemplate(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ctrl.db")
	doc := func(cpu uint32, template, version string) string {
		pub := &ctrlv1.Workspace{Resources: &ctrlv1.Resources{MemoryMib: 128, CpuMillis: cpu}}
		if template != "" {
			pub.Template = &ctrlv1.TemplateRef{TemplateId: template, Version: version}
		}
		b, err := proto.Marshal(pub)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("x'%x'", b)
	}
	insert := func(id, doc, node string, power store.Power, deleted string) string {
		return fmt.Sprintf(`INSERT INTO workspaces (id, created_at, updated_at, deleted_at, doc, state, guest_condition, node_id, power,
			force_stop, generation, command_id, observed_generation, observed_state, holds_execution, memory_mib)
			VALUES ('%s', 1, 1, %s, %s, 3, 0, '%s', %d, 0, 1, '', 1, 1, 1, 128)`, id, deleted, doc, node, power)
	}
	createAtVersion(t, path, 10,
		insert("w1", doc(1500, "default", "3"), "node-a", store.PowerRunning, "NULL"),
		insert("w2", doc(500, "default", "3"), "node-a", store.PowerStopped, "NULL"),
		insert("w3", "x'ff'", "node-a", store.PowerRunning, "NULL"),
		insert("w4", doc(4000, "default", "3"), "node-a", store.PowerDeleted, "5"),
		insert("w5", doc(250, "python", ""), "", store.PowerRunning, "NULL"),
		insert("w6", doc(100, "", ""), "node-a", store.PowerRunning, "NULL"))
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	type cols struct {
		cpu      uint64
		template string
	}
	want := map[string]cols{"w1": {1500, "default@3"}, "w2": {500, "default@3"}, "w3": {0, ""},
		"w4": {4000, "default@3"}, "w5": {250, "python@"}, "w6": {100, ""}}
	if err := s.View(ctx, func(tx store.Tx) error {
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
