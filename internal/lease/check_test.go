package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// TestCheckFencesStaleHolder: a unit of work whose transaction checks the
// lease (Keeper.Check) commits while its replica holds it; once another
// replica took the lease over — a's own clock still says a holds it (a
// paused process, a clock behind) — a's unit is refused inside its
// transaction and nothing of it commits; a nil Keeper allows everything.
func TestCheckFencesStaleHolder(t *testing.T) {
	dialects(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		ca := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		cb := &clock{now: ca.now}
		a := New(Config{Store: s, Name: Fleet, Holder: "a", Now: ca.Now})
		b := New(Config{Store: s, Name: Fleet, Holder: "b", Now: cb.Now})
		unit := func(k *Keeper, node string) error {
			return s.InTx(ctx, func(tx store.Tx) error {
				if err := k.Check(ctx, tx); err != nil {
					return err
				}
				return tx.UpsertNode(ctx, &store.Node{ID: node, CreatedAt: ca.now, LastSeen: ca.now})
			})
		}
		stored := func(node string) bool {
			var err error
			if verr := s.View(ctx, func(tx store.Tx) error { _, err = tx.GetNode(ctx, node); return nil }); verr != nil {
				t.Fatal(verr)
			}
			return err == nil
		}
		if err := unit(a, "before"); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("unit before any acquire = %v, want ErrNotHeld", err)
		}
		if err := a.Try(ctx); err != nil {
			t.Fatal(err)
		}
		if err := unit(a, "held"); err != nil || !stored("held") {
			t.Fatalf("unit of the holder = %v (stored %v), want committed", err, stored("held"))
		}
		if err := unit(b, "b-early"); !errors.Is(err, ErrNotHeld) || stored("b-early") {
			t.Fatalf("unit of a non-holder = %v, want ErrNotHeld", err)
		}
		// b's clock passes a's claim; b takes over. a's clock stands still:
		// by it, a still holds the lease.
		cb.advance(DefaultTTL + time.Millisecond)
		if err := b.Try(ctx); err != nil {
			t.Fatal(err)
		}
		if fb, ok := b.Held(); !ok || fb != 2 {
			t.Fatalf("b after takeover: fence %d held %v, want fence 2", fb, ok)
		}
		if _, ok := a.Held(); !ok {
			t.Fatal("a's own clock should still say it holds the lease")
		}
		if err := unit(a, "stale"); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("unit of the stale holder = %v, want ErrNotHeld", err)
		}
		if stored("stale") {
			t.Fatal("the stale holder's unit committed")
		}
		if err := unit(b, "new"); err != nil || !stored("new") {
			t.Fatalf("unit of the new holder = %v, want committed", err)
		}
		var none *Keeper
		if err := unit(none, "nil"); err != nil || !stored("nil") {
			t.Fatalf("unit with a nil Keeper = %v, want committed", err)
		}
	})
}
