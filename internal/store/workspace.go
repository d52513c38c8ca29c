package store

import (
	"context"
	"time"
)

// KindWorkspace is the label kind of Workspaces.
const KindWorkspace ResourceKind = "workspace"

// WorkspaceStateDeleted is the Workspace.State of a Workspace whose deletion
// completed: kibotos.ctrl.v1.WorkspaceState WORKSPACE_STATE_DELETED (pinned
// by TestStoredEnums). Listings leave these out unless asked, and both
// dialects' partial indexes (workspaces_live) test it as a literal.
const WorkspaceStateDeleted int32 = 8

// Power is the desired power state of a Workspace.
type Power int

// Desired power states, stored in workspaces.power. The values are the
// store's own (the reconciler maps them to kibotos.node.v1.Power); being
// stored, they must never change (TestStoredEnums pins them).
const (
	PowerRunning Power = 1
	PowerStopped Power = 2
	PowerDeleted Power = 3
)

// ExecState is what the node last reported about a Workspace's execution.
type ExecState int

// Observed execution states, stored in workspaces.observed_state. The values
// are the store's own, NOT those of kibotos.node.v1.ExecState (the
// reconciler maps one to the other); being stored, they must never change
// (TestStoredEnums pins them).
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
	State          int32 // kibotos.ctrl.v1.WorkspaceState
	GuestCondition int32 // kibotos.ctrl.v1.GuestCondition of the current observation, 0 when none
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

	// Network (issue 12). PolicyDrainSeconds is the drain_seconds of the
	// policy change that produced the current policy revision, sent to the
	// node with the policy. ExecDNSVersion is the DNS configuration version
	// the node last reported for the execution, 0 when none was (an
	// execution started by an earlier release).
	PolicyDrainSeconds uint32
	ExecDNSVersion     uint32

	// ExpirationDeadline is when the Workspace's armed expiration falls due,
	// zero when none is armed (the query column of internal/expiration,
	// kept equal to Doc by workspace.Save).
	ExpirationDeadline time.Time

	// MemoryMiB (Resources.memory_mib) and LayerBytes
	// (WritableLayer.capacity_bytes) are what the Workspace asks of its
	// node: the query columns NodeUsage sums, kept equal to Doc by
	// workspace.Save.
	MemoryMiB  uint64
	LayerBytes uint64

	// CPUMillis (Resources.cpu_millis) is what the Workspace asks of its
	// node's CPU, summed by NodeUsage. TemplateKey is TemplateKey of the
	// Workspace's TemplateRef, counted by CountWorkspacesWithTemplate. Both
	// are query columns kept equal to Doc by workspace.Save.
	CPUMillis   uint64
	TemplateKey string
}

// TemplateKey is the Workspace.TemplateKey of a Workspace bound to version
// of Template templateID: "<templateID>@<version>", "" when templateID is
// empty (no Template).
func TemplateKey(templateID, version string) string {
	if templateID == "" {
		return ""
	}
	return templateID + "@" + version
}

// NodeUsage is what the Workspaces placed on a node whose deletion has not
// completed ask of it.
type NodeUsage struct {
	RunningMemoryMiB uint64 // MemoryMiB of those whose Power is PowerRunning
	LayerBytes       uint64 // LayerBytes of all of them
	RunningCPUMillis uint64 // CPUMillis of those whose Power is PowerRunning
}

// ArmedExpiration is an armed expiration deadline of a Workspace.
type ArmedExpiration struct {
	WorkspaceID string
	Deadline    time.Time
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

// WorkspaceTx are the Workspace operations of a transaction.
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
	// NodeUsage sums the query columns MemoryMiB, CPUMillis and LayerBytes
	// of the Workspaces WorkspacesOnNode returns, reading only an index of
	// them (never their documents).
	NodeUsage(ctx context.Context, nodeID string) (NodeUsage, error)
	// NodeUsages is NodeUsage of every node that has such Workspaces, in
	// one read of the same index (placement weighs all connected nodes at
	// once); a node absent from the map has none.
	NodeUsages(ctx context.Context) (map[string]NodeUsage, error)
	// CountWorkspacesWithTemplate counts the Workspaces whose deletion has
	// not completed (those WorkspacesOnNode returns, whatever their node,
	// placed or not) whose TemplateKey is templateKey: a search of an
	// index of their template keys (never their documents).
	CountWorkspacesWithTemplate(ctx context.Context, templateKey string) (int, error)
	// PendingWorkspaces returns up to limit Workspaces whose Generation is
	// ahead of ObservedGeneration or that wait for placement (NodeID ""),
	// deleted ones excluded, oldest first. Workspaces that are not placed
	// and have no command (a placement that failed; they wait for a new
	// command) are excluded too, so that they never crowd out real work.
	PendingWorkspaces(ctx context.Context, limit int) ([]*Workspace, error)
	// DueExpirations returns up to limit armed expirations whose deadline
	// is at or before before, in (Deadline, WorkspaceID) order, starting
	// after the cursor after (nil: from the first). It reads only an index
	// of the armed deadlines.
	DueExpirations(ctx context.Context, before time.Time, after *ArmedExpiration, limit int) ([]ArmedExpiration, error)
	// NextExpiration returns the earliest armed deadline later than after;
	// ok is false when there is none.
	NextExpiration(ctx context.Context, after time.Time) (deadline time.Time, ok bool, err error)
}
