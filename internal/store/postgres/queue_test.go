package postgres

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// TestQueueOrders checks that InTxQueued transactions of one queue run one
// after another, across connections as across replicas: the second begins
// after the first committed, so the write skew that makes InTx retry one of
// two transactions (TestRetry) makes no queued transaction retry; and that
// a transaction of another queue does not wait.
func TestQueueOrders(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	insertAB(t, s)
	var attempts atomic.Int32
	held := make(chan struct{})
	var holding sync.Once
	var firstEnd atomic.Int64 // UnixNano when the first's fn ended
	skew := func(read, write string, hold bool) func(store.Tx) error {
		return func(tx store.Tx) error {
			attempts.Add(1)
			r, err := tx.GetResource(ctx, store.KindEgress, read)
			if err != nil {
				return err
			}
			if hold {
				holding.Do(func() { close(held) })
				time.Sleep(300 * time.Millisecond) // the second arrives meanwhile
			} else if end := firstEnd.Load(); end == 0 || time.Now().UnixNano() < end {
				t.Errorf("the second queued transaction began before the first ended")
			}
			w, err := tx.GetResource(ctx, store.KindEgress, write)
			if err != nil {
				return err
			}
			w.Revision = r.Revision + 1
			if err := tx.UpdateResource(ctx, w); err != nil {
				return err
			}
			if hold {
				firstEnd.Store(time.Now().UnixNano())
			}
			return nil
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Go(func() { errs[0] = s.InTxQueued(ctx, "q", skew("a", "b", true)) })
	<-held
	wg.Go(func() { errs[1] = s.InTxQueued(ctx, "q", skew("b", "a", false)) })
	// Another queue: it runs while the first holds "q".
	otherRan := make(chan time.Time, 1)
	wg.Go(func() {
		errs[2] = s.InTxQueued(ctx, "other", func(tx store.Tx) error {
			otherRan <- time.Now()
			_, err := tx.GetResource(ctx, store.KindEgress, "a")
			return err
		})
	})
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("InTxQueued %d: %v", i, err)
		}
	}
	if n := attempts.Load(); n != 2 {
		t.Errorf("%d attempts of the two queued transactions, want 2 (no retry)", n)
	}
	if ran := <-otherRan; ran.UnixNano() >= firstEnd.Load() {
		t.Errorf("a transaction of another queue waited for the first of \"q\"")
	}
}

// TestQueueWaitBounded checks that a queued transaction whose turn does not
// come within the wait bound (the holder stuck) runs unqueued, and that the
// queue works again afterwards.
func TestQueueWaitBounded(t *testing.T) {
	s := openTest(t)
	s.queueWait = 200 * time.Millisecond
	ctx := context.Background()
	held, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var holderErr error
	wg.Go(func() {
		holderErr = s.InTxQueued(ctx, "q", func(store.Tx) error {
			select {
			case <-held:
			default:
				close(held)
			}
			<-release
			return nil
		})
	})
	<-held
	start := time.Now()
	if err := s.InTxQueued(ctx, "q", func(tx store.Tx) error {
		return tx.InsertResource(ctx, resource("unqueued", nil))
	}); err != nil {
		t.Fatalf("InTxQueued while the queue is held: %v", err)
	}
	if d := time.Since(start); d < s.queueWait || d > s.queueWait+5*time.Second {
		t.Errorf("ran after %v while the queue was held, want after the wait bound %v", d, s.queueWait)
	}
	close(release)
	wg.Wait()
	if holderErr != nil {
		t.Fatalf("holder: %v", holderErr)
	}
	// The lock was released: the next one does not wait for the bound.
	start = time.Now()
	if err := s.InTxQueued(ctx, "q", func(store.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= s.queueWait {
		t.Errorf("waited %v for a free queue", d)
	}
}
