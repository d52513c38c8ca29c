package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// GuestCondition is what the guest reports (READY, BOOTING, UNRESPONSIVE,
// DISK_PRESSURE, MEMORY_PRESSURE).
type GuestCondition = protocol.Condition

// The guest conditions.
const (
	GuestUnspecified    = protocol.ConditionUnspecified
	GuestReady          = protocol.ConditionReady
	GuestBooting        = protocol.ConditionBooting
	GuestUnresponsive   = protocol.ConditionUnresponsive
	GuestDiskPressure   = protocol.ConditionDiskPressure
	GuestMemoryPressure = protocol.ConditionMemoryPressure
)

// startHealth starts the health pings of e (health); they end with
// stopHealth, e's end or Close.
func (r *Runtime) startHealth(e *execution) {
	ctx, cancel := context.WithCancel(r.ctx)
	e.mu.Lock()
	e.healthCancel = cancel
	e.mu.Unlock()
	go r.health(ctx, e)
}

// stopHealth ends the health pings of e.
func (r *Runtime) stopHealth(e *execution) {
	e.mu.Lock()
	if e.healthCancel != nil {
		e.healthCancel()
	}
	e.mu.Unlock()
}

// health pings the guest every HealthInterval and records its condition;
// after UnresponsiveAfter failed pings in a row the guest is UNRESPONSIVE.
// A ping fails when the guest does not answer within HealthTimeout, answers
// more than protocol.MaxResponse, does not state the node's protocol
// version (ErrGuestProtocol), or reports a condition it may not
// (protocol.Condition.Reported); its message is clipped to
// protocol.MaxText.
// A change of condition is an EventCondition, except while e stops.
func (r *Runtime) health(ctx context.Context, e *execution) {
	t := time.NewTicker(r.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.done:
			return
		case <-t.C:
		}
		if e.isStopping() {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, r.cfg.HealthTimeout)
		c, m, err := r.ping(pctx, e)
		cancel()
		if ctx.Err() != nil {
			return
		}
		e.mu.Lock()
		prev := e.cond
		if err == nil {
			e.misses = 0
			e.cond, e.msg = c, m
		} else {
			e.misses++
			if e.misses >= r.cfg.UnresponsiveAfter {
				e.cond, e.msg = GuestUnresponsive, fmt.Sprintf("%d health pings failed: %v", e.misses, err)
			}
		}
		cond, msg, gen := e.cond, e.msg, e.st.Generation
		stopping := e.stopping
		e.mu.Unlock()
		if !stopping && cond != prev {
			r.emit(Event{Kind: EventCondition, WorkspaceID: e.ws, Generation: gen, Condition: cond, Message: msg})
		}
	}
}
