// Package protocol is the node ↔ guest wire protocol of the sandbox runtime.
//
// It is internal, and versioned: nodewire.GuestProtocolVersion is the
// version a build speaks. The node runs its own kibotos-guest or a
// Platform's, which may be of another build; it boots only one that speaks
// its version. Before the boot it reads the binary's declaration
// (nodewire.GuestProtocolOf); after it, the handshake is the first ping:
// the guest states the version it speaks (Response.ProtocolVersion), and a
// guest that states another, none, or answers what the node cannot decode
// fails its start for good. A change of this protocol that an older node or
// guest cannot follow takes a new version.
//
// # Transport
//
// The channel is the node's (channel.go): before PID 1 starts, the node
// makes a pair of connected unix SOCK_SEQPACKET sockets and hands the guest
// one end as an inherited descriptor (ChannelFD). Each connection the node
// wants is a fresh unix stream socket pair: it sends one end over the
// channel (SCM_RIGHTS), and the guest serves it as an accepted connection
// (ChannelListener). The guest never names a path the node opens, and the
// node uses nothing the guest sends as a host path. A vsock port of a
// microVM runtime would replace only the channel: "send a socket over the
// channel" is the same operation as "connect to the port".
//
// A connection carries one of two protocols, told apart by its first byte:
// "{" the newline-JSON line protocol below (ping, writeback, shutdown, and
// the agent tests' exec), "P" — the client preface of HTTP/2 with prior
// knowledge (h2c) — the data plane: connect-go services of package
// guestv1 (proto/kibotos/guest/v1), today the ProcessService.
//
// Outside the sandbox runtime (the agent's own tests, the crun reference of
// bench/workspacebench) the guest can instead listen on SocketPath, and Dial
// and Do reach it there; the sandbox runtime never does.
//
// # Framing
//
// One JSON object per line ("\n"-terminated). A client writes a Request
// line and reads exactly one Response line; it may send further requests on
// the same connection, one at a time. Byte slices travel as base64 (the
// encoding/json default), so a message never contains a raw newline. A
// request is at most MaxRequest bytes, a response at most MaxResponse: the
// reader stops at the bound, so a guest cannot make the node buffer more.
//
// # Requests
//
//   - OpPing: the guest answers with its Condition, a Message and the
//     protocol version it speaks (ProtocolVersion). A guest that answers
//     is at least BOOTING; READY once it serves requests. The node's first
//     ping after the boot is the version handshake, and every later one
//     checks the version again.
//   - OpWriteback: the guest syncs the writable layer (syncfs on "/", which on
//     overlayfs flushes the upper ext4 filesystem down to its loop device and
//     from there to the image file) and every mounted storage filesystem
//     (future Volumes). OK=true is the confirmation a normal stop waits for;
//     Synced lists the mount points it flushed.
//   - OpShutdown: the guest powers itself off: it answers first, then asks
//     every process to end (SIGTERM, a short grace, SIGKILL), writes back,
//     and tells the node with a power-off notice on the channel
//     (NoticePoweroff); it then waits for the node to end it.
//   - OpExec: runs Exec.Argv inside the workspace and answers with its
//     output (at most MaxExecOutput bytes of each stream) and exit code. It
//     is the agent tests' way to run a command in listening mode; the node
//     runs processes through the data plane's ProcessService instead.
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
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Paths inside the workspace, for the guest's listening mode (not used by
// the sandbox runtime).
const (
	// GuestDir holds what a runtime in listening mode puts into a workspace.
	GuestDir = "/run/kibotos"
	// SocketDir is the directory the guest listens in.
	SocketDir = GuestDir + "/sock"
	// SocketName is the name of the guest's socket in SocketDir.
	SocketName = "guest.sock"
	// SocketPath is where the guest agent listens in listening mode.
	SocketPath = SocketDir + "/" + SocketName
	// GuestBinaryPath is where a runtime in listening mode mounts
	// kibotos-guest.
	GuestBinaryPath = GuestDir + "/kibotos-guest"
)

// Bounds of the protocol.
const (
	// MaxRequest bounds one request line (the node's; an exec's stdin
	// travels in it).
	MaxRequest = 1 << 20
	// MaxResponse bounds one response line: everything the guest sends
	// on a connection. The node reads no more.
	MaxResponse = 64 << 10
	// MaxExecOutput bounds each of stdout and stderr of an OpExec, so that
	// both, base64-encoded, fit in MaxResponse.
	MaxExecOutput = 16 << 10
	// MaxDataPlaneMessage bounds one message of the data plane's services
	// (package guestv1), both ways: connect.WithReadMaxBytes on the node
	// and in the guest.
	MaxDataPlaneMessage = 512 << 10
	// MaxText bounds the free text of a response (Message, Error, Signal,
	// each Synced entry): the guest clips to it, and so does the node
	// before it logs or reports any.
	MaxText = 1 << 10
)

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

// Reported reports whether a guest may report c about itself (UNRESPONSIVE
// is the node's verdict, never the guest's).
func (c Condition) Reported() bool {
	switch c {
	case ConditionReady, ConditionBooting, ConditionDiskPressure, ConditionMemoryPressure:
		return true
	}
	return false
}

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

// Response is one response line.
type Response struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Condition and Message answer OpPing (and accompany every response).
	Condition Condition `json:"condition,omitempty"`
	Message   string    `json:"message,omitempty"`
	// ProtocolVersion answers OpPing: the version of this protocol the
	// guest speaks (nodewire.GuestProtocolVersion of its build; versions
	// start at 1, so 0 states none). A JSON number that is not a uint32
	// makes the response undecodable (ErrMalformed).
	ProtocolVersion uint32 `json:"protocol_version,omitempty"`
	// Synced lists the mount points an OpWriteback flushed.
	Synced []string    `json:"synced,omitempty"`
	Exec   *ExecResult `json:"exec,omitempty"`
}

// Clip returns s cut to at most n bytes, on a UTF-8 boundary, with "…"
// when something was cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ell = "…"
	cut := n - len(ell)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ell
}

// WriteMessage writes v as one line of at most max bytes.
func WriteMessage(w io.Writer, v any, max int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b)+1 > max {
		return fmt.Errorf("protocol: message of %d bytes exceeds %d", len(b)+1, max)
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// ErrTooLong: a line went past its bound. The reader has consumed at most
// the bound, and the connection is of no further use.
var ErrTooLong = errors.New("protocol: message exceeds its bound")

// ErrMalformed: a line is not one JSON object of the expected type (a
// syntax error, a field of the wrong type, an unknown field, something
// after the object).
var ErrMalformed = errors.New("protocol: malformed message")

// ReadMessage reads one line of at most max bytes into v. It never
// buffers more than max bytes (plus bufio's buffer). A line that does not
// decode strictly into v is ErrMalformed.
func ReadMessage(r *bufio.Reader, v any, max int) error {
	var buf []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(buf)+len(chunk) > max {
			return fmt.Errorf("%w (%d bytes)", ErrTooLong, max)
		}
		buf = append(buf, chunk...)
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
		return fmt.Errorf("%w: decode: %w", ErrMalformed, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: more than one value on a line", ErrMalformed)
	}
	return nil
}

// Call sends req on conn and reads the response (at most MaxResponse
// bytes), bounded by ctx: without a deadline in ctx, the read has none
// either, so callers on the node always set one.
func Call(ctx context.Context, conn net.Conn, req Request) (Response, error) {
	var resp Response
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := WriteMessage(conn, req, MaxRequest); err != nil {
		return resp, ctxErr(ctx, err)
	}
	if err := ReadMessage(bufio.NewReaderSize(conn, 4096), &resp, MaxResponse); err != nil {
		return resp, ctxErr(ctx, err)
	}
	return resp, nil
}

// Result turns a response with OK=false into an error carrying its text
// (clipped to MaxText).
func Result(op Op, resp Response) error {
	if resp.OK {
		return nil
	}
	msg := resp.Error
	if msg == "" {
		msg = "request failed"
	}
	return fmt.Errorf("guest: %s: %s", op, Clip(msg, MaxText))
}

// Dial connects to a guest listening at path (listening mode). Paths longer
// than a sockaddr_un can hold are reached through their directory
// (/proc/self/fd/N/name).
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

// Do dials a guest listening at path (listening mode), sends one request
// and returns the response. A response with OK=false is returned together
// with an error carrying its text.
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
	return resp, Result(req.Op, resp)
}

func ctxErr(ctx context.Context, err error) error {
	if _, ok := ctx.Deadline(); ok && errors.Is(err, os.ErrDeadlineExceeded) {
		// The I/O deadline is ctx's own (or set when ctx ended): it can fire
		// a moment before ctx reports it. Wait for ctx, so that the caller
		// sees context.DeadlineExceeded either way (bounded, in case a
		// deadline of another origin fired).
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}
