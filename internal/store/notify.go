package store

import (
	"strings"
	"sync"
	"time"
)

// Notifier carries wake-ups from the code that commits a change to the
// requests that wait for it: a GetWorkspaceCommand with wait_timeout, a
// StopWorkspace waiting for its command. A notification carries no data;
// a woken waiter re-reads the store. Topics scope the wake-ups, so that a
// change wakes only the waiters of the object it touched (see
// WorkspaceTopic).
//
// Notifications make waits prompt; they are not what makes them correct.
// Every waiter also re-reads the store at least every RecheckInterval, so
// a notification that is lost (the PostgreSQL store carries notifications
// between ctrl replicas with LISTEN/NOTIFY, as a hint that may not arrive)
// costs at most that interval.
type Notifier interface {
	// Notify wakes every current subscriber of topic. Call it after the
	// commit that made the change visible (after InTx returned), never
	// inside a transaction, which may still roll back or run again.
	Notify(topic string)
	// Subscribe returns a channel that is closed by the first Notify of
	// topic after Subscribe was called, and a function that releases the
	// subscription. Every subscription must be released, notified or not;
	// release may be called more than once. A waiter subscribes before it
	// reads the store, so that a change committed after the read cannot be
	// missed.
	Subscribe(topic string) (changed <-chan struct{}, release func())
}

// RecheckInterval bounds how long a waiter relies on notifications alone:
// it re-reads the store at least this often.
const RecheckInterval = time.Second

// ReconcileTopic is the topic notified when an admission gave the
// reconcilers work (a new desired state, a stop, a policy change): every
// replica's reconciler wakes, so that the one holding the node's stream
// acts at once rather than at its next tick.
const ReconcileTopic = "reconcile"

// PushTopic is the topic notified when a replica placed a Workspace on a
// node whose stream another replica holds: every replica wakes, and the
// one holding the stream pushes it.
const PushTopic = "push"

// NodesTopic is the topic notified after a commit that changed a node's
// record other than its last_seen: a registration (a Hello, with its new
// connection epoch) or an Inventory. Every replica's reconciler re-reads
// the node records that changed (by their revision), so that each one
// knows every node whichever replica holds its stream.
const NodesTopic = "nodes"

// WorkspaceTopic is the topic notified when a command of the Workspace
// completes.
func WorkspaceTopic(workspaceID string) string { return "workspace/" + workspaceID }

// LocalNotifier is a Notifier within one process: Notify wakes the
// subscribers of this process only. It is the SQLite store's Notifier (one
// replica by design); the PostgreSQL store holds its waiters in one and
// carries notifications between replicas on top of it. The zero value is
// ready to use.
//
// Subscribe and Notify cost O(1): the subscribers of a topic share one
// channel, closed by Notify and dropped when the last one is released.
type LocalNotifier struct {
	mu     sync.Mutex
	topics map[string]*waiters
	total  int // subscriptions neither notified nor released
}

// waiters are the current subscribers of a topic.
type waiters struct {
	ch chan struct{}
	n  int // subscriptions not released yet
}

var _ Notifier = (*LocalNotifier)(nil)

// Subscribe implements Notifier.
func (l *LocalNotifier) Subscribe(topic string) (<-chan struct{}, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.topics == nil {
		l.topics = map[string]*waiters{}
	}
	w := l.topics[topic]
	if w == nil {
		w = &waiters{ch: make(chan struct{})}
		l.topics[topic] = w
	}
	w.n++
	l.total++
	released := false
	return w.ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if released {
			return
		}
		released = true
		if l.topics[topic] != w {
			return // notified already
		}
		w.n--
		l.total--
		if w.n == 0 {
			delete(l.topics, topic)
		}
	}
}

// Notify implements Notifier.
func (l *LocalNotifier) Notify(topic string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.topics[topic]; w != nil {
		close(w.ch)
		l.total -= w.n
		delete(l.topics, topic)
	}
}

// NotifyAll wakes every current subscriber, of every topic: for a carrier
// of notifications that may have missed some (a connection lost).
func (l *LocalNotifier) NotifyAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for topic, w := range l.topics {
		close(w.ch)
		delete(l.topics, topic)
	}
	l.total = 0
}

// Waiters returns the number of subscriptions neither notified nor
// released yet: how many requests wait now, zero once every one has gone.
func (l *LocalNotifier) Waiters() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// PrefixWaiters returns the number of subscriptions neither notified nor
// released yet of the topics that start with prefix: with
// WorkspaceTopic's prefix, the requests that wait for a Workspace's
// commands, apart from the standing subscriptions ctrl keeps while it runs.
func (l *LocalNotifier) PrefixWaiters(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for topic, w := range l.topics {
		if strings.HasPrefix(topic, prefix) {
			n += w.n
		}
	}
	return n
}

// TopicWaiters returns the number of subscriptions of topic neither
// notified nor released yet.
func (l *LocalNotifier) TopicWaiters(topic string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.topics[topic]; w != nil {
		return w.n
	}
	return 0
}
