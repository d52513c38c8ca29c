package workspace_test

import (
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// TestSaveUsageColumns: Save keeps the query columns that placement and
// the storage pool sum (store.Tx.NodeUsage) equal to the document, through
// every change of the memory and the writable layer, and zero when the
// document has none.
func TestSaveUsageColumns(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	w := &store.Workspace{ID: "ws-1"}
	for _, tc := range []struct {
		name          string
		pub           *ctrlv1.Workspace
		memory, layer uint64
	}{
		{"created", &ctrlv1.Workspace{Resources: &ctrlv1.Resources{MemoryMib: 512, CpuMillis: 100},
			WritableLayer: &ctrlv1.WritableLayer{CapacityBytes: 1 << 30}}, 512, 1 << 30},
		{"memory updated", &ctrlv1.Workspace{Resources: &ctrlv1.Resources{MemoryMib: 2048, CpuMillis: 100},
			WritableLayer: &ctrlv1.WritableLayer{CapacityBytes: 1 << 30}}, 2048, 1 << 30},
		{"layer resized", &ctrlv1.Workspace{Resources: &ctrlv1.Resources{MemoryMib: 2048, CpuMillis: 100},
			WritableLayer: &ctrlv1.WritableLayer{CapacityBytes: 5 << 40}}, 2048, 5 << 40},
		{"neither", &ctrlv1.Workspace{}, 0, 0},
	} {
		if err := workspace.Save(w, tc.pub, now); err != nil {
			t.Fatal(err)
		}
		if w.MemoryMiB != tc.memory || w.LayerBytes != tc.layer {
			t.Errorf("%s: MemoryMiB %d, LayerBytes %d; want %d and %d", tc.name, w.MemoryMiB, w.LayerBytes, tc.memory, tc.layer)
		}
	}
}

// TestSaveTemplateColumns: Save keeps CPUMillis and TemplateKey (the query
// columns of NodeUsage and CountWorkspacesWithTemplate) equal to the
// document.
func TestSaveTemplateColumns(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	w := &store.Workspace{ID: "ws-1"}
	for _, tc := range []struct {
		name     string
		pub      *ctrlv1.Workspace
		cpu      uint64
		template string
	}{
		{"created", &ctrlv1.Workspace{Resources: &ctrlv1.Resources{MemoryMib: 512, CpuMillis: 1500},
			Template: &ctrlv1.TemplateRef{TemplateId: "default", Version: "3"}}, 1500, "default@3"},
		{"upgraded", &ctrlv1.Workspace{Resources: &ctrlv1.Resources{MemoryMib: 512, CpuMillis: 2000},
			Template: &ctrlv1.TemplateRef{TemplateId: "default", Version: "4"}}, 2000, "default@4"},
		{"no version", &ctrlv1.Workspace{Template: &ctrlv1.TemplateRef{TemplateId: "py"}}, 0, "py@"},
		{"neither", &ctrlv1.Workspace{}, 0, ""},
	} {
		if err := workspace.Save(w, tc.pub, now); err != nil {
			t.Fatal(err)
		}
		if w.CPUMillis != tc.cpu || w.TemplateKey != tc.template {
			t.Errorf("%s: CPUMillis %d, TemplateKey %q; want %d and %q", tc.name, w.CPUMillis, w.TemplateKey, tc.cpu, tc.template)
		}
	}
}
