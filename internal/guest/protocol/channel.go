package protocol

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The descriptors PID 1 holds from its start (the init shim puts them
// there; package initshim).
const (
	// ChannelFD is the guest's end of the channel: it receives the
	// connections of the node (ChannelListener) and carries the guest's
	// notices back.
	ChannelFD = 3
	// NodeChannelFD is the node's end of the channel, which PID 1 keeps
	// open, unused, so that a node that restarts can take it back with
	// pidfd_getfd(2): no other process can (PID 1 is not dumpable, and
	// the workspace has no CAP_SYS_PTRACE).
	NodeChannelFD = 4
	// LogReadFD is the read end of the pipe that is PID 1's stdout and
	// stderr, kept by PID 1 for the node in the same way.
	LogReadFD = 5
)

// ChannelFDEnv names the environment variable that tells the guest agent
// its channel descriptor (ChannelFD). The agent removes it and never
// passes the descriptors on.
const ChannelFDEnv = "KIBOTOS_GUEST_CHANNEL_FD"

// Messages on the channel: one byte of kind, then the payload.
const (
	// MsgConn (node → guest) carries one unix stream socket (SCM_RIGHTS),
	// a connection for the guest to serve.
	MsgConn = 'C'
	// NoticePoweroff (guest → node): the guest has powered itself off
	// (its processes ended, its filesystems written back); the payload is
	// the reason. The node ends the execution and reports a guest
	// power-off instead of a crash.
	NoticePoweroff = 'P'
	// MaxNotice bounds a notice; the node reads no more (the rest of a
	// longer one is discarded by the kernel).
	MaxNotice = 1 + MaxText
)

// NewChannel makes a channel: two connected unix SOCK_SEQPACKET sockets,
// close-on-exec, non-blocking. node is pollable; guest is for the
// execution.
func NewChannel() (node, guest *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("channel: socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "channel"), os.NewFile(uintptr(fds[1]), "channel-guest"), nil
}

// NodeChannel is the node's end of a channel.
type NodeChannel struct {
	f  *os.File
	mu sync.Mutex // one send at a time (the write deadline is the file's)
}

// NewNodeChannel wraps the node's end of a channel (pollable, as from
// NewChannel or pidfd_getfd with O_NONBLOCK set). It takes f over.
func NewNodeChannel(f *os.File) *NodeChannel { return &NodeChannel{f: f} }

// Close closes the node's end (a copy PID 1 keeps stays open).
func (c *NodeChannel) Close() error { return c.f.Close() }

// Dial makes a new connection to the guest: a unix stream socket pair
// whose one end goes over the channel. The send is bounded by ctx; the
// connection's reads are bounded by the deadlines its user sets (Call
// takes them from its context).
func (c *NodeChannel) Dial(ctx context.Context) (net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("channel: socketpair: %w", err)
	}
	err = c.send(ctx, []byte{MsgConn}, unix.UnixRights(fds[1]))
	unix.Close(fds[1])
	if err != nil {
		unix.Close(fds[0])
		return nil, err
	}
	f := os.NewFile(uintptr(fds[0]), "guest-conn")
	conn, err := net.FileConn(f)
	f.Close()
	return conn, err
}

func (c *NodeChannel) send(ctx context.Context, p, oob []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Time{}
	}
	if err := c.f.SetWriteDeadline(dl); err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := c.f.SyscallConn()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), p, oob, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		return !errors.Is(serr, unix.EAGAIN)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return ctxErr(ctx, fmt.Errorf("channel: send: %w", err))
	}
	return nil
}

// ErrChannelClosed: the guest's end is gone (PID 1 ended) or sent an
// empty message, which on a SOCK_SEQPACKET socket reads as its end.
var ErrChannelClosed = errors.New("channel: closed by the guest")

// ReadNotice reads the next message the guest sent: its kind and payload,
// at most MaxNotice bytes in all. With wait false it returns
// (0, "", nil) at once when none is queued; with wait true it waits until
// one comes, the channel ends, or Close. Descriptors the guest may have
// attached are never received (the kernel closes them).
func (c *NodeChannel) ReadNotice(wait bool) (kind byte, payload string, err error) {
	rc, err := c.f.SyscallConn()
	if err != nil {
		return 0, "", err
	}
	buf := make([]byte, MaxNotice)
	var n int
	var rerr error
	empty := false
	err = rc.Read(func(fd uintptr) bool {
		n, _, _, _, rerr = unix.Recvmsg(int(fd), buf, nil, unix.MSG_DONTWAIT)
		if errors.Is(rerr, unix.EAGAIN) {
			if wait {
				return false
			}
			empty = true
			rerr = nil
		}
		return true
	})
	switch {
	case err != nil:
		return 0, "", err
	case rerr != nil:
		return 0, "", rerr
	case empty:
		return 0, "", nil
	case n == 0:
		return 0, "", ErrChannelClosed
	}
	return buf[0], string(buf[1:n]), nil
}

// ChannelListener is the guest's end of a channel as a net.Listener: each
// Accept is a connection the node sent. Notify sends a notice back.
type ChannelListener struct {
	f      *os.File
	closed atomic.Bool
}

// NewChannelListener takes f, the guest's end of a channel, over (and
// makes it non-blocking and close-on-exec).
func NewChannelListener(fd int) (*ChannelListener, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	unix.CloseOnExec(fd)
	return &ChannelListener{f: os.NewFile(uintptr(fd), "channel")}, nil
}

// Accept waits for the next connection from the node. Messages that are
// not one MsgConn with exactly one stream socket are dropped (their
// descriptors closed).
func (l *ChannelListener) Accept() (net.Conn, error) {
	rc, err := l.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	for {
		var n, oobn int
		var rerr error
		buf := make([]byte, 16)
		oob := make([]byte, unix.CmsgSpace(4*4))
		err := rc.Read(func(fd uintptr) bool {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if err != nil || rerr != nil {
			if l.closed.Load() {
				return nil, net.ErrClosed
			}
			return nil, errors.Join(err, rerr)
		}
		if n == 0 && oobn == 0 {
			return nil, net.ErrClosed // the node's end is closed everywhere
		}
		var fds []int
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if r, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		if n != 1 || buf[0] != MsgConn || len(fds) != 1 {
			for _, fd := range fds {
				unix.Close(fd)
			}
			continue
		}
		if t, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_STREAM {
			unix.Close(fds[0])
			continue
		}
		_ = unix.SetNonblock(fds[0], true)
		f := os.NewFile(uintptr(fds[0]), "node-conn")
		conn, err := net.FileConn(f)
		f.Close()
		if err != nil {
			continue
		}
		return conn, nil
	}
}

// Notify sends the node a notice of kind with payload (clipped to
// MaxNotice), waiting at most timeout for room on the channel.
func (l *ChannelListener) Notify(kind byte, payload string, timeout time.Duration) error {
	msg := append([]byte{kind}, Clip(payload, MaxNotice-1)...)
	if err := l.f.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	rc, err := l.f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), msg, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		return !errors.Is(serr, unix.EAGAIN)
	})
	if err != nil {
		return err
	}
	return serr
}

// Close stops Accept (which then returns net.ErrClosed).
func (l *ChannelListener) Close() error {
	l.closed.Store(true)
	return l.f.Close()
}

// Addr names the channel.
func (l *ChannelListener) Addr() net.Addr { return channelAddr{} }

type channelAddr struct{}

func (channelAddr) Network() string { return "kibotos-channel" }
func (channelAddr) String() string  { return "channel" }
