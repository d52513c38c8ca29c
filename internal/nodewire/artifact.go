package nodewire

import (
	"bytes"
	"strconv"
)

// FeatureArtifacts: the node fetches the published Templates and Platforms
// it needs from ctrl (NodeService.FetchArtifact), verifies their digest and
// caches them by digest, so placement may send it a Workspace of a
// published Template it does not hold yet.
const FeatureArtifacts = "artifacts"

// GuestProtocolVersion is the version of the node-guest protocol this
// build speaks. A node boots an execution only with a guest (its own, or a
// Platform's) that speaks the same version.
const GuestProtocolVersion = 1

// GuestProtocolMarker is how a guest binary declares its protocol version:
// the bytes GuestProtocolMarker, the version in decimal, then ';' (see
// GuestProtocolDeclaration). ctrl reads it when a Platform is committed and
// the node before it boots one, without running the binary.
const GuestProtocolMarker = "kibotos-guest-protocol="

// GuestProtocolDeclaration is the declaration a guest binary carries; the
// guest keeps it alive by printing it (kibotos-guest --protocol-version).
const GuestProtocolDeclaration = GuestProtocolMarker + "1;"

// maxProtocolDigits bounds the version's digits.
const maxProtocolDigits = 9

// GuestProtocolOf returns the protocol version a guest binary declares: the
// first GuestProtocolMarker followed by 1 to 9 digits and ';'. ok is false
// when the binary declares none (or only malformed ones).
func GuestProtocolOf(binary []byte) (version uint32, ok bool) {
	rest := binary
	for {
		i := bytes.Index(rest, []byte(GuestProtocolMarker))
		if i < 0 {
			return 0, false
		}
		rest = rest[i+len(GuestProtocolMarker):]
		n := 0
		for n < len(rest) && n <= maxProtocolDigits && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 0 || n > maxProtocolDigits || n >= len(rest) || rest[n] != ';' {
			continue
		}
		v, err := strconv.ParseUint(string(rest[:n]), 10, 32)
		if err != nil {
			continue
		}
		return uint32(v), true
	}
}
