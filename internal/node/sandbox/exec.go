package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// Exec runs argv in the workspace through the guest and returns its output
// (at most protocol.MaxExecOutput bytes of each stream) and exit code
// (128+signal when a signal ended it). FOR TESTS ONLY for now: it is the
// seed of the data plane, which will replace it. The command runs as root
// in its own session with the workspace PATH, in /root; ctx's deadline
// (10 minutes without one) becomes its timeout (then it is killed).
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
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultExecTimeout)
		defer cancel()
	}
	dl, _ := ctx.Deadline()
	timeout := time.Until(dl).Milliseconds()
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	// The guest ends the command at its timeout and then answers: the
	// node waits a little longer for that answer.
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), dl.Add(2*time.Second))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	defer stop()
	resp, err := r.call(rctx, e, protocol.Request{Op: protocol.OpExec, TimeoutMillis: timeout, Exec: &req})
	if err != nil {
		return nil, err
	}
	if resp.Exec == nil {
		return nil, errors.New("sandbox: exec: guest sent no result")
	}
	resp.Exec.Signal = protocol.Clip(resp.Exec.Signal, 32)
	return resp.Exec, nil
}

// Poweroff asks the guest to power itself off (as `poweroff` inside would);
// the exit is reported as EventGuestExited.
func (r *Runtime) Poweroff(ctx context.Context, workspaceID string) error {
	e := r.get(workspaceID)
	if e == nil || !e.alive() {
		return ErrNotRunning
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.cfg.HealthTimeout)
		defer cancel()
	}
	_, err := r.call(ctx, e, protocol.Request{Op: protocol.OpShutdown})
	return err
}
