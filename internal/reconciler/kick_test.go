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

// TestTargetedWakes: a create's KickPlacer wakes only the replica that
// places (the fleet lease's holder), and the placer's store.PushTopic only
// the replicas that do not place; neither wakes the other.
func TestTargetedWakes(t *testing.T) {
	placer, st, clock := newTest(t, Config{})
	other := newReplica(st, clock, Config{Leader: never})
	go placer.wakeOnNotify(t.Context())
	go other.wakeOnNotify(t.Context())
	woke := func(r *Reconciler) bool {
		select {
		case <-r.kick:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	}
	cases := []struct {
		name          string
		notify        func()
		placer, other bool
	}{
		{"KickPlacer", other.KickPlacer, true, false},
		{"PushTopic", func() { placer.store.Notify(store.PushTopic) }, false, true},
		{"KickAll", other.KickAll, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Let both subscribe before the notification (a real loop
			// subscribes at start): notify until the expected one wakes,
			// after the wakes of the cases before are drained.
			for woke(placer) || woke(other) {
			}
			want := placer
			if !c.placer {
				want = other
			}
			deadline := time.Now().Add(5 * time.Second)
			for c.notify(); !woke(want); c.notify() {
				if time.Now().After(deadline) {
					t.Fatal("never woke")
				}
			}
			time.Sleep(50 * time.Millisecond) // the other's wake, if any, is in
			if c.placer && c.other {
				if !woke(other) {
					t.Error("the replica that does not place did not wake")
				}
				return
			}
			unwanted := other
			if !c.placer {
				unwanted = placer
			}
			if woke(unwanted) {
				t.Error("woke a replica it is not for")
			}
		})
	}
}
