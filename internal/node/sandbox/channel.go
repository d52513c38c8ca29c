package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/node/sandbox/initshim"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// The node's side of an execution's guest: the channel (package protocol)
// and the guest's log. Everything read from the guest is bounded and has a
// deadline: a guest that floods, lies, stalls or vanishes makes its own
// execution UNRESPONSIVE (or ended), nothing else.
//
// Why the node gets its ends back from PID 1 after a restart: the channel
// and the log pipe are made by the node before PID 1 starts, and PID 1
// keeps a copy of the node's ends (protocol.NodeChannelFD,
// protocol.LogReadFD) that it never uses. A restarted node takes them with
// pidfd_getfd(2) through the pidfd it re-adopts PID 1 with, and accepts them
// only if they are the very socket and pipe it made (their inode numbers are
// in the execution record). Nothing is left on the host's disk for this
// (no socket path the guest could replace, no directory it could fill),
// and a notice the guest sent while no node ran (its power-off) is still
// queued in the channel. Only root of the host reaches those descriptors:
// PID 1 is not dumpable, and the workspace has no CAP_SYS_PTRACE. A new
// connection per request (protocol.NodeChannel.Dial) means that a node that
// restarted never resumes a half-read stream, which an HTTP/2 session on a
// single inherited connection could not survive either.

// Bounds of the guest's output on the node.
const (
	// logMaxBytes: a guest log that reaches it is rotated to
	// logs/<ws>.log.1 (replacing the previous one), so a workspace holds
	// at most twice this on the host's disk.
	logMaxBytes = 1 << 20
	// logRateBytes: at most this is copied from one guest per second; the
	// rest waits in the pipe, and a guest whose pipe is full drops lines.
	logRateBytes = 256 << 10
	// defaultExecTimeout bounds an Exec whose context has no deadline.
	defaultExecTimeout = 10 * time.Minute
)

// guestFiles are what a start makes for the channel and the log, the
// node's ends and the shim's.
type guestFiles struct {
	node                   *os.File // the node's end of the channel
	guest                  *os.File // the guest's end (ChannelFD)
	nodePark               *os.File // a copy of node for PID 1 to keep (NodeChannelFD)
	logR, logW             *os.File // the log pipe: the node's read end, PID 1's stdout and stderr
	logPark                *os.File // a copy of logR for PID 1 to keep (LogReadFD)
	channelInode, logInode uint64
}

// openGuestFiles makes the channel and the log pipe of a start; on error
// nothing is left open.
func openGuestFiles() (*guestFiles, error) {
	g := &guestFiles{}
	var err error
	if g.node, g.guest, err = protocol.NewChannel(); err != nil {
		return nil, err
	}
	if g.logR, g.logW, err = os.Pipe(); err != nil {
		g.close()
		return nil, err
	}
	if g.nodePark, err = dupFile(g.node); err == nil {
		g.logPark, err = dupFile(g.logR)
	}
	if err == nil {
		g.channelInode, err = inode(g.node)
	}
	if err == nil {
		g.logInode, err = inode(g.logR)
	}
	if err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

// shimFiles are the files the shim inherits at ChannelFD, NodeChannelFD
// and LogReadFD, in this order.
func (g *guestFiles) shimFiles() []*os.File { return []*os.File{g.guest, g.nodePark, g.logPark} }

// closeShimEnds closes what the shim has inherited (or failed to), and
// puts the node's ends back into non-blocking mode, which handing the
// copies to the shim took away.
func (g *guestFiles) closeShimEnds() {
	for _, f := range []*os.File{g.guest, g.nodePark, g.logPark, g.logW} {
		if f != nil {
			f.Close()
		}
	}
	g.guest, g.nodePark, g.logPark, g.logW = nil, nil, nil, nil
	for _, f := range []*os.File{g.node, g.logR} {
		if f != nil {
			if rc, err := f.SyscallConn(); err == nil {
				_ = rc.Control(func(fd uintptr) { _ = unix.SetNonblock(int(fd), true) })
			}
		}
	}
}

// close closes everything still open.
func (g *guestFiles) close() {
	g.closeShimEnds()
	for _, f := range []*os.File{g.node, g.logR} {
		if f != nil {
			f.Close()
		}
	}
	g.node, g.logR = nil, nil
}

// dupFile duplicates f (close-on-exec).
func dupFile(f *os.File) (*os.File, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}

// inode returns f's inode number.
func inode(f *os.File) (uint64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("sandbox: no inode number for %s", f.Name())
	}
	return st.Ino, nil
}

// takeBack gets the node's ends of an execution's channel and log from its
// PID 1 (pidfd_getfd) after a restart, each only if it is the socket or
// pipe st recorded. A missing one is nil (the guest closed or replaced
// it: the execution is then UNRESPONSIVE, and a forced stop ends it).
func takeBack(pidfd *os.File, st *execState) (ch *protocol.NodeChannel, logR *os.File, errs error) {
	if pidfd == nil {
		return nil, nil, errors.New("no pidfd")
	}
	get := func(target int, ino uint64, kind uint32) (*os.File, error) {
		if ino == 0 {
			return nil, fmt.Errorf("descriptor %d: not recorded", target)
		}
		var fd int
		var err error
		rc, cerr := pidfd.SyscallConn()
		if cerr != nil {
			return nil, cerr
		}
		_ = rc.Control(func(p uintptr) { fd, err = unix.PidfdGetfd(int(p), target, 0) })
		if err != nil {
			return nil, fmt.Errorf("descriptor %d: pidfd_getfd: %w", target, err)
		}
		var s unix.Stat_t
		if err := unix.Fstat(fd, &s); err != nil || s.Mode&unix.S_IFMT != kind || s.Ino != ino {
			unix.Close(fd)
			return nil, fmt.Errorf("descriptor %d of PID 1 is not the one the node made", target)
		}
		if kind == unix.S_IFSOCK {
			if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_SEQPACKET {
				unix.Close(fd)
				return nil, fmt.Errorf("descriptor %d of PID 1 is not the channel", target)
			}
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return nil, err
		}
		return os.NewFile(uintptr(fd), "guest"), nil
	}
	var all []error
	if f, err := get(initshim.NodeChannelFD, st.ChannelInode, unix.S_IFSOCK); err == nil {
		ch = protocol.NewNodeChannel(f)
	} else {
		all = append(all, err)
	}
	if f, err := get(initshim.LogReadFD, st.LogInode, unix.S_IFIFO); err == nil {
		logR = f
	} else {
		all = append(all, err)
	}
	return ch, logR, errors.Join(all...)
}

// attachGuest gives e its channel and log and starts reading both: the
// notices (readNotices) and the log (copyLog).
func (r *Runtime) attachGuest(e *execution, ch *protocol.NodeChannel, logR *os.File) {
	e.mu.Lock()
	e.ch, e.logR = ch, logR
	e.mu.Unlock()
	if ch != nil {
		go r.readNotices(e, ch)
	}
	if logR != nil {
		e.logDone = make(chan struct{})
		go r.copyLog(e, logR, e.logDone)
	}
}

// detachGuest closes the node's ends of e's channel and log; what PID 1
// keeps stays open. When e has ended, the log is drained first (at most
// one second).
func (e *execution) detachGuest() {
	e.mu.Lock()
	ch, logR, logDone := e.ch, e.logR, e.logDone
	e.ch, e.logR = nil, nil
	e.mu.Unlock()
	if ch != nil {
		ch.Close()
	}
	if logR != nil {
		if !e.alive() && logDone != nil {
			select {
			case <-logDone:
			case <-time.After(time.Second):
			}
		}
		logR.Close()
	}
}

// channel returns e's channel, or an error when it has none.
func (e *execution) channel() (*protocol.NodeChannel, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ch == nil {
		return nil, errors.New("sandbox: no channel to the guest")
	}
	return e.ch, nil
}

// call sends one request to e's guest on a new connection and returns the
// response, or an error (the guest's own text clipped to
// protocol.MaxText). ctx must have a deadline: it bounds the send, the
// write and the read, which stops at protocol.MaxResponse.
func (r *Runtime) call(ctx context.Context, e *execution, req protocol.Request) (protocol.Response, error) {
	if _, ok := ctx.Deadline(); !ok {
		return protocol.Response{}, errors.New("sandbox: a request to the guest needs a deadline")
	}
	ch, err := e.channel()
	if err != nil {
		return protocol.Response{}, err
	}
	conn, err := ch.Dial(ctx)
	if err != nil {
		return protocol.Response{}, err
	}
	defer conn.Close()
	resp, err := protocol.Call(ctx, conn, req)
	if err != nil {
		return protocol.Response{}, err
	}
	resp.Message = protocol.Clip(resp.Message, protocol.MaxText)
	resp.Error = protocol.Clip(resp.Error, protocol.MaxText)
	if err := protocol.Result(req.Op, resp); err != nil {
		return resp, err
	}
	return resp, nil
}

// ping asks e's guest for its condition and checks the protocol version it
// states (guestProtocol); an answer that cannot be decoded is ErrGuestProtocol
// too. A condition the guest may not report is a failed ping.
func (r *Runtime) ping(ctx context.Context, e *execution) (GuestCondition, string, error) {
	resp, err := r.call(ctx, e, protocol.Request{Op: protocol.OpPing})
	if errors.Is(err, protocol.ErrMalformed) {
		return "", "", fmt.Errorf("%w: the guest's answer is not of protocol %d: %s", ErrGuestProtocol,
			nodewire.GuestProtocolVersion, protocol.Clip(err.Error(), protocol.MaxText))
	}
	if err != nil {
		return "", "", err
	}
	if err := guestProtocol(resp); err != nil {
		return "", "", err
	}
	if !resp.Condition.Reported() {
		return "", "", fmt.Errorf("guest: ping: condition %q", protocol.Clip(string(resp.Condition), 64))
	}
	return resp.Condition, resp.Message, nil
}

// guestProtocol checks the protocol version a guest's answer to a ping
// states against the node's (nodewire.GuestProtocolVersion): another
// version, or none, is ErrGuestProtocol.
func guestProtocol(resp protocol.Response) error {
	switch v := resp.ProtocolVersion; v {
	case nodewire.GuestProtocolVersion:
		return nil
	case 0:
		return fmt.Errorf("%w: the guest states no protocol version (a guest built before the handshake?), the node speaks protocol %d",
			ErrGuestProtocol, nodewire.GuestProtocolVersion)
	default:
		return fmt.Errorf("%w: the guest speaks protocol %d, the node %d", ErrGuestProtocol, v, nodewire.GuestProtocolVersion)
	}
}

// readNotices waits for the guest's notices on ch. A power-off notice is
// recorded and ends the execution (watch then reports EventGuestExited);
// anything else ends the reading: the guest lied, and loses its notices.
func (r *Runtime) readNotices(e *execution, ch *protocol.NodeChannel) {
	kind, payload, err := ch.ReadNotice(true)
	if err != nil {
		return // closed by the node, or PID 1 is gone
	}
	r.notice(e, kind, payload)
}

// notice acts on one notice of e's guest.
func (r *Runtime) notice(e *execution, kind byte, payload string) {
	if kind != protocol.NoticePoweroff {
		r.log.Warn("the guest sent an unknown notice; it is ignored, and so are the guest's later notices", "workspace_id", e.ws, "kind", kind)
		return
	}
	reason := protocol.Clip(payload, protocol.MaxText)
	if reason == "" {
		reason = "no reason given"
	}
	e.mu.Lock()
	first := e.poweroff == ""
	if first {
		e.poweroff = reason
	}
	e.mu.Unlock()
	if first {
		r.log.Info("the guest powered off", "workspace_id", e.ws, "reason", reason)
		e.signal(unix.SIGKILL)
	}
}

// drainNotices reads the notices queued in e's channel without waiting
// (after a restart: the guest may have powered off meanwhile) and reports
// whether one was a power-off.
func (r *Runtime) drainNotices(e *execution, ch *protocol.NodeChannel) bool {
	for i := 0; i < 64; i++ {
		kind, payload, err := ch.ReadNotice(false)
		if err != nil || kind == 0 {
			break
		}
		r.notice(e, kind, payload)
		if kind != protocol.NoticePoweroff {
			return false
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.poweroff != ""
}

// copyLog copies the guest's log from src into logs/<ws>.log until src
// ends or is closed, rotating the file at logMaxBytes and copying at most
// logRateBytes a second while the execution runs.
func (r *Runtime) copyLog(e *execution, src *os.File, done chan struct{}) {
	defer close(done)
	p := r.logPath(e.ws)
	f, size, err := openLog(p)
	if err != nil {
		r.log.Warn("guest log", "workspace_id", e.ws, "err", err)
		_, _ = io.Copy(io.Discard, src)
		return
	}
	defer func() { f.Close() }()
	buf := make([]byte, 32<<10)
	window, inWindow := time.Now(), 0
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if size+int64(n) > logMaxBytes {
				f.Close()
				_ = os.Rename(p, p+".1")
				if f, size, err = openLog(p); err != nil {
					r.log.Warn("guest log", "workspace_id", e.ws, "err", err)
					_, _ = io.Copy(io.Discard, src)
					return
				}
			}
			m, _ := f.Write(buf[:n])
			size += int64(m)
			inWindow += n
		}
		if err != nil {
			return
		}
		if inWindow >= logRateBytes {
			if wait := time.Until(window.Add(time.Second)); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-e.done:
				case <-r.ctx.Done():
				}
				t.Stop()
			}
			window, inWindow = time.Now(), 0
		}
	}
}

// openLog opens a guest log for appending (never through a symlink) and
// returns its size; one that already passed logMaxBytes is rotated first.
func openLog(p string) (*os.File, int64, error) {
	if fi, err := os.Lstat(p); err == nil && fi.Size() >= logMaxBytes {
		_ = os.Rename(p, p+".1")
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}
