package kibotos

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
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

// WaitWorkspaceCommand polls GetWorkspaceCommand until the command with ID
// commandID is COMPLETED, pausing longer between polls (see WithWaitBackoff),
// and returns it. When the command completed with a failure it returns the
// command and that failure as an error (see CommandError). A poll that fails
// transiently (an ErrorDetail that says retryable, or unavailable or
// deadline_exceeded without one) is repeated; any other failure, or the end
// of ctx, ends the wait with that error and the last command seen (nil if
// none).
//
// The ID is sent as it is: GetWorkspaceCommand reads existing commands,
// ctrl's own (expiration/..., host-memory/..., guest-shutdown/...) included.
func (c *Client) WaitWorkspaceCommand(ctx context.Context, commandID string) (*ctrlv1.WorkspaceCommand, error) {
	req := &ctrlv1.GetWorkspaceCommandRequest{CommandId: commandID}
	var (
		last  *ctrlv1.WorkspaceCommand
		pause time.Duration
	)
	schedule := c.wait
	if schedule.initial <= 0 {
		schedule = defaultWaitBackoff
	}
	for {
		res, err := c.WorkspaceService.GetWorkspaceCommand(ctx, connect.NewRequest(req))
		switch {
		case err == nil:
			last = res.Msg.GetCommand()
			if last.GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
				return last, CommandError(last.GetError())
			}
		case ctx.Err() != nil || !transient(err):
			return last, err
		}
		pause = schedule.next(pause)
		if !sleep(ctx, pause) {
			return last, fmt.Errorf("kibotos: waiting for command %q: %w", commandID, context.Cause(ctx))
		}
	}
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
