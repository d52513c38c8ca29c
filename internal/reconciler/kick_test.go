package reconciler

import (
	"testing"
	"time"
)

// TestKickAllWakesOtherReconcilers: an admission's KickAll wakes, through
// the store's notifications, a reconciler that shares the store (as the
// reconcilers of several replicas share PostgreSQL's), not only its own.
func TestKickAllWakesOtherReconcilers(t *testing.T) {
	a, st, _ := newTest(t, Config{})
	b := New(Config{Store: st, Now: a.clock})
	go b.wakeOnNotify(t.Context())
	// Let b subscribe before a notifies (a real loop subscribes at start).
	deadline := time.Now().Add(5 * time.Second)
	for {
		a.KickAll()
		select {
		case <-b.kick:
			return
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("KickAll on one reconciler never woke the other")
		}
	}
}
