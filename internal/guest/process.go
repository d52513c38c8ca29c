package guest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// Bounds of the process table.
const (
	// MaxProcesses bounds the processes the guest keeps: running ones and
	// ended ones whose output a client may still read. A Start beyond it
	// forgets the oldest ended process, or fails with resource_exhausted
	// when all run.
	MaxProcesses = 256
	// maxInputRequest bounds the data of one SendInput.
	maxInputRequest = 256 << 10
	// startReservation: after a Start, the output waits this long at most
	// for the first Events stream before the ring may drop any of it.
	startReservation = 2 * time.Second
	// outputLinger: once the process ended, output is still read while
	// its pipes are not idle for this long (a background child may hold
	// them open); then the guest stops reading and reports the exit.
	outputLinger = 250 * time.Millisecond
	// outputLingerMax bounds the reading after the exit, whatever a
	// background child keeps writing (time spent waiting for a slow
	// reader's room does not end it early: the pipes are read on when it
	// frees).
	outputLingerMax = 5 * time.Second
)

// process is a process started through the ProcessService.
type process struct {
	id, tag string
	argv    []string
	pid     int
	pty     *os.File // the terminal's master, with a pty

	// pidfd refers to the process itself (-1 without pidfd_open): a
	// signal through it never reaches another process that got its pid
	// once it was reaped. Closed at its exit, under mu.
	pidfd int

	mu      sync.Mutex
	changed chan struct{} // closed and replaced at every change
	out     *ring
	in      inputBuffer
	inClose bool            // CloseInput was asked
	exited  *guestv1.Exited // set once its output ended too
	endedAt time.Time       // the process ended (its output may still be read)
	// readers are the offsets of the Events streams attached now: while
	// one is attached the ring never drops what the slowest has not sent
	// (readOutput waits: backpressure); with none, the oldest output goes.
	readers map[*uint64]struct{}
	// attached is closed when the first Events stream attaches.
	attached     chan struct{}
	attachedOnce sync.Once
	stdin        *os.File // the write end of stdin (nil with a pty)
}

// notify wakes the readers; p.mu is held.
func (p *process) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// processTable is the guest's processes.
type processTable struct {
	mu     sync.Mutex
	byID   map[string]*process
	byTag  map[string]*process
	order  []*process
	nextID int
}

func newProcessTable() *processTable {
	return &processTable{byID: map[string]*process{}, byTag: map[string]*process{}}
}

func (t *processTable) get(id, tag string) *process {
	t.mu.Lock()
	defer t.mu.Unlock()
	if id != "" {
		return t.byID[id]
	}
	if tag != "" {
		return t.byTag[tag]
	}
	return nil
}

// reserve makes room for one more process; t.mu is held.
func (t *processTable) reserve() bool {
	if len(t.order) < MaxProcesses {
		return true
	}
	for i, p := range t.order {
		p.mu.Lock()
		ended := p.exited != nil
		p.mu.Unlock()
		if ended {
			t.order = append(t.order[:i], t.order[i+1:]...)
			delete(t.byID, p.id)
			if p.tag != "" && t.byTag[p.tag] == p {
				delete(t.byTag, p.tag)
			}
			return true
		}
	}
	return false
}

// processService serves guestv1connect.ProcessServiceHandler.
type processService struct{ a *Agent }

func notFound(id, tag string) error {
	if id == "" && tag == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("no process_id or tag"))
	}
	if id == "" {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("no process tagged %q", protocol.Clip(tag, 128)))
	}
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("no process %q", protocol.Clip(id, 128)))
}

func (s processService) Start(ctx context.Context, req *connect.Request[guestv1.StartRequest]) (*connect.Response[guestv1.StartResponse], error) {
	m := req.Msg
	if len(m.GetArgv()) == 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("empty argv"))
	}
	if s.a.isStopping() {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("guest is powering off"))
	}
	t := s.a.procs
	// One Start at a time: a tag is looked up and claimed atomically.
	t.mu.Lock()
	defer t.mu.Unlock()
	if m.GetTag() != "" {
		if p := t.byTag[m.GetTag()]; p != nil {
			return connect.NewResponse(&guestv1.StartResponse{ProcessId: p.id, Pid: int32(p.pid), Existing: true}), nil
		}
	}
	if !t.reserve() {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d processes run", MaxProcesses))
	}
	t.nextID++
	p, err := s.a.startProcess("p-"+strconv.Itoa(t.nextID), m)
	if err != nil {
		return nil, err
	}
	t.byID[p.id] = p
	if p.tag != "" {
		t.byTag[p.tag] = p
	}
	t.order = append(t.order, p)
	return connect.NewResponse(&guestv1.StartResponse{ProcessId: p.id, Pid: int32(p.pid)}), nil
}

// startProcess starts m's process as a child of the agent's loop thread
// (see reaper), in its own session, with pipes or a terminal.
func (a *Agent) startProcess(id string, m *guestv1.StartRequest) (*process, error) {
	term := "TERM=dumb"
	if m.GetPty() != nil {
		term = "TERM=xterm"
	}
	env := mergeEnv([]string{"PATH=" + DefaultPath, "HOME=/root", term, "LANG=C.UTF-8"}, m.GetEnv())
	dir := m.GetWorkingDirectory()
	if dir == "" {
		dir = a.defaultDir()
	}
	// Through the trampoline (a second start of the guest binary, which
	// resets the OOM score, drops to the user and looks the program up) or,
	// the fast way, directly: the program looked up here, the user set by
	// the kernel, the OOM score handed down by PID 1 (startDirect). The
	// trampoline stays for what the direct way cannot say as a shell would:
	// a program that is not found (127) or cannot be executed (126).
	trampoline := append([]string{"kibotos-guest", trampolineArg}, m.GetArgv()...)
	sys := &syscall.SysProcAttr{Setsid: true}
	if m.Uid != nil || m.Gid != nil {
		trampoline = append([]string{"kibotos-guest", trampolineAsArg,
			strconv.FormatUint(uint64(m.GetUid()), 10), strconv.FormatUint(uint64(m.GetGid()), 10)}, m.GetArgv()...)
	}
	path, argv := a.cfg.Trampoline, trampoline
	direct := false
	if prog, err := lookPathIn(m.GetArgv()[0], envValue(env, "PATH")); err == nil && (path == "" || a.oom.direct()) {
		path, argv, direct = prog, m.GetArgv(), true
		if m.Uid != nil || m.Gid != nil {
			sys.Credential = &syscall.Credential{Uid: m.GetUid(), Gid: m.GetGid()}
		}
	} else if path == "" {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("%s: command not found", protocol.Clip(m.GetArgv()[0], 256)))
	}
	p := &process{id: id, tag: m.GetTag(), argv: m.GetArgv(), changed: make(chan struct{}), pidfd: -1,
		out: newRing(RingBytes), in: inputBuffer{max: InputBytes}, attached: make(chan struct{})}
	var files []*os.File // the child's ends, closed once it started
	var readers []*os.File
	var streams []guestv1.Stream
	closeAll := func() {
		for _, f := range append(files, readers...) {
			f.Close()
		}
		if p.stdin != nil {
			p.stdin.Close()
		}
		if p.pty != nil {
			p.pty.Close()
		}
	}
	if pty := m.GetPty(); pty != nil {
		master, slave, err := openPty(pty.GetRows(), pty.GetCols())
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("pty: %w", err))
		}
		p.pty = master
		files = []*os.File{slave, slave, slave}
		sys.Setctty, sys.Ctty = true, 0
		readers, streams = []*os.File{master}, []guestv1.Stream{guestv1.Stream_STREAM_STDOUT}
	} else {
		inR, inW, err := os.Pipe()
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		p.stdin = inW
		files = append(files, inR)
		for _, s := range []guestv1.Stream{guestv1.Stream_STREAM_STDOUT, guestv1.Stream_STREAM_STDERR} {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll()
				return nil, connect.NewError(connect.CodeInternal, err)
			}
			growPipe(r)
			files = append(files, w)
			readers, streams = append(readers, r), append(streams, s)
		}
	}
	attr := &os.ProcAttr{Dir: dir, Env: env, Files: files, Sys: sys}
	var wait <-chan unix.WaitStatus
	var err error
	a.onLoop(func() {
		p.pid, wait, err = a.reaper.start(func() (int, error) {
			var proc *os.Process
			var err error
			if direct {
				proc, err = a.oom.startDirect(path, argv, attr)
				if err != nil && a.cfg.Trampoline != "" {
					// The trampoline says why, as a shell would.
					attr.Sys.Credential = nil
					proc, err = os.StartProcess(a.cfg.Trampoline, trampoline, attr)
				}
			} else {
				proc, err = os.StartProcess(path, argv, attr)
			}
			if err != nil {
				return 0, err
			}
			pid := proc.Pid
			_ = proc.Release()
			// Not yet reapable (the reaper waits for this function).
			if fd, err := unix.PidfdOpen(pid, 0); err == nil {
				p.pidfd = fd
			}
			return pid, nil
		})
	})
	for _, f := range files {
		f.Close()
	}
	files = nil
	if err != nil {
		closeAll()
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s: %w", protocol.Clip(m.GetArgv()[0], 256), err))
	}
	// The output is kept for the client that started the process until it
	// attaches (StartProcess and ProcessEvents are two calls), for at most
	// startReservation: a process with nobody reading is then never held.
	_, release := p.attach(0)
	go func() {
		select {
		case <-p.attached:
		case <-time.After(startReservation):
		}
		release()
	}()
	var readersDone sync.WaitGroup
	for i, r := range readers {
		readersDone.Add(1)
		go func() {
			defer readersDone.Done()
			p.readOutput(r, streams[i])
		}()
	}
	go p.writeInput()
	go func() {
		ws := <-wait
		// The pipes are read on while output keeps coming (readOutput
		// sets its deadline from endedAt); a reader blocked on an idle
		// pipe held open by a background child is woken now.
		p.mu.Lock()
		p.endedAt = time.Now()
		p.mu.Unlock()
		for _, r := range readers {
			_ = r.SetReadDeadline(time.Now().Add(outputLinger))
		}
		readersDone.Wait()
		for _, r := range readers {
			if r != p.pty {
				r.Close()
			}
		}
		ex := exitOf(ws)
		p.mu.Lock()
		ex.EndOffset = p.out.end
		p.exited = ex
		if p.pidfd >= 0 {
			unix.Close(p.pidfd)
			p.pidfd = -1
		}
		if p.stdin != nil {
			p.stdin.Close() // ends a writeInput blocked on a full pipe
		}
		p.notify()
		p.mu.Unlock()
		if p.pty != nil {
			p.pty.Close()
		}
	}()
	return p, nil
}

// oomHandoff gives the processes PID 1 starts directly an OOM score of 0
// while PID 1 keeps its own low one (the node sets it to -998, so that the
// OOM killer takes a workspace's processes before its guest): a child
// inherits its parent's score at fork, so PID 1 raises its own to 0 for
// the fork and lowers it back after. Lowering it again is allowed because
// the node, privileged, set it (the kernel's oom_score_adj_min); where it
// is not (a guest whose score nobody lowered needs no handoff; one that
// cannot lower it back), the trampoline starts the processes instead. All
// starts run on the agent's loop thread, one at a time.
type oomHandoff struct {
	mu      sync.Mutex
	refused bool // lowering the score back failed once: trampoline from then on
}

const oomScorePath = "/proc/self/oom_score_adj"

// direct reports whether processes may be started directly.
func (o *oomHandoff) direct() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.refused
}

// startDirect starts path with PID 1's score at 0 for the fork.
func (o *oomHandoff) startDirect(path string, argv []string, attr *os.ProcAttr) (*os.Process, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b, err := os.ReadFile(oomScorePath)
	base := strings.TrimSpace(string(b))
	if err != nil || base == "0" {
		return os.StartProcess(path, argv, attr)
	}
	// Writing the score it has proves it can be written back.
	if err := os.WriteFile(oomScorePath, []byte(base), 0); err != nil {
		o.refused = true
		return nil, fmt.Errorf("oom score: %w", err)
	}
	if err := os.WriteFile(oomScorePath, []byte("0"), 0); err != nil {
		return nil, fmt.Errorf("oom score: %w", err)
	}
	proc, err := os.StartProcess(path, argv, attr)
	if werr := os.WriteFile(oomScorePath, []byte(base), 0); werr != nil {
		o.refused = true
	}
	return proc, err
}

// outputPipeBytes is the capacity asked for a process's output pipes (the
// kernel's default is 64 KiB): fewer, larger reads when it writes fast.
const outputPipeBytes = 1 << 20

// growPipe asks for outputPipeBytes of capacity in f's pipe, silently
// keeping the default when refused (fs.pipe-max-size, per-user limits).
func growPipe(f *os.File) {
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, outputPipeBytes) })
	}
}

// mergeEnv returns base with the entries of add: an entry of add replaces
// base's entry of the same name, the others are appended in order (the
// last of a repeated name wins).
func mergeEnv(base, add []string) []string {
	out := slices.Clone(base)
	at := map[string]int{}
	for i, e := range out {
		name, _, _ := strings.Cut(e, "=")
		at[name] = i
	}
	for _, e := range add {
		name, _, _ := strings.Cut(e, "=")
		if i, ok := at[name]; ok {
			out[i] = e
			continue
		}
		at[name] = len(out)
		out = append(out, e)
	}
	return out
}

func exitOf(ws unix.WaitStatus) *guestv1.Exited {
	switch {
	case ws.Exited():
		return &guestv1.Exited{ExitCode: int32(ws.ExitStatus())}
	case ws.Signaled():
		return &guestv1.Exited{ExitCode: 128 + int32(ws.Signal()), Signal: int32(ws.Signal()), SignalName: unix.SignalName(ws.Signal())}
	}
	return &guestv1.Exited{ExitCode: -1}
}

// readOutput copies r into the ring, ChunkBytes at a time, until it ends
// (EOF, or EIO from a terminal whose other side is closed, or the linger
// after the exit). It waits while the ring has no room for a chunk that
// the slowest attached reader has not sent yet: the process then blocks
// on its full pipe, so a slow client slows it and loses nothing.
func (p *process) readOutput(r *os.File, stream guestv1.Stream) {
	for {
		p.mu.Lock()
		for p.full() {
			ch := p.changed
			p.mu.Unlock()
			<-ch
			p.mu.Lock()
		}
		endedAt := p.endedAt
		p.mu.Unlock()
		if !endedAt.IsZero() {
			dl := time.Now().Add(outputLinger)
			if last := endedAt.Add(outputLingerMax); last.Before(dl) {
				dl = last
			}
			_ = r.SetReadDeadline(dl)
		}
		buf := make([]byte, ChunkBytes)
		n, err := r.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.out.append(stream, buf[:n:n])
			p.notify()
			p.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// full reports whether a chunk appended now could drop output an attached
// reader has not sent; p.mu is held.
func (p *process) full() bool {
	if len(p.readers) == 0 {
		return false
	}
	slowest := p.out.end
	for off := range p.readers {
		slowest = min(slowest, *off)
	}
	return p.out.end-slowest+ChunkBytes > uint64(p.out.max)
}

// attach registers a reader at offset off; the returned function moves it
// (after each event sent) and detach ends it.
func (p *process) attach(off uint64) (move func(uint64), detach func()) {
	pos := new(uint64)
	*pos = off
	p.mu.Lock()
	if p.readers == nil {
		p.readers = map[*uint64]struct{}{}
	}
	p.readers[pos] = struct{}{}
	p.mu.Unlock()
	move = func(off uint64) {
		p.mu.Lock()
		*pos = off
		p.notify()
		p.mu.Unlock()
	}
	detach = func() {
		p.mu.Lock()
		delete(p.readers, pos)
		p.notify()
		p.mu.Unlock()
	}
	return move, detach
}

// writeInput writes the input buffer to the process until it ends, or
// until the input is closed and the buffer drained.
func (p *process) writeInput() {
	for {
		p.mu.Lock()
		for len(p.in.buf) == 0 && !p.inClose && p.exited == nil {
			ch := p.changed
			p.mu.Unlock()
			<-ch
			p.mu.Lock()
		}
		if p.exited != nil {
			p.mu.Unlock()
			return
		}
		data := p.in.buf
		closing := p.inClose && len(data) == 0
		p.mu.Unlock()
		if closing {
			if p.pty != nil {
				_, _ = p.pty.Write([]byte{4}) // VEOF
			} else {
				p.stdin.Close()
			}
			return
		}
		w := p.stdin
		if p.pty != nil {
			w = p.pty
		}
		n, err := w.Write(data)
		p.mu.Lock()
		p.in.buf = p.in.buf[n:]
		if len(p.in.buf) == 0 {
			p.in.buf = nil
		}
		p.notify()
		p.mu.Unlock()
		if err != nil {
			return // the process closed its stdin or ended: input is dropped
		}
	}
}

func (s processService) Events(ctx context.Context, req *connect.Request[guestv1.EventsRequest], stream *connect.ServerStream[guestv1.EventsResponse]) error {
	p := s.a.procs.get(req.Msg.GetProcessId(), req.Msg.GetTag())
	if p == nil {
		return notFound(req.Msg.GetProcessId(), req.Msg.GetTag())
	}
	if err := stream.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Started{Started: &guestv1.Started{Pid: int32(p.pid)}}}); err != nil {
		return err
	}
	off := req.Msg.GetFromOffset()
	move, detach := p.attach(off)
	defer detach()
	p.attachedOnce.Do(func() { close(p.attached) })
	for {
		p.mu.Lock()
		ev, next, ok := p.out.read(off)
		exited, changed := p.exited, p.changed
		p.mu.Unlock()
		if ok {
			if err := stream.Send(ev); err != nil {
				return err
			}
			off = next
			move(off)
			continue
		}
		if exited != nil {
			return stream.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Exited{Exited: exited}})
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s processService) SendInput(ctx context.Context, req *connect.Request[guestv1.SendInputRequest]) (*connect.Response[guestv1.SendInputResponse], error) {
	m := req.Msg
	if len(m.GetData()) > maxInputRequest {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("input of %d bytes exceeds %d", len(m.GetData()), maxInputRequest))
	}
	p := s.a.procs.get(m.GetProcessId(), "")
	if p == nil {
		return nil, notFound(m.GetProcessId(), "")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has ended"))
	}
	if p.inClose {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the input is closed"))
	}
	n, gap := p.in.accept(m.GetOffset(), m.GetData())
	if gap {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("input offset %d is past the guest's %d", m.GetOffset(), p.in.offset))
	}
	p.notify()
	resp := &guestv1.SendInputResponse{AcceptedBytes: uint64(n), InputOffset: p.in.offset}
	if n < len(m.GetData()) {
		err := connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("input buffer full: %d of %d bytes accepted", n, len(m.GetData())))
		if d, derr := connect.NewErrorDetail(resp); derr == nil {
			err.AddDetail(d)
		}
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// WriteInput appends a stream of input: each message is taken whole
// before the next is read (waiting while the input buffer is full), so
// HTTP/2 flow control holds a sender back instead of a refusal.
func (s processService) WriteInput(ctx context.Context, stream *connect.ClientStream[guestv1.WriteInputRequest]) (*connect.Response[guestv1.WriteInputResponse], error) {
	var p *process
	var off, accepted uint64
	for first := true; stream.Receive(); first = false {
		m := stream.Msg()
		if len(m.GetData()) > maxInputRequest {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("input of %d bytes in one message exceeds %d", len(m.GetData()), maxInputRequest))
		}
		if first {
			if p = s.a.procs.get(m.GetProcessId(), ""); p == nil {
				return nil, notFound(m.GetProcessId(), "")
			}
			off = m.GetOffset()
		} else if m.GetProcessId() != "" && m.GetProcessId() != p.id {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a WriteInput stream names one process"))
		}
		data := m.GetData()
		for {
			p.mu.Lock()
			if p.exited != nil {
				p.mu.Unlock()
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has ended"))
			}
			if p.inClose {
				p.mu.Unlock()
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the input is closed"))
			}
			n, gap := p.in.accept(off, data)
			if gap {
				at := p.in.offset
				p.mu.Unlock()
				return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("input offset %d is past the guest's %d", off, at))
			}
			off += uint64(n)
			accepted += uint64(n)
			data = data[n:]
			if len(data) == 0 && m.GetCloseInput() {
				p.inClose = true
			}
			p.notify()
			changed := p.changed
			p.mu.Unlock()
			if len(data) == 0 {
				break
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	if p == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a WriteInput stream starts with a message naming the process"))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return connect.NewResponse(&guestv1.WriteInputResponse{AcceptedBytes: accepted, InputOffset: p.in.offset}), nil
}

func (s processService) CloseInput(ctx context.Context, req *connect.Request[guestv1.CloseInputRequest]) (*connect.Response[guestv1.CloseInputResponse], error) {
	p := s.a.procs.get(req.Msg.GetProcessId(), "")
	if p == nil {
		return nil, notFound(req.Msg.GetProcessId(), "")
	}
	p.mu.Lock()
	p.inClose = true
	p.notify()
	p.mu.Unlock()
	return connect.NewResponse(&guestv1.CloseInputResponse{}), nil
}

func (s processService) Signal(ctx context.Context, req *connect.Request[guestv1.SignalRequest]) (*connect.Response[guestv1.SignalResponse], error) {
	m := req.Msg
	p := s.a.procs.get(m.GetProcessId(), "")
	if p == nil {
		return nil, notFound(m.GetProcessId(), "")
	}
	if m.GetSignal() < 0 || m.GetSignal() > 64 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("no signal %d", m.GetSignal()))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has ended"))
	}
	var err error
	switch {
	case m.GetProcessGroup():
		// The group keeps its ID, which the kernel does not reuse while
		// any member lives.
		err = unix.Kill(-p.pid, unix.Signal(m.GetSignal()))
	case p.pidfd >= 0:
		err = unix.PidfdSendSignal(p.pidfd, unix.Signal(m.GetSignal()), nil, 0)
	default:
		err = unix.Kill(p.pid, unix.Signal(m.GetSignal()))
	}
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&guestv1.SignalResponse{}), nil
}

func (s processService) Resize(ctx context.Context, req *connect.Request[guestv1.ResizeRequest]) (*connect.Response[guestv1.ResizeResponse], error) {
	m := req.Msg
	p := s.a.procs.get(m.GetProcessId(), "")
	if p == nil {
		return nil, notFound(m.GetProcessId(), "")
	}
	if p.pty == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has no terminal"))
	}
	if m.GetRows() == 0 || m.GetCols() == 0 || m.GetRows() > 1<<15 || m.GetCols() > 1<<15 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("bad size %dx%d", m.GetRows(), m.GetCols()))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has ended"))
	}
	if err := setWinsize(p.pty, m.GetRows(), m.GetCols()); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&guestv1.ResizeResponse{}), nil
}

func (s processService) List(ctx context.Context, req *connect.Request[guestv1.ListRequest]) (*connect.Response[guestv1.ListResponse], error) {
	t := s.a.procs
	t.mu.Lock()
	order := append([]*process(nil), t.order...)
	t.mu.Unlock()
	resp := &guestv1.ListResponse{}
	for _, p := range order {
		p.mu.Lock()
		info := &guestv1.ProcessInfo{ProcessId: p.id, Tag: protocol.Clip(p.tag, 256), Argv: clipArgv(p.argv, 1<<10),
			Pid: int32(p.pid), Running: p.exited == nil, Exited: p.exited, Pty: p.pty != nil, OutputOffset: p.out.end}
		p.mu.Unlock()
		resp.Processes = append(resp.Processes, info)
	}
	return connect.NewResponse(resp), nil
}

// clipArgv cuts argv to at most max bytes in all.
func clipArgv(argv []string, max int) []string {
	var out []string
	for _, a := range argv {
		if max <= 0 {
			break
		}
		a = protocol.Clip(a, max)
		max -= len(a)
		out = append(out, a)
	}
	return out
}

// openPty opens a new pseudo-terminal of rows×cols (24×80 for zeros).
func openPty(rows, cols uint32) (master, slave *os.File, err error) {
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(mfd)
		return nil, nil, err
	}
	// O_NOCTTY: the terminal must not become PID 1's own (PID 1 leads
	// a session; closing the master would then SIGHUP it).
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	sfd := int(r)
	if errno != 0 {
		n, nerr := unix.IoctlGetInt(mfd, unix.TIOCGPTN)
		if nerr != nil {
			unix.Close(mfd)
			return nil, nil, nerr
		}
		sfd, err = unix.Open("/dev/pts/"+strconv.Itoa(n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			unix.Close(mfd)
			return nil, nil, err
		}
	}
	unix.CloseOnExec(sfd)
	if rows == 0 {
		rows = 24
	}
	if cols == 0 {
		cols = 80
	}
	if err := unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)}); err != nil {
		unix.Close(mfd)
		unix.Close(sfd)
		return nil, nil, err
	}
	_ = unix.SetNonblock(mfd, true)
	return os.NewFile(uintptr(mfd), "pty"), os.NewFile(uintptr(sfd), "pts"), nil
}

func setWinsize(f *os.File, rows, cols uint32) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	}); err != nil {
		return err
	}
	return ierr
}
