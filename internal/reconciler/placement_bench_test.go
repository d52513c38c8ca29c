package reconciler

import (
	"fmt"
	"testing"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// BenchmarkPlace1000Nodes is the placement of Workspaces among 1,000
// connected nodes on SQLite and PostgreSQL (KIBOTOS_TEST_POSTGRES_URL), each node holding two placed Workspaces, per
// Workspace: "one" places each in its own transaction (place), "batch" a
// pass's chunk of pushChunk in one (placeBatch). bench/hollow's creates
// are bound by it.
func BenchmarkPlace1000Nodes(b *testing.B) {
	b.Run("sqlite", func(b *testing.B) {
		r, st, _ := newTest(b, Config{})
		benchPlace(b, r, st)
	})
	b.Run("postgres", func(b *testing.B) {
		st, _ := twoPostgresStores(b)
		benchPlace(b, newReplica(st, &fakeClock{now: t0}, Config{}), st)
	})
}

func benchPlace(b *testing.B, r *Reconciler, st store.Store) {
	const nodes = 1000
	for i := range nodes {
		connectNode(b, r, hello(fmt.Sprintf("node-%04d", i), 65536, 32000, "pool-a", workspace.DefaultTemplate))
	}
	for i := range 2 * nodes {
		seed(b, st, t0, row{id: fmt.Sprintf("placed-%05d", i), node: fmt.Sprintf("node-%04d", i%nodes), power: running, generation: 1, state: wsCreate})
	}
	n := 0
	unplaced := func(k int) []string {
		ids := make([]string, k)
		for i := range ids {
			ids[i] = fmt.Sprintf("ws-%06d", n)
			n++
			seed(b, st, t0, row{id: ids[i], power: running, generation: 1, state: wsCreate, command: "c-" + ids[i]})
		}
		return ids
	}
	b.Run("one", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			id := unplaced(1)[0]
			b.StartTimer()
			if placed, _, err := r.place(b.Context(), nil, id); err != nil || placed == nil {
				b.Fatalf("place(%s) = %v, %v", id, placed, err)
			}
		}
	})
	b.Run("batch", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			ids := unplaced(pushChunk)
			b.StartTimer()
			ps, err := r.placeBatch(b.Context(), nil, ids, nil)
			if err != nil {
				b.Fatal(err)
			}
			for i, p := range ps {
				if p.placed == nil {
					b.Fatalf("placeBatch: %s not placed", ids[i])
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*pushChunk), "ns/workspace")
	})
}
