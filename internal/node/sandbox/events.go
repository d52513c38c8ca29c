package sandbox

import (
	"sync"
	"time"
)

// EventKind classifies an Event.
type EventKind string

// The events.
const (
	// EventExited: the execution ended without being stopped (crash, PID 1
	// killed, OOM of PID 1). What it held has been released unless
	// Event.Err says otherwise.
	EventExited EventKind = "exited"
	// EventGuestExited: the guest powered itself off (poweroff inside, or
	// SIGTERM to PID 1) after writing back; ctrl records a guest-shutdown
	// command. Released like EventExited.
	EventGuestExited EventKind = "guest_exited"
	// EventCondition: the guest's condition changed (including
	// UNRESPONSIVE from missed health pings). A changed message alone is
	// not an event; Status has the latest.
	EventCondition EventKind = "condition"
)

// Event is something that happened to an execution without being asked.
type Event struct {
	Kind        EventKind
	WorkspaceID string
	Generation  uint64
	Condition   GuestCondition
	Message     string
	// Err is set when an exited execution could not be released; it is
	// still held (Status.Running false) and a forced Stop retries.
	Err  error
	Time time.Time
}

// emit queues ev, stamped with the current time unless it has one.
func (r *Runtime) emit(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	r.events.push(ev)
}

// Events delivers exits and guest condition changes. It is closed by Close.
// Events queue without bound until read.
func (r *Runtime) Events() <-chan Event { return r.events.out }

// eventQueue is an unbounded FIFO between the runtime (push never blocks)
// and the reader of Events (out); close ends out without delivering the
// rest.
type eventQueue struct {
	mu     sync.Mutex
	q      []Event
	wake   chan struct{}
	out    chan Event
	done   chan struct{}
	closed bool
}

// newEventQueue starts the goroutine that delivers the queue (run).
func newEventQueue() *eventQueue {
	q := &eventQueue{wake: make(chan struct{}, 1), out: make(chan Event), done: make(chan struct{})}
	go q.run()
	return q
}

// push queues ev (dropped once closed) and wakes run.
func (q *eventQueue) push(ev Event) {
	q.mu.Lock()
	if !q.closed {
		q.q = append(q.q, ev)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// close stops delivery; run then closes out.
func (q *eventQueue) close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.done)
	}
	q.mu.Unlock()
}

// run hands the queued events to out, oldest first, until close.
func (q *eventQueue) run() {
	defer close(q.out)
	for {
		q.mu.Lock()
		if len(q.q) == 0 {
			q.mu.Unlock()
			select {
			case <-q.wake:
				continue
			case <-q.done:
				return
			}
		}
		ev := q.q[0]
		q.mu.Unlock()
		select {
		case q.out <- ev:
			q.mu.Lock()
			q.q = q.q[1:]
			q.mu.Unlock()
		case <-q.done:
			return
		}
	}
}
