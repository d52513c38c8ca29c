package sandbox

import (
	"errors"
	"fmt"
)

// Errors the caller (the node agent) maps to execution reports. Test with
// errors.Is.
var (
	// ErrWritebackFailed: a normal stop could not get the guest's writeback
	// confirmation (timeout, error, no answer). The execution is left
	// running and still held; a FORCE stop releases it.
	ErrWritebackFailed = errors.New("sandbox: guest did not confirm writeback")
	// ErrStopSuperseded: a FORCE stop superseded this normal stop while it
	// waited for the guest. The forced stop decides the outcome.
	ErrStopSuperseded = errors.New("sandbox: normal stop superseded by a forced stop")
	// ErrNotRunning: the workspace has no execution.
	ErrNotRunning = errors.New("sandbox: workspace has no execution")
	// ErrRunning: the operation needs a workspace without execution (Resize).
	ErrRunning = errors.New("sandbox: workspace holds an execution")
	// ErrCapacity: an invalid writable layer capacity (not whole MiB, too
	// small, or smaller than the existing layer).
	ErrCapacity = errors.New("sandbox: invalid writable layer capacity")
	// ErrNoLayer: the workspace has no writable layer yet.
	ErrNoLayer = errors.New("sandbox: writable layer does not exist")
	// ErrInvalidSpec: the Spec is malformed (workspace id, template, limits).
	ErrInvalidSpec = errors.New("sandbox: invalid spec")
	// ErrGuestNotReady: the execution started but its guest agent never
	// answered within the start timeout; the start was rolled back.
	ErrGuestNotReady = errors.New("sandbox: guest agent did not become ready")
	// ErrGuestProtocol: the guest's first answer (the version handshake of
	// the first ping) does not state the node-guest protocol version the
	// node speaks (nodewire.GuestProtocolVersion): it states another, none,
	// or cannot be decoded. The start was rolled back; the same guest
	// binary answers the same, so it is Permanent. Later pings that fail
	// the check count as failed (UNRESPONSIVE).
	ErrGuestProtocol = errors.New("sandbox: guest protocol mismatch")
	// ErrStart: the execution could not be set up (mounts, cgroup, loop
	// device, init); the start was rolled back.
	ErrStart = errors.New("sandbox: start failed")
	// ErrRelease: resources of a stopped execution could not be released
	// (a loop device still attached, a cgroup that would not go). The
	// execution stays recorded so that a later forced stop retries.
	ErrRelease = errors.New("sandbox: could not release execution resources")
	// ErrClosed: the Runtime was closed.
	ErrClosed = errors.New("sandbox: runtime closed")
)

// WritebackError details ErrWritebackFailed.
type WritebackError struct {
	WorkspaceID string
	Err         error
}

func (e *WritebackError) Error() string {
	return fmt.Sprintf("sandbox: %s: guest did not confirm writeback: %v", e.WorkspaceID, e.Err)
}

// Is makes errors.Is(err, ErrWritebackFailed) true.
func (e *WritebackError) Is(target error) bool { return target == ErrWritebackFailed }

// Unwrap returns the cause.
func (e *WritebackError) Unwrap() error { return e.Err }
