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
	"time"
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

// Tx is the set of operations available inside a transaction.
type Tx interface {
	// LockCommand serializes transactions that use the same command ID (a
	// no-op where the dialect has a single writer).
	LockCommand(ctx context.Context, commandID string) error
	// GetCommand returns the recorded command, or ErrNotFound.
	GetCommand(ctx context.Context, commandID string) (*Command, error)
	// InsertCommand records a command; ErrDuplicate when its ID is taken.
	InsertCommand(ctx context.Context, c *Command) error
	// UpdateCommand replaces the mutable fields (Status, Result, ErrorCode,
	// ErrorDetail, CompletedAt) of a recorded command; ErrNotFound when absent.
	UpdateCommand(ctx context.Context, c *Command) error

	// GetResource returns a resource of kind, or ErrNotFound.
	GetResource(ctx context.Context, kind Kind, id string) (*Resource, error)
	// InsertResource stores a new resource with its labels; ErrDuplicate when
	// the ID is taken.
	InsertResource(ctx context.Context, r *Resource) error
	// UpdateResource replaces every mutable field of a resource (spec,
	// revisions, updated_at, labels, annotations); ErrNotFound when absent.
	UpdateResource(ctx context.Context, r *Resource) error
	// DeleteResource removes a resource and its labels; ErrNotFound when
	// absent.
	DeleteResource(ctx context.Context, kind Kind, id string) error
	// ListResources returns up to q.Limit resources of q.Kind in (CreatedAt,
	// ID) order after q.After, carrying every q.Selector entry as a label.
	ListResources(ctx context.Context, q ListQuery) ([]*Resource, error)

	// SetReferences replaces the references a Workspace's policy makes. A
	// Workspace whose deletion completed must have none.
	SetReferences(ctx context.Context, workspaceID string, refs []Reference) error
	// CountReferences counts the Workspaces that reference target with kind.
	CountReferences(ctx context.Context, kind RefKind, targetID string) (int, error)

	WorkspaceTx
}

// Kind is the kind of a Resource.
type Kind string

// Resource kinds.
const (
	KindEgress   Kind = "egress"
	KindResolver Kind = "resolver"
)

// Resource is a stored object with a spec, labels and annotations, each under
// its own revision: Egresses and Resolvers.
type Resource struct {
	Kind                Kind
	ID                  string
	CreatedAt           time.Time // UTC, microsecond precision
	UpdatedAt           time.Time
	Revision            uint64
	Spec                []byte // encoded by the caller; may hold secrets
	Labels              map[string]string
	LabelsRevision      uint64
	Annotations         map[string]string
	AnnotationsRevision uint64
}

// Cursor positions a keyset page: the (CreatedAt, ID) of the last item
// returned.
type Cursor struct {
	CreatedAt time.Time
	ID        string
}

// ListQuery selects a page of resources.
type ListQuery struct {
	Kind     Kind
	Selector map[string]string // every entry must be a label with that value
	After    *Cursor           // nil starts at the beginning
	Limit    int
}

// CommandStatus is the progress of a recorded command.
type CommandStatus int

// Command statuses; the values match WorkspaceCommandStatus.
const (
	CommandProcessing CommandStatus = 1
	CommandCompleted  CommandStatus = 2
)

// Command is a recorded write: the idempotency record of a command ID.
type Command struct {
	ID          string
	Method      string // full RPC name, e.g. "kibotos.ctrl.v1.EgressService/CreateEgress"
	Fingerprint []byte // digest of the request input (without metadata)
	ObjectKind  string // "egress", "resolver", "workspace", ...
	ObjectID    string
	Kind        int // API command kind enum value, 0 when none
	Initiator   int // API CommandInitiator value
	Status      CommandStatus
	Result      []byte // encoded response on success
	ErrorCode   string // Connect code name on failure, "" on success
	ErrorDetail []byte // encoded ErrorDetail on failure
	CreatedAt   time.Time
	CompletedAt time.Time // zero while processing
}

// RefKind is how a Workspace policy references another object.
type RefKind string

// Reference kinds.
const (
	// RefEgress: the policy routes destinations or DNS through the Egress.
	RefEgress RefKind = "egress"
	// RefEgressUDP: the policy sends a udp Resolver's queries through the
	// Egress (needs udp_enabled).
	RefEgressUDP RefKind = "egress_udp"
	// RefResolver: the policy uses the Resolver.
	RefResolver RefKind = "resolver"
)

// Reference is one reference from a Workspace's policy.
type Reference struct {
	Kind     RefKind
	TargetID string
}
