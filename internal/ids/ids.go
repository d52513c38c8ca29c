// Package ids makes and checks the IDs of the objects ctrl creates: a
// prefix naming the kind of object ("ws-", "eg-", "rs-", "en-") followed by
// 20 random lower-case base32 characters (100 bits). Command IDs, which the
// caller chooses, follow their own rules in internal/commandid.
package ids

import (
	"crypto/rand"
	"encoding/base32"
	"strings"

	"github.com/kibotos/kibotos/internal/fault"
)

// MaxLen bounds the length of an ID worth looking up.
const MaxLen = 64

var encoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// New returns a fresh ID with prefix.
func New(prefix string) string {
	var b [13]byte
	_, _ = rand.Read(b[:])
	return prefix + strings.ToLower(encoding.EncodeToString(b[:])[:20])
}

// Validate checks an ID a request gives in field: required
// (invalid_argument); one that cannot exist — another kind's prefix, longer
// than MaxLen — is not_found without a look-up. noun names the kind of
// object in the message ("egress").
func Validate(field, prefix, noun, id string) error {
	if id == "" {
		return fault.Invalid(field, "%s is required", field)
	}
	if !strings.HasPrefix(id, prefix) || len(id) > MaxLen {
		return fault.NotFound(noun, Truncate(id))
	}
	return nil
}

// Truncate shortens a caller's ID, or another string of the caller's, for
// an error message: at most MaxLen bytes, then "…".
func Truncate(s string) string {
	if len(s) > MaxLen {
		return s[:MaxLen] + "…"
	}
	return s
}
