package kibotos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// CallOption configures one write of the workspace layer. An option that
// does not apply to the write is an error, reported before anything is
// sent.
type CallOption func(*callOptions)

type callOptions struct {
	commandID      string
	retry          *RetryPolicy
	force          bool
	stopExpiration *ctrlv1.ExpirationSpec
}

// WithCommandID sends the write with id as its command ID instead of a
// fresh one (NewCommandID). Give the ID you saved to resend a write whose
// result you lost: the same ID with the same input replays the first
// result and never executes twice. The SDK does not check it (see
// ValidateCommandID); the server refuses a malformed one.
func WithCommandID(id string) CallOption {
	return func(o *callOptions) { o.commandID = id }
}

// WithRetryPolicy resends the write under p instead of the Client's default
// policy (WithDefaultRetryPolicy); RetryPolicy{MaxAttempts: 1} sends it
// once.
func WithRetryPolicy(p RetryPolicy) CallOption {
	return func(o *callOptions) { o.retry = &p }
}

// WithForce makes a stop forced (STOP_MODE_FORCE): no wait for guest
// writers, one short best-effort sync; the latest writes may be lost. Stop
// only.
func WithForce() CallOption {
	return func(o *callOptions) { o.force = true }
}

// WithStopExpiration sets the expiration the stop commits in its admission
// (StopWorkspaceRequest.expiration; needs the capability
// workspace.expiration). Stop only.
func WithStopExpiration(e *ctrlv1.ExpirationSpec) CallOption {
	return func(o *callOptions) { o.stopExpiration = e }
}

// applyOptions applies opts and refuses the ones the procedure does not
// take.
func applyOptions(procedure string, opts []CallOption) (callOptions, error) {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	if procedure != ctrlv1connect.WorkspaceServiceStopWorkspaceProcedure && (o.force || o.stopExpiration != nil) {
		return o, fmt.Errorf("kibotos: %s: WithForce and WithStopExpiration apply only to StopWorkspace", method(procedure))
	}
	return o, nil
}

// ExpirationRevision is the expected expiration revision
// (expected_expiration_revision) that StopWorkspace, StartWorkspace and
// DeleteWorkspace require, even when no expiration is armed. Make one with
// ExpectExpirationRevision or CurrentExpirationRevision; the zero value is
// refused, so there is no silent default.
type ExpirationRevision struct {
	n       uint64
	current bool
}

// ExpectExpirationRevision expects the expiration revision n (the
// Workspace's expiration.revision as you last read it; revisions start at
// 1). When the revision has moved, the write fails with
// failed_precondition (reason EXPIRATION_REVISION_MISMATCH), settled.
func ExpectExpirationRevision(n uint64) ExpirationRevision {
	return ExpirationRevision{n: n}
}

// CurrentExpirationRevision reads the Workspace (GetWorkspace) once, before
// the first attempt, and expects the expiration revision it has then. It is
// an explicit opt-out of the protection the revision gives: the write
// applies whatever expiration is armed at that moment. The revision is
// never read again for the same command: resends carry the same request,
// and after a refusal (failed_precondition, aborted) the SDK returns the
// error; reading the Workspace again and deciding is the caller's part.
func CurrentExpirationRevision() ExpirationRevision {
	return ExpirationRevision{current: true}
}

func (r ExpirationRevision) String() string {
	switch {
	case r.current:
		return "current"
	case r.n == 0:
		return "unset"
	}
	return fmt.Sprint(r.n)
}

// ErrNoExpirationRevision is returned, before anything is sent, by a stop,
// start or delete given the zero ExpirationRevision (or
// ExpectExpirationRevision(0)).
var ErrNoExpirationRevision = errors.New("kibotos: an expected expiration revision is required: give ExpectExpirationRevision(n) or CurrentExpirationRevision()")

// WriteError is the error of a write the SDK sent. It names the command ID
// the request carried, so that a caller who did not prepare the command
// can still resend it (WithCommandID) or look it up (WaitWorkspaceCommand).
// It wraps the last error of the request: Detail, Reason, IsRetryable,
// IsSettled and connect.CodeOf read through it.
type WriteError struct {
	// Procedure is the procedure called.
	Procedure string
	// CommandID is the command ID of the request.
	CommandID string
	// Err is the last error of the request.
	Err error
}

func (e *WriteError) Error() string {
	return fmt.Sprintf("%s (command ID %s): %v", method(e.Procedure), e.CommandID, e.Err)
}

func (e *WriteError) Unwrap() error { return e.Err }

// method is the method name of a procedure.
func method(procedure string) string {
	return procedure[strings.LastIndex(procedure, "/")+1:]
}

// PreparedCommand is a workspace write built but not sent: its request and
// command ID are fixed, so the ID can be saved before anything reaches the
// server (Workspaces.PrepareCreate, Workspace.PrepareStop, PrepareStart,
// PrepareDelete).
//
// Do sends it. Calling Do again resends the same request with the same
// command ID, which replays the first result: that is how a write whose
// result was lost is recovered. A new attempt after a settled failure
// needs a new PreparedCommand, and a new ID, which is the caller's
// decision. Do is safe for concurrent use; calls take turns.
type PreparedCommand struct {
	c         *Client
	procedure string
	id        string
	policy    RetryPolicy
	ws        *Workspace // the Workspace written; nil for a create until it is accepted
	current   bool       // read the expiration revision before the first attempt
	req       proto.Message
	setRev    func(uint64)
	send      func(ctx context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error)

	mu     sync.Mutex
	frozen bool // the request is final: the revision was read or given
}

// CommandID returns the command ID the request carries.
func (p *PreparedCommand) CommandID() string { return p.id }

// Procedure returns the procedure Do calls, such as
// "/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace".
func (p *PreparedCommand) Procedure() string { return p.procedure }

// Do sends the command and returns the Workspace it wrote, whose last
// command is this one.
//
// Before sending, it checks the request against the server's capabilities
// (ServerInfo): a missing one returns a *MissingCapabilityError and sends
// nothing. With CurrentExpirationRevision, the first Do reads the Workspace
// once. Then it sends the request under the retry policy (see Retry): the
// same request, with the same command ID, while the result is unknown or
// the failure retryable and not settled. An error after sending is a
// *WriteError. For a create, the Workspace is nil until the server accepted
// it; for the other writes it is the handle the command was prepared on.
//
// CreateWorkspace and StartWorkspace return on acceptance: call Wait on the
// Workspace to wait for completion. StopWorkspace and DeleteWorkspace
// return on completion (the server waits up to a minute and otherwise
// answers a retryable unavailable, which is resent).
func (p *PreparedCommand) Do(ctx context.Context) (*Workspace, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	info, err := p.c.serverInfo(ctx, p.policy)
	if err != nil {
		return p.ws, err
	}
	if err := MissingRequestCapability(info, p.procedure, p.req); err != nil {
		return p.ws, err
	}
	if !p.frozen && p.current {
		if err := MissingCapability(info, ctrlv1connect.WorkspaceServiceGetWorkspaceProcedure); err != nil {
			return p.ws, err
		}
		w, err := p.c.getWorkspace(ctx, p.policy, p.ws.ID())
		if err != nil {
			return p.ws, err
		}
		p.ws.observe(w, nil)
		p.setRev(w.GetExpiration().GetRevision())
	}
	p.frozen = true
	if p.ws != nil {
		p.ws.sending(p.id)
	}
	var (
		w   *ctrlv1.Workspace
		cmd *ctrlv1.WorkspaceCommand
	)
	err = Retry(ctx, p.policy, func(ctx context.Context) error {
		var err error
		w, cmd, err = p.send(ctx)
		return err
	})
	if err != nil {
		if d, ok := Detail(err); ok && p.ws != nil && d.GetObservedWorkspace().GetWorkspaceId() == p.ws.ID() {
			p.ws.observe(d.GetObservedWorkspace(), nil)
		}
		return p.ws, &WriteError{Procedure: p.procedure, CommandID: p.id, Err: err}
	}
	if p.ws == nil {
		p.ws = &Workspace{c: p.c, id: w.GetWorkspaceId(), cmdID: p.id}
	}
	p.ws.observe(w, cmd)
	return p.ws, nil
}
