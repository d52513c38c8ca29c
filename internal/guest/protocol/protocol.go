// Package protocol is the node ↔ guest wire protocol of the sandbox runtime.
//
// It is internal and may change freely: the node and the guest agent ship
// together (the node bind-mounts its own kibotos-guest into every execution).
//
// Transport: a unix stream socket that the guest agent listens on inside the
// workspace at SocketPath. The node reaches it through the host directory
// that the runtime bind-mounts at SocketDir. Framing: one JSON object per
// line ("\n"-terminated, at most MaxMessage bytes). A client writes a Request
// line and reads exactly one Response line; it may send further requests on
// the same connection, one at a time. Byte slices travel as base64 (the
// encoding/json default), so a message never contains a raw newline.
//
// Requests:
//
//   - OpPing: the guest answers with its Condition and a Message. A guest
//     that answers is at least BOOTING; READY once it serves requests.
//   - OpWriteback: the guest syncs the writable layer (syncfs on "/", which on
//     overlayfs flushes the upper ext4 filesystem down to its loop device and
//     from there to the image file) and every mounted storage filesystem
//     (future Volumes). OK=true is the confirmation a normal stop waits for;
//     Synced lists the mount points it flushed.
//   - OpShutdown: the guest powers itself off: it answers first, then asks
//     every process to end (SIGTERM, a short grace, SIGKILL), writes back,
//     leaves PoweroffMarker in SocketDir and exits.
//   - OpExec: runs Exec.Argv inside the workspace and answers with its
//     output and exit code. It is the tests' way to run a command today and
//     will grow into the data plane.
package protocol

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// ReadyByte is what the guest agent writes to its ready descriptor.
const ReadyByte = 'R'

// Paths inside the workspace.
const (
	// GuestDir holds everything the runtime puts into a workspace.
	GuestDir = "/run/kibotos"
	// SocketDir is the host directory bind-mounted into the workspace.
	SocketDir = GuestDir + "/sock"
	// SocketName is the name of the guest's socket in SocketDir.
	SocketName = "guest.sock"
	// SocketPath is where the guest agent listens.
	SocketPath = SocketDir + "/" + SocketName
	// GuestBinaryPath is where the runtime mounts kibotos-guest (read-only).
	GuestBinaryPath = GuestDir + "/kibotos-guest"
	// ReadyFDEnv names the environment variable that hands the guest agent
	// an inherited file descriptor (the write end of a pipe from the node):
	// the agent writes ReadyByte to it and closes it once it listens on its
	// socket, so that the node learns of it without polling. The agent
	// removes the variable and never passes the descriptor on.
	ReadyFDEnv = "KIBOTOS_GUEST_READY_FD"
	// PoweroffMarker is the file the guest leaves in SocketDir when it
	// powered itself off (not killed). Its content is the reason.
	PoweroffMarker = "poweroff"
)

// MaxMessage bounds one line of the protocol.
const MaxMessage = 64 << 20

// Op names a request.
type Op string

// The requests.
const (
	OpPing      Op = "ping"
	OpWriteback Op = "writeback"
	OpShutdown  Op = "shutdown"
	OpExec      Op = "exec"
)

// Condition is what the guest reports about itself. The names match
// kibotos.ctrl.v1.GuestCondition without its prefix.
type Condition string

// The conditions.
const (
	ConditionUnspecified    Condition = ""
	ConditionReady          Condition = "READY"
	ConditionBooting        Condition = "BOOTING"
	ConditionUnresponsive   Condition = "UNRESPONSIVE"
	ConditionDiskPressure   Condition = "DISK_PRESSURE"
	ConditionMemoryPressure Condition = "MEMORY_PRESSURE"
)

// Request is one request line.
type Request struct {
	Op Op `json:"op"`
	// TimeoutMillis bounds the work the request asks for (exec, writeback),
	// 0 for the guest's default.
	TimeoutMillis int64        `json:"timeout_ms,omitempty"`
	Exec          *ExecRequest `json:"exec,omitempty"`
}

// ExecRequest describes a command to run in the workspace.
type ExecRequest struct {
	// Argv is the command; Argv[0] is looked up in the PATH of Env.
	Argv []string `json:"argv"`
	// Env is the environment; empty selects the workspace default
	// (PATH, HOME=/root, TERM=dumb).
	Env []string `json:"env,omitempty"`
	// Dir is the working directory; empty is /root (or / without it).
	Dir string `json:"dir,omitempty"`
	// Stdin is fed to the command, then closed.
	Stdin []byte `json:"stdin,omitempty"`
}

// ExecResult is the outcome of an OpExec.
type ExecResult struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	// ExitCode is the exit status, or 128+signal when a signal ended it.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that ended the command, if one did.
	Signal string `json:"signal,omitempty"`
	// TimedOut reports that the command was killed at its timeout.
	TimedOut bool `json:"timed_out,omitempty"`
	// Truncated reports that output beyond MaxExecOutput was dropped.
	Truncated bool `json:"truncated,omitempty"`
}

// MaxExecOutput bounds each of stdout and stderr of an OpExec.
const MaxExecOutput = 16 << 20

// Response is one response line.
type Response struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Condition and Message answer OpPing (and accompany every response).
	Condition Condition `json:"condition,omitempty"`
	Message   string    `json:"message,omitempty"`
	// Synced lists the mount points an OpWriteback flushed.
	Synced []string    `json:"synced,omitempty"`
	Exec   *ExecResult `json:"exec,omitempty"`
}

// WriteMessage writes v as one line.
func WriteMessage(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b)+1 > MaxMessage {
		return fmt.Errorf("protocol: message of %d bytes exceeds %d", len(b), MaxMessage)
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// ReadMessage reads one line into v.
func ReadMessage(r *bufio.Reader, v any) error {
	var buf []byte
	for {
		chunk, err := r.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > MaxMessage {
			return fmt.Errorf("protocol: message exceeds %d bytes", MaxMessage)
		}
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) && len(buf) > 0 {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("protocol: decode: %w", err)
	}
	return nil
}

// Dial connects to the guest socket at path. Paths longer than a sockaddr_un
// can hold are reached through their directory (/proc/self/fd/N/name).
func Dial(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) < 100 {
		return d.DialContext(ctx, "unix", path)
	}
	dir, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	short := "/proc/self/fd/" + strconv.Itoa(int(dir.Fd())) + "/" + filepath.Base(path)
	return d.DialContext(ctx, "unix", short)
}

// Call sends req on conn and reads the response, bounded by ctx.
func Call(ctx context.Context, conn net.Conn, req Request) (Response, error) {
	var resp Response
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := WriteMessage(conn, req); err != nil {
		return resp, ctxErr(ctx, err)
	}
	if err := ReadMessage(bufio.NewReader(conn), &resp); err != nil {
		return resp, ctxErr(ctx, err)
	}
	return resp, nil
}

// Do dials path, sends one request and returns the response. A response
// with OK=false is returned together with an error carrying its text.
func Do(ctx context.Context, path string, req Request) (Response, error) {
	conn, err := Dial(ctx, path)
	if err != nil {
		return Response{}, err
	}
	defer conn.Close()
	resp, err := Call(ctx, conn, req)
	if err != nil {
		return resp, err
	}
	if !resp.OK {
		msg := resp.Error
		if msg == "" {
			msg = "request failed"
		}
		return resp, fmt.Errorf("guest: %s: %s", req.Op, msg)
	}
	return resp, nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}
