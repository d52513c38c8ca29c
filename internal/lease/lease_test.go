package lease

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/store/sqlite"
)

// dialects opens a fresh store of each dialect (PostgreSQL when
// KIBOTOS_TEST_POSTGRES_URL is set).
func dialects(t *testing.T, fn func(t *testing.T, s store.Store)) {
	t.Run("sqlite", func(t *testing.T) {
		s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "ctrl.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		fn(t, s)
	})
	t.Run("postgres", func(t *testing.T) {
		url := os.Getenv("KIBOTOS_TEST_POSTGRES_URL")
		if url == "" {
			if os.Getenv("CI") == "true" {
				t.Fatal("KIBOTOS_TEST_POSTGRES_URL is not set; CI must run the PostgreSQL tests")
			}
			t.Skip("KIBOTOS_TEST_POSTGRES_URL is not set: skipping PostgreSQL test")
		}
		s, cleanup, err := pgtest.Open(context.Background(), url, postgres.Open)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cleanup() })
		fn(t, s)
	})
}

// clock is a fake clock shared by the keepers of a test.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func try(t *testing.T, k *Keeper) {
	t.Helper()
	if err := k.Try(context.Background()); err != nil {
		t.Fatalf("%s: Try: %v", k.Holder(), err)
	}
}

func held(t *testing.T, k *Keeper, want bool, wantFence int64) {
	t.Helper()
	fence, ok := k.Held()
	if ok != want || (want && fence != wantFence) {
		t.Fatalf("%s: Held = %d, %v; want %d, %v", k.Holder(), fence, ok, wantFence, want)
	}
}

// TestAcquireRenewTakeover: the first keeper acquires (fence 1) and keeps
// the lease while it renews; the second never gets it meanwhile. When the
// first stops renewing it stops holding at TTL, and the second takes over
// at its first attempt after that, with fence 2; the first, back, is
// refused and reports so.
func TestAcquireRenewTakeover(t *testing.T) {
	dialects(t, func(t *testing.T, s store.Store) {
		c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		var acquired []int64
		a := New(Config{Store: s, Name: Fleet, Holder: "a", Now: c.Now, OnAcquire: func(f int64) { acquired = append(acquired, f) }})
		b := New(Config{Store: s, Name: Fleet, Holder: "b", Now: c.Now})
		try(t, a)
		try(t, b)
		held(t, a, true, 1)
		held(t, b, false, 0)
		for range 5 {
			c.advance(DefaultRenew)
			try(t, a)
			try(t, b)
			held(t, a, true, 1)
			held(t, b, false, 0)
		}
		// a dies (stops renewing) right after its last renewal.
		c.advance(DefaultRenew)
		try(t, b)
		held(t, b, false, 0)
		c.advance(DefaultTTL - DefaultRenew - time.Nanosecond)
		held(t, a, true, 1)
		c.advance(time.Nanosecond)
		held(t, a, false, 0)
		try(t, b)
		held(t, b, true, 2)
		try(t, a)
		held(t, a, false, 0)
		if len(acquired) != 1 || acquired[0] != 1 {
			t.Fatalf("a's OnAcquire calls: %v, want [1]", acquired)
		}
		// b dies: a takes over with the next fence.
		c.advance(DefaultTTL)
		try(t, a)
		held(t, a, true, 3)
		if len(acquired) != 2 || acquired[1] != 3 {
			t.Fatalf("a's OnAcquire calls: %v, want [1 3]", acquired)
		}
	})
}

// TestFailedRenewal: a keeper whose renewals fail keeps the lease until
// TTL after its last successful one, then stops holding.
func TestFailedRenewal(t *testing.T) {
	dialects(t, func(t *testing.T, s store.Store) {
		c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		a := New(Config{Store: s, Name: Fleet, Holder: "a", Now: c.Now})
		try(t, a)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c.advance(DefaultRenew)
		if err := a.Try(ctx); err == nil {
			t.Fatal("Try with a canceled context succeeded")
		}
		held(t, a, true, 1)
		c.advance(DefaultTTL - DefaultRenew)
		held(t, a, false, 0)
	})
}

// TestContenders: keepers racing on real time end with exactly one
// holder, every round.
func TestContenders(t *testing.T) {
	dialects(t, func(t *testing.T, s store.Store) {
		ks := make([]*Keeper, 3)
		for i := range ks {
			ks[i] = New(Config{Store: s, Name: Fleet})
		}
		for round := range 5 {
			var wg sync.WaitGroup
			for _, k := range ks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := k.Try(context.Background()); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			n := 0
			for _, k := range ks {
				if k.IsHeld() {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("round %d: %d holders, want 1", round, n)
			}
		}
	})
}

// TestTakeoverBound: with the default TTL and renewal, on real time, a
// second keeper takes over within 5 s of the holder's death (measured and
// logged).
func TestTakeoverBound(t *testing.T) {
	if testing.Short() {
		t.Skip("takes up to 5 s")
	}
	dialects(t, func(t *testing.T, s store.Store) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		actx, kill := context.WithCancel(ctx)
		a := New(Config{Store: s, Name: Fleet, Holder: "a"})
		go a.Run(actx)
		deadline := time.Now().Add(5 * time.Second)
		for !a.IsHeld() {
			if time.Now().After(deadline) {
				t.Fatal("a never acquired")
			}
			time.Sleep(10 * time.Millisecond)
		}
		gained := make(chan time.Time, 1)
		b := New(Config{Store: s, Name: Fleet, Holder: "b", OnAcquire: func(int64) { gained <- time.Now() }})
		go b.Run(ctx)
		time.Sleep(1500 * time.Millisecond) // b contends for a while
		if b.IsHeld() {
			t.Fatal("b holds while a renews")
		}
		kill()
		died := time.Now()
		select {
		case at := <-gained:
			t.Logf("takeover %v after the holder's death", at.Sub(died))
			if at.Sub(died) > 5*time.Second {
				t.Fatalf("takeover took %v, want ≤ 5 s", at.Sub(died))
			}
		case <-time.After(6 * time.Second):
			t.Fatal("no takeover within 6 s")
		}
	})
}
