package retention

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/lease"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// TestPassFenced: a replica whose fleet lease another replica took over,
// while its own clock still says it holds it (Leader true), prunes
// nothing: each batch's transaction checks the lease row (Fence,
// lease.Keeper.Check) and rolls back; the new holder prunes.
func TestPassFenced(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := st.InTx(ctx, func(tx store.Tx) error {
		return tx.InsertCommand(ctx, &store.Command{ID: "c-old", Method: "m", ObjectKind: "workspace",
			Status: store.CommandCompleted, CreatedAt: t0, CompletedAt: t0})
	}); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(30 * 24 * time.Hour)
	ca, cb := &fakeClock{now: now}, &fakeClock{now: now}
	a := lease.New(lease.Config{Store: st, Name: lease.Fleet, Holder: "a", Now: ca.Now})
	b := lease.New(lease.Config{Store: st, Name: lease.Fleet, Holder: "b", Now: cb.Now})
	if err := a.Try(ctx); err != nil {
		t.Fatal(err)
	}
	cb.now = now.Add(lease.DefaultTTL + time.Millisecond)
	if err := b.Try(ctx); err != nil || !b.IsHeld() {
		t.Fatalf("b's takeover: %v, held %v", err, b.IsHeld())
	}
	pa := &Pruner{Store: st, Now: ca.Now, Leader: a.IsHeld, Fence: func(ctx context.Context, tx store.Tx) error { return a.Check(ctx, tx) }}
	if c, err := pa.Pass(ctx); err != nil || c != (Counts{}) {
		t.Fatalf("stale holder's Pass = %+v, %v; want nothing pruned", c, err)
	}
	pb := &Pruner{Store: st, Now: cb.Now, Leader: b.IsHeld, Fence: func(ctx context.Context, tx store.Tx) error { return b.Check(ctx, tx) }}
	if c, err := pb.Pass(ctx); err != nil || c.Commands != 1 {
		t.Fatalf("new holder's Pass = %+v, %v; want 1 command pruned", c, err)
	}
}
