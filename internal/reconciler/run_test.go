package reconciler

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/workspace"
)

// downAtStart is a store whose first reads fail, as a database that is
// restarting when ctrl starts.
type downAtStart struct {
	store.Store
	fails atomic.Int32
}

func (d *downAtStart) View(ctx context.Context, fn func(store.Tx) error) error {
	if d.fails.Add(-1) >= 0 {
		return errors.New("the database cannot serve now")
	}
	return d.Store.View(ctx, fn)
}

// TestRunOutlastsStoreAtStart: a store that cannot serve when the loop
// starts delays its first loads; the loop does not end, and learns the
// nodes once the store serves.
func TestRunOutlastsStoreAtStart(t *testing.T) {
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	doc, err := proto.Marshal(hello("node-a", 4096, 4000, "pool-a", workspace.DefaultTemplate))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InTx(t.Context(), func(tx store.Tx) error {
		return tx.UpsertNode(t.Context(), &store.Node{ID: "node-a", CreatedAt: t0, LastSeen: t0, MemoryMiB: 4096, CPUMillis: 4000, Doc: doc})
	}); err != nil {
		t.Fatal(err)
	}
	down := &downAtStart{Store: st}
	down.fails.Store(2)
	r := New(Config{Store: down, Now: func() time.Time { return t0 }})
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for r.MaxCapacity().MemoryMiB == 0 {
		select {
		case err := <-ran:
			t.Fatalf("Run ended (%v) before the store served", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the nodes were not loaded within 10 s of the store serving")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Errorf("Run = %v after its context ended, want nil", err)
	}
}
