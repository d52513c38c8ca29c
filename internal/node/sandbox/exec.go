package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// Exec runs argv in the workspace through the guest's ProcessService and
// returns its output (at most protocol.MaxExecOutput bytes of each stream)
// and exit code (128+signal when a signal ended it). FOR TESTS ONLY: the
// data plane's clients use the ProcessService (Processes) directly. The
// command runs as root in its own session with the workspace PATH, in
// /root, a child of PID 1 (so in the workspace's cgroup, namespaces,
// capability set and seccomp filter); ctx's deadline (10 minutes without
// one) becomes its timeout (then its process group is killed).
func (r *Runtime) Exec(ctx context.Context, workspaceID string, argv []string) (stdout, stderr []byte, exit int, err error) {
	res, err := r.ExecRequest(ctx, workspaceID, protocol.ExecRequest{Argv: argv})
	if err != nil {
		return nil, nil, -1, err
	}
	return res.Stdout, res.Stderr, res.ExitCode, nil
}

// ExecRequest is Exec with stdin, environment and working directory.
func (r *Runtime) ExecRequest(ctx context.Context, workspaceID string, req protocol.ExecRequest) (*protocol.ExecResult, error) {
	if len(req.Argv) == 0 {
		return nil, errors.New("sandbox: exec: empty argv")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultExecTimeout)
		defer cancel()
	}
	dl, _ := ctx.Deadline()
	if time.Until(dl) <= 0 {
		return nil, context.DeadlineExceeded
	}
	c, err := r.Processes(workspaceID)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// The guest is given a little longer than ctx: at ctx's deadline the
	// command is killed, and its exit still read.
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), dl.Add(5*time.Second))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	defer stop()
	started, err := c.Start(rctx, connect.NewRequest(&guestv1.StartRequest{Argv: req.Argv, Env: req.Env, WorkingDirectory: req.Dir}))
	if err != nil {
		return nil, guestErr("exec: start", err)
	}
	id := started.Msg.GetProcessId()
	go func() {
		if err := sendAll(rctx, c, id, req.Stdin); err == nil {
			_, _ = c.CloseInput(rctx, connect.NewRequest(&guestv1.CloseInputRequest{ProcessId: id}))
		}
	}()
	killed := make(chan struct{})
	kill := context.AfterFunc(ctx, func() {
		defer close(killed)
		_, _ = c.Signal(rctx, connect.NewRequest(&guestv1.SignalRequest{ProcessId: id, Signal: int32(unix.SIGKILL), ProcessGroup: true}))
	})
	defer kill()
	events, err := c.Events(rctx, connect.NewRequest(&guestv1.EventsRequest{ProcessId: id}))
	if err != nil {
		return nil, guestErr("exec: events", err)
	}
	defer events.Close()
	res := &protocol.ExecResult{}
	for events.Receive() {
		switch ev := events.Msg().GetEvent().(type) {
		case *guestv1.EventsResponse_Output:
			o := ev.Output
			dst := &res.Stdout
			if o.GetStream() == guestv1.Stream_STREAM_STDERR {
				dst = &res.Stderr
			}
			room := protocol.MaxExecOutput - len(*dst)
			if room < len(o.GetData()) {
				res.Truncated = true
				room = max(room, 0)
				*dst = append(*dst, o.GetData()[:room]...)
			} else {
				*dst = append(*dst, o.GetData()...)
			}
		case *guestv1.EventsResponse_Dropped:
			res.Truncated = true
		case *guestv1.EventsResponse_Exited:
			res.ExitCode = int(ev.Exited.GetExitCode())
			res.Signal = protocol.Clip(ev.Exited.GetSignalName(), 32)
			if !kill() {
				<-killed
				res.TimedOut = true
			}
			return res, nil
		}
	}
	if err := events.Err(); err != nil {
		return nil, guestErr("exec: events", err)
	}
	return nil, errNoExit
}

// sendAll sends data to process id's input, waiting while the guest
// takes less than it was sent (its input buffer is full, or it says so
// without resource_exhausted: a guest cannot make the node spin).
func sendAll(ctx context.Context, c *ProcessClient, id string, data []byte) error {
	var off uint64
	for len(data) > 0 {
		n := min(len(data), 128<<10)
		resp, err := c.SendInput(ctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: id, Offset: off, Data: data[:n]}))
		var accepted uint64
		switch {
		case err == nil:
			accepted = resp.Msg.GetAcceptedBytes()
		case connect.CodeOf(err) == connect.CodeResourceExhausted:
			if a, ok := acceptedOf(err); ok {
				accepted = a
			}
		default:
			return err
		}
		accepted = min(accepted, uint64(n))
		data, off = data[accepted:], off+accepted
		if accepted < uint64(n) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}

// acceptedOf reads the accepted count of a resource_exhausted SendInput.
func acceptedOf(err error) (uint64, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return 0, false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if r, ok := v.(*guestv1.SendInputResponse); ok {
				return r.GetAcceptedBytes(), true
			}
		}
	}
	return 0, false
}

// guestErr wraps an error of a guest call, its text clipped to
// protocol.MaxText.
func guestErr(what string, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return fmt.Errorf("guest: %s: %s: %s", what, ce.Code(), protocol.Clip(ce.Message(), protocol.MaxText))
	}
	return fmt.Errorf("guest: %s: %s", what, protocol.Clip(err.Error(), protocol.MaxText))
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
