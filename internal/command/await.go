package command

import (
	"context"
	"time"

	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// Awaiter waits for recorded commands of one kind of object to complete:
// the waits of StopWorkspace, DeleteWorkspace, ResizeWorkspaceWritableLayer,
// GetWorkspaceCommand's wait_timeout and the Volume commands.
type Awaiter struct {
	// Store is read and subscribed to.
	Store store.Store
	// Read reads a command by ID, refusing one of another kind of object.
	Read func(ctx context.Context, id string) (*store.Command, error)
	// Topic is the Notifier topic that a completion of a command on the
	// object objectID is notified on.
	Topic func(objectID string) string
	// Recheck is how often the store is read again besides the
	// notifications, so that a missed one costs at most that; zero is
	// store.RecheckInterval.
	Recheck time.Duration
	// Retrieve names where the caller reads the command later
	// ("GetWorkspaceCommand"), for the message of a timeout.
	Retrieve string
}

func (a Awaiter) recheck() time.Duration {
	if a.Recheck > 0 {
		return a.Recheck
	}
	return store.RecheckInterval
}

// Await waits until command id is COMPLETED or d passes, and returns it as
// it is then; done reports whether it completed. It wakes on the
// notifications of the command's object (objectID when the caller knows it,
// else the one the command names) and re-reads the store every Recheck
// besides.
func (a Awaiter) Await(ctx context.Context, id, objectID string, d time.Duration) (rec *store.Command, done bool, err error) {
	limit := time.NewTimer(d)
	defer limit.Stop()
	recheck := time.NewTimer(a.recheck())
	defer recheck.Stop()
	var (
		topic   string
		changed <-chan struct{}
		release = func() {}
	)
	defer func() { release() }()
	subscribe := func(t string) {
		release()
		topic = t
		changed, release = a.Store.Subscribe(t)
	}
	if objectID != "" {
		subscribe(a.Topic(objectID))
	}
	for {
		if rec, err = a.Read(ctx, id); err != nil {
			return nil, false, err
		}
		if rec.Status == store.CommandCompleted {
			return rec, true, nil
		}
		if t := a.Topic(rec.ObjectID); t != topic {
			// Subscribe, then read again: a completion committed after
			// that read cannot be missed.
			subscribe(t)
			continue
		}
		select {
		case <-changed:
			subscribe(topic) // before the next read, for the same reason
		case <-recheck.C:
			recheck.Reset(a.recheck())
		case <-limit.C:
			if rec, err = a.Read(ctx, id); err != nil {
				return nil, false, err
			}
			return rec, rec.Status == store.CommandCompleted, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// Wait blocks until command id completes or bound passes. A completed
// failure is returned as its recorded error; past the bound the answer is a
// retryable unavailable (TIMED_OUT) while the command goes on.
func (a Awaiter) Wait(ctx context.Context, id, objectID string, bound time.Duration) (*store.Command, error) {
	rec, done, err := a.Await(ctx, id, objectID, bound)
	switch {
	case err != nil:
		return nil, err
	case !done:
		fe := fault.Unavailable(fault.ReasonTimedOut, "command %q has not completed within %s; it goes on: resend the same command ID or read %s", id, bound, a.Retrieve)
		fe.Stage = "wait"
		return nil, fe
	case rec.ErrorCode != "":
		return nil, fault.Decode(rec.ErrorCode, rec.ErrorDetail)
	}
	return rec, nil
}
