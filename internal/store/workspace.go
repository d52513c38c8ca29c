package store

import (
	"context"
	"time"
)

// KindWorkspace is the label kind of Workspaces.
const KindWorkspace Kind = "workspace"

// Power is the desired power state of a Workspace.
type Power int

// Desired power states.
const (
	PowerRunning Power = 1
	PowerStopped Power = 2
	PowerDeleted Power = 3
)

// ExecState is what the node last reported about a Workspace's execution.
type ExecState int

// Observed execution states.
const (
	ExecNone     ExecState = 0 // nothing reported yet
	ExecRunning  ExecState = 1 // running, guest ready
	ExecStopped  ExecState = 2 // no execution; layer kept
	ExecFailed   ExecState = 3 // the last desired generation failed; see HoldsExecution
	ExecDeleted  ExecState = 4 // everything released
	ExecStarting ExecState = 5 // started, guest not ready yet
)

// Workspace is a stored Workspace: the public object as an opaque document
// plus the columns ctrl queries and the desired and observed state the
// reconciler drives together.
type Workspace struct {
	ID        string
	CreatedAt time.Time
	UpdatedAt time.Time
	DeletedAt time.Time // zero unless deletion completed

	// Doc is the encoded public Workspace (kibotos.ctrl.v1.Workspace), the
	// authority for its spec, annotations and revisions. Labels are stored
	// in the labels table and also in Doc.
	Doc    []byte
	Labels map[string]string

	// Query columns, kept equal to what Doc says.
	State          int32 // WorkspaceState
	GuestCondition int32 // GuestCondition of the current observation, 0 when none
	NodeID         string

	// Desired state.
	Power      Power
	ForceStop  bool   // the pending stop (or delete) is forced
	Generation uint64 // bumped by every change the node must act on
	CommandID  string // the command that waits for Generation, "" when none

	// Observed state (from the node's reports).
	ObservedGeneration uint64
	ObservedState      ExecState
	HoldsExecution     bool
	ObservedAt         time.Time
}

// WorkspaceQuery selects a page of Workspaces.
type WorkspaceQuery struct {
	States         []int32 // when non-empty, only these states
	IncludeDeleted bool    // include State == DELETED (ignored when States is set)
	GuestCondition int32   // when non-zero, only this condition
	Selector       map[string]string
	After          *Cursor
	Limit          int
}

// Node is a registered node.
type Node struct {
	ID           string
	CreatedAt    time.Time
	LastSeen     time.Time
	MemoryMiB    uint64 // capacity
	CPUMillis    uint64
	StorageBytes uint64
	Doc          []byte // encoded details, opaque to the store
	// CertKeyHash is the SHA-256 of the public key (PKIX) of the node
	// certificate issued at the node's latest enrollment; empty for a node
	// whose certificate was issued by hand. Only that key may connect.
	CertKeyHash []byte
}

// WorkspaceTx are the Workspace operations of a transaction. Every Tx
// implements them.
type WorkspaceTx interface {
	// GetWorkspace returns a Workspace, deleted ones included; ErrNotFound
	// when absent.
	GetWorkspace(ctx context.Context, id string) (*Workspace, error)
	// InsertWorkspace stores a new Workspace and its labels; ErrDuplicate
	// when the ID is taken.
	InsertWorkspace(ctx context.Context, w *Workspace) error
	// UpdateWorkspace replaces every mutable field (labels included);
	// ErrNotFound when absent.
	UpdateWorkspace(ctx context.Context, w *Workspace) error
	// ListWorkspaces returns a keyset page in (CreatedAt, ID) order.
	ListWorkspaces(ctx context.Context, q WorkspaceQuery) ([]*Workspace, error)
	// WorkspacesOnNode returns the Workspaces placed on a node whose
	// deletion has not completed, in (CreatedAt, ID) order.
	WorkspacesOnNode(ctx context.Context, nodeID string) ([]*Workspace, error)
	// PendingWorkspaces returns up to limit Workspaces whose Generation is
	// ahead of ObservedGeneration or that wait for placement (NodeID ""),
	// deleted ones excluded, oldest first. Workspaces that are not placed
	// and have no command (a placement that failed; they wait for a new
	// command) are excluded too, so that they never crowd out real work.
	PendingWorkspaces(ctx context.Context, limit int) ([]*Workspace, error)
	// ProcessingCommands returns the commands of objectKind still
	// PROCESSING, oldest first.
	ProcessingCommands(ctx context.Context, objectKind string, limit int) ([]*Command, error)

	// UpsertNode creates or replaces a node.
	UpsertNode(ctx context.Context, n *Node) error
	// GetNode returns a node; ErrNotFound when absent.
	GetNode(ctx context.Context, id string) (*Node, error)
	// ListNodes returns every node, by ID.
	ListNodes(ctx context.Context) ([]*Node, error)
}
