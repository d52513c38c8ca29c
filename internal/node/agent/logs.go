package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
)

// The node's own service on its data tunnels: the log of each workspace,
// at /w/WORKSPACE_ID/kibotos.node.v1.WorkspaceLogService/ReadLog, read
// from the node's files (Logs), never from anything of the workspace's.

// ErrNoLog is returned by Logs for a workspace of which the node keeps no
// log.
var ErrNoLog = errors.New("no log of the workspace is kept")

// Logs is implemented by a Runtime that keeps the output of its
// workspaces' guests and PID 1: the data service then serves it.
type Logs interface {
	// OpenLog opens workspaceID's log: the rotated file (nil when there is
	// none) and the current one (nil when there is none), consecutive;
	// ErrNoLog when neither exists.
	OpenLog(workspaceID string) (rotated, current *os.File, err error)
}

// Bounds of the log service.
const (
	// MaxLogChunk bounds the data of one ReadLogResponse.
	MaxLogChunk = 64 << 10
	// MaxLogReaders bounds the ReadLog streams open at once on a node;
	// one more fails with resource_exhausted.
	MaxLogReaders = 64
	// logPoll is how often a follower looks for new output.
	logPoll = 250 * time.Millisecond
)

// logService serves WorkspaceLogService over Logs.
type logService struct {
	l     Logs
	slots chan struct{}
	poll  time.Duration
}

func newLogService(l Logs) *logService {
	return &logService{l: l, slots: make(chan struct{}, MaxLogReaders), poll: logPoll}
}

var _ nodev1connect.WorkspaceLogServiceHandler = (*logService)(nil)

// open is OpenLog with its errors as the service answers them.
func (s *logService) open(id string) (rotated, current *os.File, err error) {
	rotated, current, err = s.l.OpenLog(id)
	if errors.Is(err, ErrNoLog) {
		return nil, nil, connect.NewError(connect.CodeNotFound, errors.New("no log of the workspace is kept"))
	}
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeUnavailable, errors.New("the workspace's log cannot be read right now"))
	}
	return rotated, current, nil
}

// ReadLog streams the rotated file, then the current one, from tail_bytes
// before their end (or their end, from_end); with follow, then what is
// written next, across rotations, until the call ends or the log is
// deleted.
func (s *logService) ReadLog(ctx context.Context, req *connect.Request[nodev1.ReadLogRequest], out *connect.ServerStream[nodev1.ReadLogResponse]) error {
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d logs are being read on this node", MaxLogReaders))
	}
	id, _ := ctx.Value(guestKey{}).(string)
	m := req.Msg
	rot, cur, err := s.open(id)
	if err != nil {
		return err
	}
	defer func() {
		if cur != nil {
			cur.Close()
		}
	}()
	rs, cs := size(rot), size(cur)
	var skip int64
	switch total := rs + cs; {
	case m.GetFromEnd():
		skip = total
	case m.GetTailBytes() > 0 && int64(m.GetTailBytes()) < total:
		skip = total - int64(m.GetTailBytes())
	}
	if m.GetFollow() {
		// The stream opens at once (an empty chunk), whether or not
		// anything is kept yet: a caller waiting for it is not held until
		// the workspace writes.
		if err := out.Send(&nodev1.ReadLogResponse{}); err != nil {
			return err
		}
	}
	buf := make([]byte, MaxLogChunk)
	if rot != nil {
		err := func() error {
			defer rot.Close()
			if skip >= rs {
				return nil
			}
			return sendFrom(out, rot, skip, rs-skip, buf)
		}()
		if err != nil {
			return err
		}
		skip = max(skip-rs, 0)
	}
	if cur != nil {
		if err := sendFrom(out, cur, skip, cs-skip, buf); err != nil {
			return err
		}
	}
	if !m.GetFollow() {
		return nil
	}
	t := time.NewTicker(s.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if cur != nil {
			n, err := sendRest(out, cur, buf)
			if err != nil {
				return err
			}
			if n > 0 {
				continue
			}
		}
		// Nothing new: a rotation makes another file the current one.
		r2, c2, err := s.l.OpenLog(id)
		if errors.Is(err, ErrNoLog) {
			return nil // deleted
		}
		if err != nil {
			continue
		}
		if r2 != nil {
			r2.Close()
		}
		if c2 == nil || (cur != nil && sameFile(c2, cur)) {
			if c2 != nil {
				c2.Close()
			}
			continue
		}
		if cur != nil {
			// What was written before the rotation, then the new file.
			if _, err := sendRest(out, cur, buf); err != nil {
				c2.Close()
				return err
			}
			cur.Close()
		}
		cur = c2
		if _, err := sendRest(out, cur, buf); err != nil {
			return err
		}
	}
}

// size is f's size, 0 for nil.
func size(f *os.File) int64 {
	if f == nil {
		return 0
	}
	fi, err := f.Stat()
	if err != nil {
		return 0
	}
	return fi.Size()
}

func sameFile(a, b *os.File) bool {
	fa, err1 := a.Stat()
	fb, err2 := b.Stat()
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// sendFrom sends n bytes of f from off, and leaves f after them.
func sendFrom(out *connect.ServerStream[nodev1.ReadLogResponse], f *os.File, off, n int64, buf []byte) error {
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return connect.NewError(connect.CodeUnavailable, errors.New("the workspace's log cannot be read right now"))
	}
	_, err := send(out, io.LimitReader(f, n), buf)
	return err
}

// sendRest sends f from where it is to its end.
func sendRest(out *connect.ServerStream[nodev1.ReadLogResponse], f *os.File, buf []byte) (int64, error) {
	return send(out, f, buf)
}

// send sends r to its end in chunks of buf's size.
func send(out *connect.ServerStream[nodev1.ReadLogResponse], r io.Reader, buf []byte) (int64, error) {
	var total int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if serr := out.Send(&nodev1.ReadLogResponse{Data: buf[:n]}); serr != nil {
				return total, serr
			}
			total += int64(n)
		}
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, connect.NewError(connect.CodeUnavailable, errors.New("the workspace's log cannot be read right now"))
		}
	}
}
