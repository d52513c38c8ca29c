package store

import (
	"context"
	"time"
)

// ResourceKind is the kind of a Resource, and the kind of the labels of an object
// (labels of Workspaces have KindWorkspace).
type ResourceKind string

// Resource kinds defined here; other packages define their own (enrollments
// are internal/enrollment.ResourceKind).
const (
	KindEgress   ResourceKind = "egress"
	KindResolver ResourceKind = "resolver"
)

// Resource is a stored object with a spec, labels and annotations, each under
// its own revision: Egresses and Resolvers, and enrollments (whose Spec is
// internal/enrollment's record). The store does not know the kinds; any
// object of that shape fits.
type Resource struct {
	Kind                ResourceKind
	ID                  string
	CreatedAt           time.Time // UTC, microsecond precision
	UpdatedAt           time.Time
	Revision            uint64
	Spec                []byte // encoded by the caller; may hold secrets
	Labels              map[string]string
	LabelsRevision      uint64
	Annotations         map[string]string
	AnnotationsRevision uint64
	// DrainSeconds is the drain_seconds of the update that produced
	// Revision (Egresses: UpdateEgress's). Internal: never part of the
	// public object.
	DrainSeconds uint32
}

// Cursor positions a keyset page: the (CreatedAt, ID) of the last item
// returned.
type Cursor struct {
	CreatedAt time.Time
	ID        string
}

// ListQuery selects a page of resources.
type ListQuery struct {
	Kind     ResourceKind
	Selector map[string]string // every entry must be a label with that value
	After    *Cursor           // nil starts at the beginning
	Limit    int
}

// ResourceTx are the Resource operations of a transaction.
type ResourceTx interface {
	// GetResource returns a resource of kind, or ErrNotFound.
	GetResource(ctx context.Context, kind ResourceKind, id string) (*Resource, error)
	// InsertResource stores a new resource with its labels; ErrDuplicate when
	// the ID is taken.
	InsertResource(ctx context.Context, r *Resource) error
	// UpdateResource replaces every mutable field of a resource (spec,
	// revisions, updated_at, labels, annotations); ErrNotFound when absent.
	UpdateResource(ctx context.Context, r *Resource) error
	// DeleteResource removes a resource and its labels; ErrNotFound when
	// absent.
	DeleteResource(ctx context.Context, kind ResourceKind, id string) error
	// ListResources returns up to q.Limit resources of q.Kind in (CreatedAt,
	// ID) order after q.After, carrying every q.Selector entry as a label.
	ListResources(ctx context.Context, q ListQuery) ([]*Resource, error)
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

// ReferenceTx are the operations of a transaction on the references from
// Workspace policies to resources.
type ReferenceTx interface {
	// SetReferences replaces the references a Workspace's policy makes. A
	// Workspace whose deletion completed must have none.
	SetReferences(ctx context.Context, workspaceID string, refs []Reference) error
	// CountReferences counts the Workspaces that reference target with kind.
	CountReferences(ctx context.Context, kind RefKind, targetID string) (int, error)
	// ReferencingWorkspaces returns the IDs of the Workspaces that reference
	// target with kind, in ID order (nil when none).
	ReferencingWorkspaces(ctx context.Context, kind RefKind, targetID string) ([]string, error)
}
