package store_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

func TestLocalNotifierReleases(t *testing.T) {
	t.Parallel()
	var n store.LocalNotifier
	var releases []func()
	for i := range 100 {
		_, release := n.Subscribe(store.WorkspaceTopic(fmt.Sprint(i % 10)))
		releases = append(releases, release)
	}
	if got := n.Waiters(); got != 100 {
		t.Fatalf("Waiters() = %d, want 100", got)
	}
	n.Notify(store.WorkspaceTopic("0"))
	if got := n.Waiters(); got != 90 {
		t.Fatalf("Waiters() after one Notify = %d, want 90", got)
	}
	for _, r := range releases {
		r()
	}
	if got := n.Waiters(); got != 0 {
		t.Fatalf("Waiters() after every release = %d, want 0", got)
	}
	// A release after the topic was notified and subscribed again does not
	// drop the new subscription.
	_, old := n.Subscribe("t")
	n.Notify("t")
	ch, cur := n.Subscribe("t")
	defer cur()
	old()
	if n.Waiters() != 1 {
		t.Fatal("releasing a notified subscription dropped a newer one")
	}
	n.Notify("t")
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("the newer subscription was not woken")
	}
}

func TestLocalNotifierConcurrent(t *testing.T) {
	t.Parallel()
	var n store.LocalNotifier
	const waiters = 200
	var wg sync.WaitGroup
	ready := make(chan struct{}, waiters)
	for i := range waiters {
		wg.Go(func() {
			ch, release := n.Subscribe(store.WorkspaceTopic(fmt.Sprint(i % 7)))
			defer release()
			ready <- struct{}{}
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Errorf("waiter %d was not woken", i)
			}
		})
	}
	for range waiters {
		<-ready
	}
	for i := range 7 {
		n.Notify(store.WorkspaceTopic(fmt.Sprint(i)))
	}
	wg.Wait()
	if got := n.Waiters(); got != 0 {
		t.Fatalf("Waiters() = %d after every waiter left, want 0", got)
	}
}

func TestLocalNotifierNotifyAll(t *testing.T) {
	t.Parallel()
	var n store.LocalNotifier
	var chans []<-chan struct{}
	var releases []func()
	for i := range 10 {
		ch, release := n.Subscribe(store.WorkspaceTopic(fmt.Sprint(i % 3)))
		chans = append(chans, ch)
		releases = append(releases, release)
	}
	n.NotifyAll()
	for i, ch := range chans {
		select {
		case <-ch:
		default:
			t.Fatalf("subscription %d not woken by NotifyAll", i)
		}
	}
	if got := n.Waiters(); got != 0 {
		t.Fatalf("Waiters() after NotifyAll = %d, want 0", got)
	}
	for _, r := range releases {
		r() // notified already: nothing to drop
	}
	ch, release := n.Subscribe("t")
	defer release()
	if n.Waiters() != 1 {
		t.Fatal("a subscription after NotifyAll is not counted")
	}
	n.Notify("t")
	<-ch
}
