package agent

import (
	"strings"
	"unicode/utf8"
)

// Bounds of what the agent puts on the wire. The guest is untrusted, and
// what the runtime says about it (a condition's message, an error that
// quotes the guest) is cut to these bounds before a report leaves the node;
// ctrl cuts again with the same numbers (internal/reconciler, where a test
// keeps the two equal) before anything is stored. docs/api.md documents
// them.
const (
	// MaxGuestMessageBytes bounds a report's guest_message.
	MaxGuestMessageBytes = 1024
	// MaxFailureMessageBytes bounds a report's failure_message.
	MaxFailureMessageBytes = 2048
	// MaxMessageBytes bounds every message of the NodeService stream, both
	// ways: a larger message from ctrl is refused (the stream ends and the
	// agent reconnects), and ctrl refuses larger ones from the node.
	MaxMessageBytes = 16 << 20
)

// truncMarker ends a text that was cut.
const truncMarker = "…"

// Truncate returns s as valid UTF-8 of at most max bytes: unchanged when it
// is both already, otherwise cut on a character boundary and ending in "…"
// when something was cut. Invalid bytes become U+FFFD (a protobuf string
// must be valid UTF-8: an invalid one would fail the whole stream). It
// reads no more of s than it keeps.
func Truncate(s string, max int) string {
	if len(s) <= max && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(min(len(s), max))
	keep := 0 // bytes of b that leave room for the marker
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:]) // an invalid byte is (RuneError, 1)
		if b.Len()+utf8.RuneLen(r) > max {
			return b.String()[:keep] + truncMarker
		}
		b.WriteRune(r)
		i += n
		if b.Len() <= max-len(truncMarker) {
			keep = b.Len()
		}
	}
	return b.String()
}

// failureMessage is the bounded text of a failure.
func failureMessage(err error) string { return Truncate(errString(err), MaxFailureMessageBytes) }
