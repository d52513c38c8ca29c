// Package store defines the persistence interfaces of ctrl. Two dialects
// implement them: store/sqlite (the embedded default) and store/postgres (for
// several ctrl replicas). store/storetest is one conformance suite that both
// must pass.
//
// Every write happens inside Store.InTx; every read inside Store.View. The
// store speaks only in the types of this package: encoding API messages is the
// callers' business, so Spec and Result fields are opaque bytes.
//
// A Store is also a Notifier: the code that commits a change (a command
// completed) notifies a topic, and the requests that wait for that change
// wake up and re-read the store.
package store

import (
	"context"
	"errors"
)

// Errors returned by every dialect.
var (
	// ErrNotFound: the row does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrDuplicate: a row with that primary key exists already.
	ErrDuplicate = errors.New("store: duplicate key")
	// ErrReadOnly: a write was attempted inside View.
	ErrReadOnly = errors.New("store: write in a read-only transaction")
)

// Store is a transactional store.
type Store interface {
	// InTx runs fn in one serializable write transaction and commits when fn
	// returns nil. fn may run more than once (the dialect retries
	// serialization failures), so it must not have effects outside tx. An
	// error from fn rolls back everything fn wrote and is returned as is.
	// Commit is durable (fsync'd) before InTx returns nil.
	InTx(ctx context.Context, fn func(Tx) error) error
	// View runs fn in a read-only transaction with a consistent snapshot.
	View(ctx context.Context, fn func(Tx) error) error
	// TouchNodes records when nodes were last heard: the last_seen of each
	// touch's node becomes its Seen when the node's stored epoch is the
	// touch's, and nothing else of the node changes (not its revision).
	// It returns the IDs of the touches that wrote nothing: the node is
	// missing, or a newer stream superseded the one that heard it. It is
	// one write for every touch, outside InTx and not serializable:
	// last_seen is a liveness hint on which no write transaction's
	// invariant rests (a transaction that read the older value is ordered
	// before the touch), so on PostgreSQL it is one READ COMMITTED
	// statement with which no serializable transaction can conflict.
	TouchNodes(ctx context.Context, touches []NodeTouch) (stale []string, err error)
	// Secret returns the named server secret, creating it with create() on
	// first use; every replica sharing the store gets the same value.
	Secret(ctx context.Context, name string, create func() []byte) ([]byte, error)
	// Ping checks the store is reachable.
	Ping(ctx context.Context) error
	// Close releases the store.
	Close() error
	// Notifier wakes the requests that wait for a change (see Notifier).
	Notifier
}

// Tx is the set of operations available inside a transaction: one interface
// per stored object, so that a function that needs only some of them can say
// which. Every dialect's transaction implements all of them.
type Tx interface {
	CommandTx
	ResourceTx
	ReferenceTx
	WorkspaceTx
	NodeTx
	BlobTx
	RetentionTx
	LeaseTx
}
