package kibotos

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kibotos/kibotos/internal/commandid"
)

// Errors ValidateCommandID wraps; test them with errors.Is.
var (
	// ErrInvalidCommandID: the ID does not match ^[A-Za-z0-9][A-Za-z0-9._/-]*$
	// or is not 1 to 128 bytes long. The server answers invalid_argument
	// (reason INVALID_COMMAND_ID).
	ErrInvalidCommandID = errors.New("invalid command ID")
	// ErrReservedCommandID: the ID starts with a prefix reserved for commands
	// ctrl starts itself (expiration/, host-memory/, guest-shutdown/). The
	// server answers invalid_argument (reason RESERVED_COMMAND_ID).
	ErrReservedCommandID = errors.New("reserved command ID")
)

// MaxCommandIDLen is the maximum length of a command ID, in bytes.
const MaxCommandIDLen = 128

// ReservedCommandIDPrefixes returns the prefixes reserved for commands ctrl
// starts itself.
func ReservedCommandIDPrefixes() []string {
	return append([]string(nil), commandid.ReservedPrefixes...)
}

// ValidateCommandID checks id against the rules the server applies to the
// command ID of a write: 1 to 128 bytes matching
// ^[A-Za-z0-9][A-Za-z0-9._/-]*$, and no reserved prefix. The error wraps
// ErrInvalidCommandID or ErrReservedCommandID.
//
// The SDK does not call it when sending: a request with a bad ID reaches the
// server, which answers invalid_argument. Call it on IDs you build or
// receive, before saving them.
func ValidateCommandID(id string) error {
	if err := commandid.ValidateFormat(id); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidCommandID, message(err))
	}
	if err := commandid.Validate("", id); err != nil {
		return fmt.Errorf("%w: %s", ErrReservedCommandID, message(err))
	}
	return nil
}

// message strips the reason suffix internal errors carry: the sentinel says
// it already.
func message(err error) string {
	s := err.Error()
	for _, suffix := range []string{" (INVALID_COMMAND_ID)", " (RESERVED_COMMAND_ID)"} {
		s = strings.TrimSuffix(s, suffix)
	}
	return s
}

// NewCommandID returns a fresh random command ID that passes
// ValidateCommandID ("cmd-" and 26 base32 characters, 128 random bits).
// Save it before sending the request that carries it.
func NewCommandID() string { return commandid.NewID() }
