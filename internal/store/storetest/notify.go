package storetest

import (
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// closed reports whether ch is closed, waiting at most d for it.
func closed(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// testNotify pins down the Notifier every store provides: a Notify wakes
// the current subscribers of its topic, and only them.
func testNotify(t *testing.T, s store.Store) {
	a1, releaseA1 := s.Subscribe(store.WorkspaceTopic("ws-a"))
	defer releaseA1()
	a2, releaseA2 := s.Subscribe(store.WorkspaceTopic("ws-a"))
	defer releaseA2()
	b, releaseB := s.Subscribe(store.WorkspaceTopic("ws-b"))
	defer releaseB()

	s.Notify(store.WorkspaceTopic("ws-none")) // nobody listens: nothing happens
	s.Notify(store.WorkspaceTopic("ws-a"))
	if !closed(a1, 5*time.Second) || !closed(a2, 5*time.Second) {
		t.Fatal("Notify(ws-a) did not wake every subscriber of ws-a")
	}
	if closed(b, 20*time.Millisecond) {
		t.Fatal("Notify(ws-a) woke a subscriber of ws-b")
	}
	// A subscription taken after a Notify waits for the next one.
	again, releaseAgain := s.Subscribe(store.WorkspaceTopic("ws-a"))
	defer releaseAgain()
	if closed(again, 20*time.Millisecond) {
		t.Fatal("a subscription made after Notify is already woken")
	}
	// Releasing one subscriber leaves the others of its topic subscribed.
	b2, releaseB2 := s.Subscribe(store.WorkspaceTopic("ws-b"))
	releaseB2()
	releaseB2() // twice is harmless
	_ = b2
	s.Notify(store.WorkspaceTopic("ws-b"))
	if !closed(b, 5*time.Second) {
		t.Fatal("releasing one subscriber of ws-b unsubscribed another")
	}
}
