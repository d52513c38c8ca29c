package workspace

import "sync"

// Notifier wakes every waiter when something changed. Waiters re-read the
// store: a notification carries no data, so a missed one costs at most a
// polling interval.
type Notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

// Wait returns a channel closed at the next Broadcast.
func (n *Notifier) Wait() <-chan struct{} {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

// Broadcast wakes every current waiter.
func (n *Notifier) Broadcast() {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}
