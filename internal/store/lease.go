package store

import (
	"context"
	"time"
)

// Lease is one row of the leases table: which ctrl replica holds the named
// work, until when, and its fencing token.
type Lease struct {
	Name   string
	Holder string // "" before anyone acquired it
	// Fence increases by one at every change of holder (never on a
	// renewal), so that work stamped with a fence tells which tenure did it.
	Fence     int64
	ExpiresAt time.Time
}

// Held reports whether holder holds l at now.
func (l Lease) Held(holder string, now time.Time) bool {
	return holder != "" && l.Holder == holder && now.Before(l.ExpiresAt)
}

// LeaseTx is the lease operation of a transaction (internal/lease).
type LeaseTx interface {
	// AcquireLease acquires or renews the lease name for holder until
	// now+ttl and returns the row as it stands after the call. holder gets
	// it when it holds it already (a renewal: the fence stays) or when the
	// current claim expired at now or nobody held it (a takeover: the
	// fence increases); otherwise the row is returned unchanged and
	// Lease.Held is false for holder. Two transactions racing for the same
	// name serialize on its row: one of them gets it.
	AcquireLease(ctx context.Context, name, holder string, now time.Time, ttl time.Duration) (Lease, error)
	// GetLease reads the lease row name as the transaction sees it, for a
	// holder's check inside the transaction of a unit of its work
	// (lease.Keeper.Check): a plain read, so that under PostgreSQL's
	// SERIALIZABLE isolation a takeover committed concurrently makes one of
	// the two transactions fail instead of both committing out of order.
	// ErrNotFound when nobody ever tried to acquire it.
	GetLease(ctx context.Context, name string) (Lease, error)
}

// NextLease is the rule AcquireLease applies to the row cur: the row after
// holder's attempt at now, and whether it changed.
func NextLease(cur Lease, holder string, now time.Time, ttl time.Duration) (Lease, bool) {
	switch {
	case cur.Holder == holder:
		cur.ExpiresAt = now.Add(ttl)
	case cur.Holder == "" || !now.Before(cur.ExpiresAt):
		cur.Holder, cur.Fence, cur.ExpiresAt = holder, cur.Fence+1, now.Add(ttl)
	default:
		return cur, false
	}
	return cur, true
}
