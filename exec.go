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
	// Stdin is copied to the process (on WriteInput streams, flow
	// controlled: a process that does not read holds the copy back), then
	// its input is closed; nil closes it at once. Wait does not wait for a
	// Read of Stdin that blocks after the process exited.
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
	// Terminal, when set, runs the process on a terminal of this size
	// (its stdout and stderr are then one stream, written to Stdout);
	// Resize changes it.
	Terminal *TerminalSize
	// StartTimeout, when positive, bounds Start (the server's capabilities,
	// the session and StartProcess), not the run.
	StartTimeout time.Duration

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

// TerminalSize is the size of a process's terminal; zero rows or columns
// are 24 rows and 80 columns.
type TerminalSize struct {
	Rows, Cols uint16
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
	if c.StartTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.StartTimeout)
		defer cancel()
	}
	cl := c.ws.c
	req := &ctrlv1.StartProcessRequest{WorkspaceId: c.ws.id, Argv: c.Args, Env: c.Env, WorkingDirectory: c.Dir, Tag: c.Tag}
	if t := c.Terminal; t != nil {
		req.Pty = &ctrlv1.ProcessPty{Rows: uint32(t.Rows), Cols: uint32(t.Cols)}
	}
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
	res, err := callAuth(ctx, &c.sess, req, c.proc.StartProcess)
	if err != nil {
		return err
	}
	c.processID = res.Msg.GetProcessId()
	life, stop := context.WithCancel(c.ctx)
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

// pumpInput copies Stdin to the process, then closes its input.
func (c *Cmd) pumpInput(ctx context.Context) {
	if c.Stdin != nil {
		in := &inputStream{c: c}
		in.pump(ctx)
		return
	}
	_, _ = callAuth(ctx, &c.sess, &ctrlv1.CloseInputRequest{WorkspaceId: c.ws.id, ProcessId: c.processID}, c.proc.CloseInput)
}

// Streamed input: Stdin goes to the process on WriteInput streams, whose
// flow control holds the Cmd back while the process does not read. A
// stream is closed (and what it carried confirmed by the guest) after
// inputRotateBytes or a quarter of the session's lifetime, so that a
// stream never outlives its token and the bytes a broken stream may have
// lost are few: they are kept until confirmed and sent again on the next
// stream from their offset (the guest skips what it already took).
const (
	inputRotateBytes = 1 << 20
	inputRetries     = 3
)

// inputStream is the state of pumpInput.
type inputStream struct {
	c         *Cmd
	confirmed uint64 // the input offset the guest confirmed
	pending   []byte // the bytes after confirmed, sent or not
	sent      int    // of pending, sent on the open stream
	s         *connect.ClientStreamForClient[ctrlv1.WriteInputRequest, ctrlv1.WriteInputResponse]
	first     bool // the next message is the stream's first
	opened    time.Time
	token     string // the stream's token
	unary     bool   // the server has no WriteInput: SendInput and CloseInput
}

// open starts a stream, renewing the session first when less than half
// of it is left.
func (in *inputStream) open(ctx context.Context) error {
	if err := in.c.sess.fresh(ctx, in.c.sess.ttl/2); err != nil {
		return err
	}
	in.s = in.c.proc.WriteInput(ctx)
	in.token = in.c.sess.current()
	setBearer(in.s.RequestHeader(), in.token)
	in.first, in.sent, in.opened = true, 0, time.Now()
	return nil
}

// flush sends what of pending the stream has not carried (closeInput
// with the last of it).
func (in *inputStream) flush(closeInput bool) error {
	for {
		n := min(len(in.pending)-in.sent, execInputChunk*4)
		last := in.sent+n == len(in.pending)
		if n == 0 && !closeInput {
			return nil
		}
		m := &ctrlv1.WriteInputRequest{Data: in.pending[in.sent : in.sent+n], CloseInput: closeInput && last}
		if in.first {
			m.WorkspaceId, m.ProcessId, m.Offset = in.c.ws.id, in.c.processID, in.confirmed+uint64(in.sent)
			in.first = false
		}
		if err := in.s.Send(m); err != nil {
			return err
		}
		in.sent += n
		if last {
			return nil
		}
	}
}

// finish closes the stream and drops from pending what the guest
// confirmed; the error is the stream's.
func (in *inputStream) finish() error {
	s := in.s
	in.s = nil
	res, err := s.CloseAndReceive()
	if err != nil {
		return err
	}
	took := min(res.Msg.GetAcceptedBytes(), uint64(in.sent))
	in.confirmed += took
	in.pending = in.pending[took:]
	if len(in.pending) == 0 {
		in.pending = nil
	}
	return nil
}

// deliver appends data to the input (and closes it after data when
// closeInput), opening and reopening streams as needed: a stream that
// breaks is replaced and what it may have lost is sent again. It returns
// false when the input cannot go on (the process ended, the Workspace
// cannot be reached, ctx ended).
func (in *inputStream) deliver(ctx context.Context, data []byte, closeInput bool) bool {
	in.pending = append(in.pending, data...)
	failures := 0
	for ctx.Err() == nil {
		if in.unary {
			return in.deliverUnary(ctx, closeInput)
		}
		err := in.try(ctx, closeInput)
		if err == nil {
			return true
		}
		if !in.recover(ctx, err, &failures) {
			return false
		}
	}
	return false
}

// try sends what is pending on the open stream (opening one), and closes
// the stream when closeInput or when it is due for rotation.
func (in *inputStream) try(ctx context.Context, closeInput bool) error {
	if in.s == nil {
		if err := in.open(ctx); err != nil {
			return err
		}
	}
	err := in.flush(closeInput)
	if err == nil {
		if !closeInput && len(in.pending) < inputRotateBytes && time.Since(in.opened) < in.c.sess.ttl/4 {
			return nil
		}
		return in.finish()
	}
	if ferr := in.finish(); ferr != nil {
		err = ferr // the stream's own error says why a Send failed
	}
	return err
}

// recover reports whether a stream's failure err is worth another stream:
// a server without WriteInput (then unary calls), an expired session
// (renewed), or a transport failure (a few times, with a pause).
func (in *inputStream) recover(ctx context.Context, err error, failures *int) bool {
	switch {
	case connect.CodeOf(err) == connect.CodeUnimplemented:
		in.unary = true // a server of an earlier release
		return true
	case in.c.sess.renewAfter(ctx, err, in.token):
		return true
	case reconnectable(err) && *failures < inputRetries:
		*failures++
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Duration(*failures) * 50 * time.Millisecond):
			return true
		}
	}
	return false // the process ended or cannot be reached: its events say which
}

// settle closes the open stream once the input is idle, so that what it
// carried is confirmed (and a stream that broke meanwhile is found and
// its bytes sent again) rather than left waiting for the next input.
func (in *inputStream) settle(ctx context.Context) bool {
	if in.s == nil {
		return true
	}
	err := in.finish()
	if err == nil {
		return true
	}
	failures := 0
	if !in.recover(ctx, err, &failures) {
		return false
	}
	return in.deliver(ctx, nil, false)
}

// deliverUnary sends pending with SendInput by offset (waiting while the
// input buffer is full), then CloseInput when closeInput.
func (in *inputStream) deliverUnary(ctx context.Context, closeInput bool) bool {
	c, ws, id := in.c, in.c.ws.id, in.c.processID
	for len(in.pending) > 0 && ctx.Err() == nil {
		data := in.pending[:min(len(in.pending), execInputChunk)]
		res, err := callAuth(ctx, &c.sess, &ctrlv1.SendInputRequest{WorkspaceId: ws, ProcessId: id, Offset: in.confirmed, Data: data}, c.proc.SendInput)
		var took uint64
		switch {
		case err == nil:
			took = res.Msg.GetAcceptedBytes()
		case connect.CodeOf(err) == connect.CodeResourceExhausted:
			if d, ok := Detail(err); ok {
				took = d.GetAcceptedBytes()
			}
		default:
			return false // the process ended or cannot be reached: its events say which
		}
		took = min(took, uint64(len(data)))
		in.confirmed += took
		in.pending = in.pending[took:]
		if took < uint64(len(data)) {
			select {
			case <-ctx.Done():
				return false
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	in.pending = nil
	if closeInput {
		_, err := callAuth(ctx, &c.sess, &ctrlv1.CloseInputRequest{WorkspaceId: ws, ProcessId: id}, c.proc.CloseInput)
		return err == nil
	}
	return ctx.Err() == nil
}

// inputIdle is how long the input stays idle before its stream is
// settled.
const inputIdle = 50 * time.Millisecond

// pump copies Stdin until its end, then closes the input. Stdin is read by
// its own goroutine, so that an idle input settles its stream.
func (in *inputStream) pump(ctx context.Context) {
	type read struct {
		data []byte
		err  error
	}
	reads := make(chan read)
	go func() {
		for {
			buf := make([]byte, execInputChunk)
			n, err := in.c.Stdin.Read(buf)
			select {
			case reads <- read{buf[:n], err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-idle.C:
			if !in.settle(ctx) {
				return
			}
		case r := <-reads:
			if len(r.data) > 0 && !in.deliver(ctx, r.data, false) {
				return
			}
			if r.err != nil {
				if errors.Is(r.err, io.EOF) {
					in.deliver(ctx, nil, true)
				} else {
					in.settle(ctx)
				}
				return
			}
			idle.Reset(inputIdle)
		}
	}
}

// Resize sets the size of the process's terminal (Terminal set).
func (c *Cmd) Resize(ctx context.Context, size TerminalSize) error {
	if c.processID == "" {
		return errors.New("kibotos: Cmd not started")
	}
	req := &ctrlv1.ResizeProcessRequest{WorkspaceId: c.ws.id, ProcessId: c.processID, Rows: uint32(size.Rows), Cols: uint32(size.Cols)}
	_, err := callAuth(ctx, &c.sess, req, c.proc.ResizeProcess)
	return err
}

// Signal sends sig to the process, or to its process group when group is
// set.
func (c *Cmd) Signal(ctx context.Context, sig syscall.Signal, group bool) error {
	if c.processID == "" {
		return errors.New("kibotos: Cmd not started")
	}
	req := &ctrlv1.SignalProcessRequest{WorkspaceId: c.ws.id, ProcessId: c.processID, Signal: int32(sig), ProcessGroup: group}
	_, err := callAuth(ctx, &c.sess, req, c.proc.SignalProcess)
	return err
}

// follow copies the process's output until its exit, reconnecting from
// the last offset, and returns Wait's error.
func (c *Cmd) follow(ctx context.Context) error {
	var off uint64
	var dropped uint64
	failures := 0
	for {
		tok := c.sess.current()
		s, err := c.proc.ProcessEvents(ctx, tokenReq(&ctrlv1.ProcessEventsRequest{WorkspaceId: c.ws.id, ProcessId: c.processID, FromOffset: off}, tok))
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
		if c.sess.renewAfter(ctx, err, tok) {
			continue
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
