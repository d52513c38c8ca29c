// Package commandid validates and generates command IDs, the idempotency keys
// that callers attach to mutating requests.
//
// A command ID is 1 to MaxLen bytes matching ^[A-Za-z0-9][A-Za-z0-9._/-]*$.
// IDs that start with one of ReservedPrefixes belong to commands the server
// starts itself and are refused when a caller sends them.
package commandid

import (
	"crypto/rand"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/internal/fault"
)

// MaxLen is the maximum length of a command ID in bytes.
const MaxLen = 128

// displayLen is how many bytes of an oversized ID an error message shows.
const displayLen = 64

// ReservedPrefixes are the prefixes of command IDs the server builds for
// commands it starts itself. The match is exact and case-sensitive.
var ReservedPrefixes = []string{"expiration/", "host-memory/", "guest-shutdown/"}

// allowed[b] is 1 for bytes allowed after the first one, 2 for bytes that
// may also start an ID (ASCII letters and digits).
var allowed = func() (t [256]uint8) {
	for b := '0'; b <= '9'; b++ {
		t[b] = 2
	}
	for b := 'a'; b <= 'z'; b++ {
		t[b] = 2
		t[b-'a'+'A'] = 2
	}
	for _, b := range "._/-" {
		t[b] = 1
	}
	return t
}()

// ValidateFormat checks only the format of id: its length and alphabet. It
// accepts reserved prefixes, so it also serves IDs the server builds itself.
// The returned error is a *fault.Error with reason INVALID_COMMAND_ID and an
// empty Field.
func ValidateFormat(id string) error {
	if e := checkFormat("", id); e != nil {
		return e
	}
	return nil
}

// Validate checks the format of a caller-supplied id and refuses reserved
// prefixes. field is the request field path, e.g. "metadata.command_id". A
// malformed id yields a *fault.Error with reason INVALID_COMMAND_ID, a
// reserved one reason RESERVED_COMMAND_ID; both have Kind invalid_argument.
func Validate(field, id string) error {
	if e := checkFormat(field, id); e != nil {
		return e
	}
	for _, p := range ReservedPrefixes {
		if strings.HasPrefix(id, p) {
			return fault.InvalidReason(fault.ReasonReservedCommandID, field,
				"command ID %q uses the prefix %q, which is reserved for commands the server starts itself", id, p)
		}
	}
	return nil
}

// IsReserved reports whether id starts with one of ReservedPrefixes.
func IsReserved(id string) bool {
	for _, p := range ReservedPrefixes {
		if strings.HasPrefix(id, p) {
			return true
		}
	}
	return false
}

// NewID returns a fresh random command ID that passes Validate: "cmd-"
// followed by 26 lower-case base32 characters (128 random bits from
// crypto/rand).
func NewID() string {
	return "cmd-" + strings.ToLower(rand.Text())
}

func checkFormat(field, id string) *fault.Error {
	if id == "" {
		return fault.InvalidReason(fault.ReasonInvalidCommandID, field, "command ID is empty")
	}
	if len(id) > MaxLen {
		return fault.InvalidReason(fault.ReasonInvalidCommandID, field,
			"command ID %s is %d bytes long, at most %d are allowed", display(id), len(id), MaxLen)
	}
	if allowed[id[0]] != 2 {
		return fault.InvalidReason(fault.ReasonInvalidCommandID, field,
			"command ID %q must start with an ASCII letter or digit", id)
	}
	for i := 1; i < len(id); i++ {
		if allowed[id[i]] == 0 {
			return fault.InvalidReason(fault.ReasonInvalidCommandID, field,
				"command ID %q contains the byte %q at offset %d; only ASCII letters, digits, '.', '_', '/' and '-' are allowed",
				id, id[i:i+1], i)
		}
	}
	return nil
}

// display quotes an oversized id, keeping only its first displayLen bytes.
func display(id string) string {
	if len(id) <= displayLen {
		return strconv.Quote(id)
	}
	return strconv.Quote(id[:displayLen]) + "..."
}
