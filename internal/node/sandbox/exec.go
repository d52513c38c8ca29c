package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// Exec runs argv in the workspace through the guest and returns its output
// and exit code (128+signal when a signal ended it). FOR TESTS ONLY for now:
// it is the seed of the data plane, which will replace it. The command runs
// as root in its own session with the workspace PATH, in /root; ctx's
// deadline becomes its timeout (then it is killed).
func (r *Runtime) Exec(ctx context.Context, workspaceID string, argv []string) (stdout, stderr []byte, exit int, err error) {
	res, err := r.ExecRequest(ctx, workspaceID, protocol.ExecRequest{Argv: argv})
	if err != nil {
		return nil, nil, -1, err
	}
	return res.Stdout, res.Stderr, res.ExitCode, nil
}

// ExecRequest is Exec with stdin, environment and working directory.
func (r *Runtime) ExecRequest(ctx context.Context, workspaceID string, req protocol.ExecRequest) (*protocol.ExecResult, error) {
	e := r.get(workspaceID)
	if e == nil || !e.alive() {
		return nil, ErrNotRunning
	}
	if len(req.Argv) == 0 {
		return nil, errors.New("sandbox: exec: empty argv")
	}
	var timeout int64
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl).Milliseconds()
		if timeout <= 0 {
			return nil, context.DeadlineExceeded
		}
	}
	resp, err := protocol.Do(ctx, r.sockPath(workspaceID), protocol.Request{Op: protocol.OpExec, TimeoutMillis: timeout, Exec: &req})
	if err != nil {
		return nil, err
	}
	if resp.Exec == nil {
		return nil, errors.New("sandbox: exec: guest sent no result")
	}
	return resp.Exec, nil
}

// Poweroff asks the guest to power itself off (as `poweroff` inside would);
// the exit is reported as EventGuestExited.
func (r *Runtime) Poweroff(ctx context.Context, workspaceID string) error {
	e := r.get(workspaceID)
	if e == nil || !e.alive() {
		return ErrNotRunning
	}
	_, err := protocol.Do(ctx, r.sockPath(workspaceID), protocol.Request{Op: protocol.OpShutdown})
	return err
}
