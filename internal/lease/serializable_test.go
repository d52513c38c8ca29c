package lease

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
)

// TestCheckConcurrentTakeoverPostgres: under PostgreSQL's SERIALIZABLE
// isolation, a stale holder's unit that passed Check before a takeover
// committed, and writes what the new holder's first unit read (and found
// absent), does not commit: PostgreSQL fails one of them, InTx runs the
// stale unit again, and Check then refuses it.
func TestCheckConcurrentTakeoverPostgres(t *testing.T) {
	url := os.Getenv("KIBOTOS_TEST_POSTGRES_URL")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KIBOTOS_TEST_POSTGRES_URL is not set; CI must run the PostgreSQL tests")
		}
		t.Skip("KIBOTOS_TEST_POSTGRES_URL is not set: skipping PostgreSQL test")
	}
	ctx := context.Background()
	s, cleanup, err := pgtest.Open(ctx, url, postgres.Open)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cleanup() })
	ca := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cb := &clock{now: ca.now.Add(DefaultTTL + time.Millisecond)}
	a := New(Config{Store: s, Name: Fleet, Holder: "a", Now: ca.Now})
	b := New(Config{Store: s, Name: Fleet, Holder: "b", Now: cb.Now})
	if err := a.Try(ctx); err != nil {
		t.Fatal(err)
	}
	read, proceed := make(chan struct{}), make(chan struct{})
	var attempts atomic.Int32
	staleDone := make(chan error, 1)
	go func() {
		staleDone <- s.InTx(ctx, func(tx store.Tx) error {
			n := attempts.Add(1)
			if err := a.Check(ctx, tx); err != nil {
				return err
			}
			if n == 1 {
				close(read)
				<-proceed
			}
			return tx.UpsertNode(ctx, &store.Node{ID: "unit", CreatedAt: ca.now, LastSeen: ca.now, Doc: []byte("stale")})
		})
	}()
	<-read
	if err := b.Try(ctx); err != nil || !b.IsHeld() {
		t.Fatalf("takeover: %v, held %v", err, b.IsHeld())
	}
	// The new holder's unit: it finds no "unit" row and writes its own.
	if err := s.InTx(ctx, func(tx store.Tx) error {
		if err := b.Check(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.GetNode(ctx, "unit"); !errors.Is(err, store.ErrNotFound) {
			return errors.New("the stale unit's row is visible already")
		}
		return tx.UpsertNode(ctx, &store.Node{ID: "other", CreatedAt: cb.now, LastSeen: cb.now, Doc: []byte("new")})
	}); err != nil {
		t.Fatalf("the new holder's unit: %v", err)
	}
	close(proceed)
	err = <-staleDone
	if !errors.Is(err, ErrNotHeld) {
		t.Fatalf("the stale holder's unit = %v after %d attempts, want ErrNotHeld", err, attempts.Load())
	}
	if err := s.View(ctx, func(tx store.Tx) error {
		_, err := tx.GetNode(ctx, "unit")
		if !errors.Is(err, store.ErrNotFound) {
			return errors.New("the stale holder's unit committed")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("the stale unit ran %d times: refused by Check after PostgreSQL failed its first commit", attempts.Load())
}
