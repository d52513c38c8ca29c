package sqlite

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
)

// BenchmarkNodeUsage compares what placement read per candidate node before
// NodeUsage (every Workspace on the node, each document decoded for its
// memory and writable layer) with NodeUsage (sums of the covering index), at
// 1,000 and 10,000 Workspaces on the node.
//
//	go test ./internal/store/sqlite -run '^$' -bench NodeUsage -benchtime 2s
func BenchmarkNodeUsage(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		s := openTest(b)
		ctx := context.Background()
		base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		if err := s.InTx(ctx, func(tx store.Tx) error {
			for i := range n {
				id := fmt.Sprintf("ws-%05d", i)
				pub := &ctrlv1.Workspace{WorkspaceId: id, Labels: map[string]string{"team": "bench", "i": fmt.Sprint(i)},
					Resources:     &ctrlv1.Resources{MemoryMib: 16, CpuMillis: 100},
					WritableLayer: &ctrlv1.WritableLayer{CapacityBytes: 64 << 20},
					Template:      &ctrlv1.TemplateRef{TemplateId: "tmpl", Version: "v1"},
					State:         ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE}
				doc, err := proto.Marshal(pub)
				if err != nil {
					return err
				}
				w := &store.Workspace{ID: id, CreatedAt: base, UpdatedAt: base, Doc: doc, Labels: pub.GetLabels(), State: 3,
					NodeID: "node-a", Power: store.PowerRunning, MemoryMiB: 16, LayerBytes: 64 << 20}
				if err := tx.InsertWorkspace(ctx, w); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("documents/%d", n), func(b *testing.B) {
			for b.Loop() {
				if err := s.View(ctx, func(tx store.Tx) error {
					on, err := tx.WorkspacesOnNode(ctx, "node-a")
					if err != nil {
						return err
					}
					var memory, layer uint64
					for _, w := range on {
						pub := &ctrlv1.Workspace{}
						if err := proto.Unmarshal(w.Doc, pub); err != nil {
							return err
						}
						layer += pub.GetWritableLayer().GetCapacityBytes()
						if w.Power == store.PowerRunning {
							memory += uint64(pub.GetResources().GetMemoryMib())
						}
					}
					if memory != uint64(16*n) || layer != uint64(n)<<26 {
						return fmt.Errorf("sums %d, %d", memory, layer)
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("index/%d", n), func(b *testing.B) {
			for b.Loop() {
				if err := s.View(ctx, func(tx store.Tx) error {
					u, err := tx.NodeUsage(ctx, "node-a")
					if err == nil && u.RunningMemoryMiB != uint64(16*n) {
						err = fmt.Errorf("sums %+v", u)
					}
					return err
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
