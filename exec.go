package kibotos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// DefaultExecSessionTTL is the lifetime of the data-plane session a Cmd
// creates when SessionTTL is zero. The session is renewed when it expires
// while the process runs.
const DefaultExecSessionTTL = time.Minute

// execInputChunk is the largest SendInput a Cmd sends.
const execInputChunk = 32 << 10

// sigkill is SIGKILL on Linux, the guests' system.
const sigkill = 9

// execReconnects is how many times in a row a Cmd opens ProcessEvents
// again, from the last offset, before it reports a *StreamLostError.
const execReconnects = 3

// Cmd is a command to run in a Workspace through the public data plane
// (ProcessService), shaped like os/exec.Cmd. Make one with
// Workspace.ExecCommand; set its fields before Start or Run. A Cmd cannot be
// reused.
type Cmd struct {
	// Args is the command line: Args[0] is the program, looked up by the
	// guest.
	Args []string
	// Env is the environment in KEY=value form; nil is the guest's default.
	Env []string
	// Dir is the working directory; empty is the guest's default.
	Dir string
	// Tag names the process for ListProcesses and ProcessEvents.
	Tag string
	// Stdin is copied to the process (SendInput), then its input is closed
	// (CloseInput); nil closes it at once. Wait does not wait for a Read of
	// Stdin that blocks after the process exited.
	Stdin io.Reader
	// Stdout and Stderr receive the process's output; nil discards it. The
	// same writer may be given for both: it is written by one goroutine.
	Stdout, Stderr io.Writer
	// Token, when set, is the data-plane token (scope EXEC) the Cmd sends
	// instead of creating a session: it is never renewed.
	Token string
	// SessionTTL is the lifetime of the session the Cmd creates, from 10s
	// to 24h; zero is DefaultExecSessionTTL.
	SessionTTL time.Duration

	ctx  context.Context
	ws   *Workspace
	sess dataSession

	proc      ctrlv1connect.ProcessServiceClient
	processID string
	started   bool
	done      chan struct{}
	stop      context.CancelFunc
	waitErr   error
	waited    bool
	exited    *ctrlv1.ProcessExited
	dropped   uint64
}

// ExecCommand returns a Cmd that runs name with args in the Workspace. ctx
// bounds the whole run: when it is done before the process exits, Wait
// kills the process (SignalProcess, SIGKILL) and returns ctx's error.
func (w *Workspace) ExecCommand(ctx context.Context, name string, args ...string) *Cmd {
	return &Cmd{ctx: ctx, ws: w, Args: append([]string{name}, args...)}
}

// ExitError reports that the process exited with a non-zero code or was
// killed by a signal.
type ExitError struct {
	// Exited is the process's exit event.
	Exited *ctrlv1.ProcessExited
	// DroppedBytes counts the output bytes the guest dropped before the
	// Cmd read them (see OutputDroppedError).
	DroppedBytes uint64
	// Stderr holds the standard error of Output when Cmd.Stderr was nil.
	Stderr []byte
}

// ExitCode returns the exit code, or -1 when a signal killed the process.
func (e *ExitError) ExitCode() int {
	if e.Exited.GetSignal() != 0 {
		return -1
	}
	return int(e.Exited.GetExitCode())
}

// Signal returns the signal that killed the process, 0 when it exited.
func (e *ExitError) Signal() syscall.Signal { return syscall.Signal(e.Exited.GetSignal()) }

func (e *ExitError) Error() string {
	if s := e.Exited.GetSignal(); s != 0 {
		if n := e.Exited.GetSignalName(); n != "" {
			return "signal: " + n
		}
		return fmt.Sprintf("signal: %d", s)
	}
	return fmt.Sprintf("exit status %d", e.Exited.GetExitCode())
}

// OutputDroppedError reports that the process exited with code 0 but the
// guest dropped part of its output before the Cmd read it (its output
// buffer was full). A non-zero exit is an *ExitError instead, whose
// DroppedBytes says the same; Cmd.DroppedBytes is set in both cases.
type OutputDroppedError struct {
	// Bytes is how many bytes were dropped.
	Bytes uint64
}

func (e *OutputDroppedError) Error() string {
	return fmt.Sprintf("the process exited 0 but %d bytes of its output were dropped", e.Bytes)
}

// StreamLostError reports that the process started, then its events could
// not be read before its exit was seen (after reconnecting from the last
// offset): whether and how it exited is unknown.
type StreamLostError struct {
	// ProcessID is the process's ID.
	ProcessID string
	// Err is the last error.
	Err error
}

func (e *StreamLostError) Error() string {
	return fmt.Sprintf("the event stream of process %s was lost: %v", e.ProcessID, e.Err)
}

func (e *StreamLostError) Unwrap() error { return e.Err }

// ProcessID returns the process's ID once Start succeeded.
func (c *Cmd) ProcessID() string { return c.processID }

// Exited returns the process's exit event once Wait returned, nil when it
// was not seen.
func (c *Cmd) Exited() *ctrlv1.ProcessExited { return c.exited }

// DroppedBytes returns how many output bytes the guest dropped, once Wait
// returned.
func (c *Cmd) DroppedBytes() uint64 { return c.dropped }

// Run starts the process and waits for it: Start, then Wait.
func (c *Cmd) Run() error {
	if err := c.Start(); err != nil {
		return err
	}
	return c.Wait()
}

// Output runs the process and returns its standard output. When Stderr
// is nil, an *ExitError holds the standard error.
func (c *Cmd) Output() ([]byte, error) {
	if c.Stdout != nil {
		return nil, errors.New("kibotos: Stdout already set")
	}
	var out, errb bytes.Buffer
	c.Stdout = &out
	captured := c.Stderr == nil
	if captured {
		c.Stderr = &errb
	}
	err := c.Run()
	var ee *ExitError
	if captured && errors.As(err, &ee) {
		ee.Stderr = errb.Bytes()
	}
	return out.Bytes(), err
}

// CombinedOutput runs the process and returns its standard output and
// standard error together, in the order the guest reported them.
func (c *Cmd) CombinedOutput() ([]byte, error) {
	if c.Stdout != nil || c.Stderr != nil {
		return nil, errors.New("kibotos: Stdout or Stderr already set")
	}
	var b bytes.Buffer
	c.Stdout, c.Stderr = &b, &b
	err := c.Run()
	return b.Bytes(), err
}

// Start checks the capability workspace.exec (nothing is sent when the
// server does not offer it: a *MissingCapabilityError), creates an EXEC
// session unless Token is set, starts the process (StartProcess) and
// begins copying its input and output. It does not wait for the process.
func (c *Cmd) Start() error {
	if c.started {
		return errors.New("kibotos: Cmd already started")
	}
	if c.ws == nil {
		return errors.New("kibotos: Cmd not made by Workspace.ExecCommand")
	}
	if len(c.Args) == 0 {
		return errors.New("kibotos: Cmd has no Args")
	}
	c.started = true
	if c.ctx == nil {
		c.ctx = context.Background()
	}
	ctx := c.ctx
	cl := c.ws.c
	req := &ctrlv1.StartProcessRequest{WorkspaceId: c.ws.id, Argv: c.Args, Env: c.Env, WorkingDirectory: c.Dir, Tag: c.Tag}
	info, err := cl.serverInfo(ctx, cl.retry)
	if err != nil {
		return err
	}
	if err := MissingRequestCapability(info, ctrlv1connect.ProcessServiceStartProcessProcedure, req); err != nil {
		return err
	}
	c.proc = cl.ProcessService
	ttl := c.SessionTTL
	if ttl == 0 {
		ttl = DefaultExecSessionTTL
	}
	c.sess.ws, c.sess.scope, c.sess.ttl = c.ws, ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC, ttl
	if err := c.sess.start(ctx, info, c.Token); err != nil {
		return err
	}
	var res *connect.Response[ctrlv1.StartProcessResponse]
	for {
		res, err = c.proc.StartProcess(ctx, authReq(&c.sess, req))
		if err != nil && c.renewable(err) && c.newToken(ctx) == nil {
			continue
		}
		break
	}
	if err != nil {
		return err
	}
	c.processID = res.Msg.GetProcessId()
	life, stop := context.WithCancel(ctx)
	c.stop, c.done = stop, make(chan struct{})
	go c.pumpInput(life)
	go func() {
		defer close(c.done)
		c.waitErr = c.follow(life)
	}()
	return nil
}

// Wait waits for the process to exit and returns nil for exit code 0 with
// no output dropped, an *ExitError, an *OutputDroppedError, a
// *StreamLostError, or the context's error (the process is then killed).
func (c *Cmd) Wait() error {
	if !c.started || c.done == nil {
		return errors.New("kibotos: Cmd not started")
	}
	if c.waited {
		return errors.New("kibotos: Wait was already called")
	}
	c.waited = true
	<-c.done
	c.stop()
	return c.waitErr
}

// renewable reports whether err is the expiry of a session the Cmd
// created, which it then renews.
func (c *Cmd) renewable(err error) bool { return c.sess.renewable(err) }

// newToken creates a session in place of the Cmd's expired one.
func (c *Cmd) newToken(ctx context.Context) error { return c.sess.renew(ctx) }

// pumpInput copies Stdin to the process by offset, then closes its input.
func (c *Cmd) pumpInput(ctx context.Context) {
	ws, id := c.ws.id, c.processID
	if c.Stdin != nil {
		var off uint64
		buf := make([]byte, execInputChunk)
		for ctx.Err() == nil {
			n, rerr := c.Stdin.Read(buf)
			data := buf[:n]
			for len(data) > 0 && ctx.Err() == nil {
				res, err := c.proc.SendInput(ctx, authReq(&c.sess, &ctrlv1.SendInputRequest{WorkspaceId: ws, ProcessId: id, Offset: off, Data: data}))
				var took uint64
				switch {
				case err == nil:
					took = res.Msg.GetAcceptedBytes()
				case connect.CodeOf(err) == connect.CodeResourceExhausted:
					if d, ok := Detail(err); ok {
						took = d.GetAcceptedBytes()
					}
					if took == 0 {
						select {
						case <-ctx.Done():
						case <-time.After(20 * time.Millisecond):
						}
					}
				case c.renewable(err):
					if c.newToken(ctx) != nil {
						return
					}
					continue
				default:
					return // the process ended or cannot be reached: its events say which
				}
				off += took
				data = data[took:]
			}
			if rerr != nil {
				if !errors.Is(rerr, io.EOF) {
					return
				}
				break
			}
		}
	}
	for ctx.Err() == nil {
		_, err := c.proc.CloseInput(ctx, authReq(&c.sess, &ctrlv1.CloseInputRequest{WorkspaceId: ws, ProcessId: id}))
		if err != nil && c.renewable(err) && c.newToken(ctx) == nil {
			continue
		}
		return
	}
}

// follow copies the process's output until its exit, reconnecting from
// the last offset, and returns Wait's error.
func (c *Cmd) follow(ctx context.Context) error {
	var off uint64
	var dropped uint64
	failures := 0
	for {
		s, err := c.proc.ProcessEvents(ctx, authReq(&c.sess, &ctrlv1.ProcessEventsRequest{WorkspaceId: c.ws.id, ProcessId: c.processID, FromOffset: off}))
		if err == nil {
			for s.Receive() {
				failures = 0
				ev := s.Msg()
				if o := ev.GetOutput(); o != nil {
					end := o.GetOffset() + uint64(len(o.GetData()))
					if end <= off {
						continue // already written
					}
					data := o.GetData()
					if o.GetOffset() < off {
						data = data[off-o.GetOffset():]
					}
					w := c.Stdout
					if o.GetStream() == ctrlv1.ProcessStream_PROCESS_STREAM_STDERR {
						w = c.Stderr
					}
					if w != nil {
						_, _ = w.Write(data)
					}
					off = end
				}
				if d := ev.GetDropped(); d != nil {
					if end := d.GetOffset() + d.GetBytes(); end > off {
						dropped += end - max(off, d.GetOffset())
						off = end
					}
				}
				if e := ev.GetExited(); e != nil {
					s.Close()
					c.exited, c.dropped = e, dropped
					if e.GetExitCode() != 0 || e.GetSignal() != 0 {
						return &ExitError{Exited: e, DroppedBytes: dropped}
					}
					if dropped > 0 {
						return &OutputDroppedError{Bytes: dropped}
					}
					return nil
				}
			}
			err = s.Err()
			s.Close()
			if err == nil {
				err = errors.New("the stream ended before the process's exit")
			}
		}
		if ctx.Err() != nil {
			c.kill()
			return ctx.Err()
		}
		if c.renewable(err) {
			if rerr := c.newToken(ctx); rerr == nil {
				continue
			}
		}
		if failures++; failures > execReconnects || !reconnectable(err) {
			c.dropped = dropped
			return &StreamLostError{ProcessID: c.processID, Err: err}
		}
		select {
		case <-ctx.Done():
			c.kill()
			return ctx.Err()
		case <-time.After(time.Duration(failures) * 100 * time.Millisecond):
		}
	}
}

// reconnectable: a failure of the transport, not a refusal.
func reconnectable(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeDeadlineExceeded, connect.CodeCanceled, connect.CodeInternal, connect.CodeAborted:
		return true
	}
	return false
}

// kill sends SIGKILL to the process after its context ended.
func (c *Cmd) kill() {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), 5*time.Second)
	defer cancel()
	_, _ = c.proc.SignalProcess(ctx, authReq(&c.sess, &ctrlv1.SignalProcessRequest{WorkspaceId: c.ws.id, ProcessId: c.processID, Signal: sigkill}))
}
