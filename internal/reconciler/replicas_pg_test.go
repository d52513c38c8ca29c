package reconciler

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/workspace"
)

type noClose struct{}

func (noClose) Close() error { return nil }

// twoPostgresStores opens two stores on one fresh PostgreSQL schema: two
// ctrl replicas' stores, whose notifications travel by LISTEN/NOTIFY.
func twoPostgresStores(t testing.TB) (store.Store, store.Store) {
	t.Helper()
	base := os.Getenv("KIBOTOS_TEST_POSTGRES_URL")
	if base == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KIBOTOS_TEST_POSTGRES_URL is not set; CI must run the PostgreSQL tests")
		}
		t.Skip("KIBOTOS_TEST_POSTGRES_URL is not set: skipping PostgreSQL test")
	}
	var url string
	_, cleanup, err := pgtest.Open(t.Context(), base, func(_ context.Context, u string) (noClose, error) { url = u; return noClose{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cleanup() })
	var out [2]store.Store
	for i := range out {
		s, err := postgres.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out[i] = s
	}
	return out[0], out[1]
}

// TestReplicasLearnNodesOnPostgres: two replicas, each with its own store
// on one PostgreSQL schema; b, started before the node registered through
// a, learns it through LISTEN/NOTIFY within a second (its periodic reload
// is 10 s), and a's stream of the node is superseded when the node
// registers again through b.
func TestReplicasLearnNodesOnPostgres(t *testing.T) {
	sa, sb := twoPostgresStores(t)
	clock := &fakeClock{now: t0}
	a := New(Config{Store: sa, Now: clock.Now, Leader: never})
	b := New(Config{Store: sb, Now: clock.Now, Leader: never})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 2)
	for _, r := range []*Reconciler{a, b} {
		go func() { done <- r.Run(ctx) }()
	}
	defer func() { cancel(); <-done; <-done }()
	started := func(r *Reconciler) bool { r.mu.Lock(); defer r.mu.Unlock(); return !r.nodeCache.loaded.IsZero() }
	if !eventually(5*time.Second, func() bool { return started(a) && started(b) }) {
		t.Fatal("the replicas did not start")
	}
	time.Sleep(200 * time.Millisecond) // their LISTEN
	nc := connectNode(t, a, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	start := time.Now()
	if !eventually(time.Second, func() bool { return b.MaxCapacity().MemoryMiB == 4096 }) {
		t.Fatalf("b did not learn n1 within 1 s: MaxCapacity %+v", b.MaxCapacity())
	}
	t.Logf("b learnt n1 %v after its registration through a", time.Since(start))
	connectNode(t, b, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	start = time.Now()
	select {
	case <-nc.replaced:
		t.Logf("a's stale stream ended %v after n1 registered through b", time.Since(start))
	case <-time.After(time.Second):
		t.Fatal("a's stream of n1 did not end within 1 s of n1's registration through b")
	}
}
