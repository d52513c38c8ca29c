package reconciler

import (
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
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

// TestTargetedWakes: an admission's Admitted wakes only the replica that
// admitted it (it places the Workspace), a placement's store.PushTopic
// every replica (the one holding the node's stream pushes), as does
// KickAll.
func TestTargetedWakes(t *testing.T) {
	a, st, clock := newTest(t, Config{})
	b := newReplica(st, clock, Config{Leader: never})
	go a.wakeOnNotify(t.Context())
	go b.wakeOnNotify(t.Context())
	woke := func(r *Reconciler) bool {
		select {
		case <-r.kick:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	}
	cases := []struct {
		name   string
		notify func()
		a, b   bool // woken
	}{
		{"Admitted", func() { b.Admitted("ws-1") }, false, true},
		{"PushTopic", func() { a.store.Notify(store.PushTopic) }, true, true},
		{"KickAll", b.KickAll, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Let both subscribe before the notification (a real loop
			// subscribes at start): notify until b wakes, after the wakes
			// of the cases before are drained.
			for woke(a) || woke(b) {
			}
			deadline := time.Now().Add(5 * time.Second)
			for c.notify(); !woke(b); c.notify() {
				if time.Now().After(deadline) {
					t.Fatal("b never woke")
				}
			}
			time.Sleep(50 * time.Millisecond) // a's wake, if any, is in
			if got := woke(a); got != c.a {
				t.Errorf("a woken: %v, want %v", got, c.a)
			}
		})
	}
}
