package reconciler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/workspace"
)

// BenchmarkNodeReload1000Nodes is one reload of the node records
// (loadNodes) with 1,000 registered nodes on SQLite: "unchanged" when no
// record changed since the last reload (heartbeats only: one NodeStates
// query), "one-changed" when one node registered again (that query and
// one document), "all" the first load (every document).
func BenchmarkNodeReload1000Nodes(b *testing.B) {
	st, err := sqlite.Open(context.Background(), b.TempDir()+"/ctrl.db")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	ctx := context.Background()
	const nodes = 1000
	upsert := func(tx store.Tx, i int) error {
		id := fmt.Sprintf("node-%04d", i)
		h := hello(id, 65536, 32000, "pool-a", workspace.DefaultTemplate, "tpl-a", "tpl-b")
		doc, err := proto.Marshal(h)
		if err != nil {
			return err
		}
		return tx.UpsertNode(ctx, &store.Node{ID: id, CreatedAt: t0, LastSeen: t0, MemoryMiB: 65536, CPUMillis: 32000, Doc: doc})
	}
	if err := st.InTx(ctx, func(tx store.Tx) error {
		for i := range nodes {
			if err := upsert(tx, i); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	b.Run("all", func(b *testing.B) {
		for b.Loop() {
			r := New(Config{Store: st, Now: func() time.Time { return t0 }})
			if err := r.loadNodes(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	r := New(Config{Store: st, Now: func() time.Time { return t0 }})
	if err := r.loadNodes(ctx); err != nil {
		b.Fatal(err)
	}
	b.Run("unchanged", func(b *testing.B) {
		for b.Loop() {
			if err := r.loadNodes(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one-changed", func(b *testing.B) {
		i := 0
		for b.Loop() {
			b.StopTimer()
			if err := st.InTx(ctx, func(tx store.Tx) error { return upsert(tx, i%nodes) }); err != nil {
				b.Fatal(err)
			}
			i++
			b.StartTimer()
			if err := r.loadNodes(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
