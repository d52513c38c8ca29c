package store

import (
	"context"
	"time"
)

// CommandStatus is the progress of a recorded command.
type CommandStatus int

// Command statuses, stored in commands.status; the values are those of
// kibotos.ctrl.v1.WorkspaceCommandStatus (pinned by TestStoredEnums).
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
	ErrorCode   string // the fault Kind's name on failure (the same string as the Connect code's), "" on success
	ErrorDetail []byte // encoded ErrorDetail on failure
	CreatedAt   time.Time
	CompletedAt time.Time // zero while processing
	// Message says why ctrl started a command of its own (initiator
	// EXPIRATION, HOST_MEMORY, GUEST_SHUTDOWN, NODE_DRAIN), "" for a caller's; at most
	// MaxCommandMessage bytes of UTF-8. It is recorded with the command and
	// never updated.
	Message string
	// Caller is who sent the command: the subject of the caller's Operator
	// certificate (internal/caller), "" for a command ctrl started itself.
	// It is recorded with the command and never updated, and is never a
	// secret.
	Caller string
}

// MaxCommandMessage bounds Command.Message (the API's
// WorkspaceCommand.message).
const MaxCommandMessage = 1024

// CommandTx are the Command operations of a transaction.
type CommandTx interface {
	// LockCommand serializes transactions that use the same command ID (a
	// no-op where the dialect has a single writer).
	LockCommand(ctx context.Context, commandID string) error
	// GetCommand returns the recorded command, or ErrNotFound.
	GetCommand(ctx context.Context, commandID string) (*Command, error)
	// InsertCommand records a command; ErrDuplicate when its ID is taken.
	InsertCommand(ctx context.Context, c *Command) error
	// UpdateCommand replaces the mutable fields (Status, Result, ErrorCode,
	// ErrorDetail, CompletedAt) of a recorded command, keeping the others
	// (Message and Caller included); ErrNotFound when absent.
	UpdateCommand(ctx context.Context, c *Command) error
	// ProcessingCommands returns the commands of objectKind still
	// PROCESSING, oldest first.
	ProcessingCommands(ctx context.Context, objectKind string, limit int) ([]*Command, error)
}
