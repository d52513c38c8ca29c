// Package nodewire holds the bounds of the ctrl ↔ node protocol
// (kibotos.node.v1), shared by both ends: the largest message of the
// NodeService stream, the bounds of the texts a report carries, and Cut,
// which brings a text within one. Much of a report's text comes from the
// guest, which is untrusted: the node agent cuts it before it goes on the
// wire, and ctrl cuts it again before anything is stored or answered,
// whatever the node sent. docs/api.md documents the numbers.
package nodewire

import (
	"strings"
	"unicode/utf8"
)

const (
	// MaxMessageBytes bounds every message of a NodeService stream, in each
	// direction: a Hello of about 5,000 executions with maximal texts, or a
	// full desired state of more than 100,000 workspaces, fits. A larger
	// message ends that one stream.
	MaxMessageBytes = 16 << 20
	// MaxGuestMessageBytes bounds a guest condition's message
	// (ExecutionReport.guest_message, GuestObservation.message).
	MaxGuestMessageBytes = 1024
	// MaxFailureMessageBytes bounds the node's part of a failure's message
	// (ExecutionReport.failure_message; ErrorDetail.message adds a short
	// prefix, "the stop failed: ").
	MaxFailureMessageBytes = 2048
)

// marker ends a text that was cut.
const marker = "…"

// Cut returns s as valid UTF-8 of at most max bytes: unchanged when it is
// both already, otherwise cut on a character boundary and ending in "…"
// when something was cut. Invalid bytes become U+FFFD (a protobuf string
// must be valid UTF-8: an invalid one would fail the whole stream). It
// reads no more of s than it keeps.
func Cut(s string, max int) string {
	if len(s) <= max && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(min(len(s), max))
	keep := 0 // bytes of b that leave room for the marker
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:]) // an invalid byte is (RuneError, 1)
		if b.Len()+utf8.RuneLen(r) > max {
			return b.String()[:keep] + marker
		}
		b.WriteRune(r)
		i += n
		if b.Len() <= max-len(marker) {
			keep = b.Len()
		}
	}
	return b.String()
}
