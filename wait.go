package kibotos

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
)

// backoff is the polling schedule of WaitWorkspaceCommand.
type backoff struct{ initial, max time.Duration }

var defaultWaitBackoff = backoff{initial: 250 * time.Millisecond, max: 5 * time.Second}

// next returns the pause after d.
func (b backoff) next(d time.Duration) time.Duration {
	if d <= 0 {
		return b.initial
	}
	return min(d*3/2, b.max)
}

// Server-side waits: GetWorkspaceCommandRequest.wait_timeout.
const (
	minServerWait     = time.Millisecond
	maxServerWait     = 60 * time.Second
	defaultServerWait = 20 * time.Second
)

// WaitWorkspaceCommand waits until the command with ID commandID is
// COMPLETED and returns it. When the command completed with a failure it
// returns the command and that failure as an error (see CommandError).
//
// It first reads the server's capabilities (ServerInfo, once per Client)
// and checks that GetWorkspaceCommand is offered. When the server offers
// workspace.command.wait, each GetWorkspaceCommand waits on the server
// (wait_timeout, see WithServerWaitTimeout, never past ctx's deadline) and
// the next one is sent as soon as the last answer arrives; a server that
// refuses the wait (unimplemented, CAPABILITY_UNAVAILABLE: another replica
// of a deployment being upgraded) makes it poll for the rest of this call.
// Otherwise it polls, pausing longer between polls (see WithWaitBackoff).
//
// A read that fails transiently (an ErrorDetail that says retryable, or
// unavailable or deadline_exceeded without one) is repeated after a pause;
// any other failure, or the end of ctx, ends the wait with that error and
// the last command seen (nil if none).
//
// The ID is sent as it is: GetWorkspaceCommand reads existing commands,
// ctrl's own (expiration/..., host-memory/..., guest-shutdown/...) included.
func (c *Client) WaitWorkspaceCommand(ctx context.Context, commandID string) (*ctrlv1.WorkspaceCommand, error) {
	var (
		last     *ctrlv1.WorkspaceCommand
		pause    time.Duration
		info     *ctrlv1.GetServerInfoResponse
		longPoll bool
	)
	schedule := c.wait
	if schedule.initial <= 0 {
		schedule = defaultWaitBackoff
	}
	for {
		if info == nil {
			i, err := c.ServerInfo(ctx)
			switch {
			case err == nil:
				info = i
				longPoll = HasCapability(info, capability.WorkspaceCommandWait)
				pause = 0
				continue
			case ctx.Err() != nil || !transient(err):
				return last, err
			}
		} else {
			req := &ctrlv1.GetWorkspaceCommandRequest{CommandId: commandID}
			var timeout time.Duration
			if longPoll {
				timeout = c.serverWaitTimeout(ctx)
				req.WaitTimeout = durationpb.New(timeout)
			}
			if err := MissingRequestCapability(info, ctrlv1connect.WorkspaceServiceGetWorkspaceCommandProcedure, req); err != nil {
				return last, err
			}
			sent := time.Now()
			res, err := c.WorkspaceService.GetWorkspaceCommand(ctx, connect.NewRequest(req))
			switch {
			case err == nil:
				last = res.Msg.GetCommand()
				if last.GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
					return last, CommandError(last.GetError())
				}
				if longPoll && time.Since(sent) >= timeout {
					// The server waited the whole time: ask again at once.
					pause = 0
					continue
				}
			case longPoll && connect.CodeOf(err) == connect.CodeUnimplemented &&
				Reason(err) == ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE:
				longPoll = false
				continue
			case ctx.Err() != nil || !transient(err):
				return last, err
			}
		}
		pause = schedule.next(pause)
		if !sleep(ctx, pause) {
			return last, fmt.Errorf("kibotos: waiting for command %q: %w", commandID, context.Cause(ctx))
		}
	}
}

// serverWaitTimeout is the wait_timeout of one server-side wait: the
// Client's, cut to what remains of ctx.
func (c *Client) serverWaitTimeout(ctx context.Context) time.Duration {
	d := c.serverWait
	if d <= 0 {
		d = defaultServerWait
	}
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline))
	}
	return max(d, minServerWait)
}

// transient reports whether a failed poll is worth repeating. It is stricter
// than IsRetryable, which also counts other errors without an ErrorDetail as
// unknown results: polling has no attempt bound, so it only goes on through
// failures known to pass.
func transient(err error) bool {
	if d, ok := Detail(err); ok {
		return d.GetRetryable() && !d.GetCommandSettled()
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded:
		return true
	}
	return false
}
