// Package paging implements page sizes and opaque page tokens for listings.
//
// Listings are ordered by the keyset (created_at, id), compared at
// microsecond precision in UTC. A page token carries the key of the last item
// of the previous page, authenticated with HMAC-SHA256 under a server key.
// It is valid only for the kind of listing and the exact filters it was
// issued for; the token does not contain the filters, not even a hash of
// them: they are bound through the MAC input.
package paging

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"hash"
	"time"

	"github.com/kibotos/kibotos/internal/fault"
)

const (
	// DefaultPageSize is the page size used when a request asks for 0.
	DefaultPageSize = 100
	// MaxPageSize is the largest page size a request may ask for.
	MaxPageSize = 1000
	// MaxTokenLen is the longest page token Decode accepts, in characters.
	MaxTokenLen = 1024
	// MaxCursorIDLen is the longest Cursor.ID Encode accepts, in bytes.
	MaxCursorIDLen = 512
	// MinKeyLen is the shortest key NewCodec accepts, in bytes.
	MinKeyLen = 32

	tokenField = "page_token"
	version    = 1
	tagLen     = 16 // HMAC-SHA256 truncated to 128 bits
	headerLen  = 1 + 8
)

// PageSize validates a requested page size and returns the effective one: 0
// selects DefaultPageSize; sizes above MaxPageSize are refused with an
// invalid_argument fault on field, never clamped.
func PageSize(field string, n uint32) (int, error) {
	switch {
	case n == 0:
		return DefaultPageSize, nil
	case n > MaxPageSize:
		return 0, fault.Invalid(field, "page size %d is above the maximum of %d", n, MaxPageSize)
	}
	return int(n), nil
}

// Cursor is the keyset position of the last item of the previous page.
type Cursor struct {
	// CreatedAt is the item's creation time; only microseconds are kept.
	CreatedAt time.Time
	// ID is the item's ID, the tie-breaker among equal creation times.
	ID string
}

// Precedes reports whether an item with the given creation time and id comes
// after c in listing order, that is whether it belongs on the page c leads
// to. Times are compared at microsecond precision.
func (c Cursor) Precedes(createdAt time.Time, id string) bool {
	a, b := c.CreatedAt.UnixMicro(), createdAt.UnixMicro()
	return a < b || a == b && c.ID < id
}

// Codec encodes and verifies page tokens. It is safe for concurrent use.
type Codec struct {
	key []byte
}

// NewCodec returns a Codec that authenticates tokens with key. It panics if
// key is shorter than MinKeyLen bytes. Tokens issued under one key do not
// verify under another.
func NewCodec(key []byte) *Codec {
	if len(key) < MinKeyLen {
		panic("paging: page token key shorter than 32 bytes")
	}
	return &Codec{key: append([]byte(nil), key...)}
}

// Encode returns a token for the page after cur. kind names the listing
// (e.g. "egress"); filter is the canonical encoding of every filter of the
// request (see Filter). The creation time is kept at microsecond precision.
// Encode panics if cur.ID is longer than MaxCursorIDLen bytes, which is a
// programming error: IDs are server-generated.
//
// A token is the unpadded base64url encoding of: a version byte, the
// creation time in Unix microseconds (8 bytes, big-endian), the ID, and a
// 16-byte tag. The tag is HMAC-SHA256 over the length-prefixed kind and
// filter and everything before it; with a 36-byte ID the token is 82
// characters long.
func (c *Codec) Encode(kind string, filter []byte, cur Cursor) string {
	if len(cur.ID) > MaxCursorIDLen {
		panic("paging: cursor ID longer than MaxCursorIDLen")
	}
	b := make([]byte, 0, headerLen+len(cur.ID)+sha256.Size)
	b = append(b, version)
	b = binary.BigEndian.AppendUint64(b, uint64(cur.CreatedAt.UnixMicro()))
	b = append(b, cur.ID...)
	b = c.mac(kind, filter, b).Sum(b)[:len(b)+tagLen]
	return base64.RawURLEncoding.EncodeToString(b)
}

// Decode verifies token and returns its cursor. An empty token returns
// (Cursor{}, false, nil), meaning the first page. Any problem with a
// non-empty token (malformed, tampered with, issued under another key, for
// another kind of listing or for other filters, of another version, longer
// than MaxTokenLen) yields the same invalid_argument fault with reason
// PAGE_TOKEN_INVALID on field "page_token". The cursor's time is in UTC.
func (c *Codec) Decode(kind string, filter []byte, token string) (cur Cursor, ok bool, err error) {
	if token == "" {
		return Cursor{}, false, nil
	}
	if len(token) > MaxTokenLen {
		return Cursor{}, false, invalidToken()
	}
	raw, derr := base64.RawURLEncoding.DecodeString(token)
	// The decoder skips '\r' and '\n' and tolerates stray padding bits;
	// accept only the one canonical spelling of each token.
	if derr != nil || len(raw) < headerLen+tagLen || base64.RawURLEncoding.EncodeToString(raw) != token {
		return Cursor{}, false, invalidToken()
	}
	body, tag := raw[:len(raw)-tagLen], raw[len(raw)-tagLen:]
	if !hmac.Equal(tag, c.mac(kind, filter, body).Sum(nil)[:tagLen]) || body[0] != version {
		return Cursor{}, false, invalidToken()
	}
	micro := int64(binary.BigEndian.Uint64(body[1:headerLen]))
	return Cursor{CreatedAt: time.UnixMicro(micro).UTC(), ID: string(body[headerLen:])}, true, nil
}

// mac returns an HMAC over the token context and body.
func (c *Codec) mac(kind string, filter, body []byte) hash.Hash {
	m := hmac.New(sha256.New, c.key)
	m.Write(Filter([]byte("kibotos page token"), []byte(kind), filter))
	m.Write(body)
	return m
}

func invalidToken() error {
	return fault.InvalidReason(fault.ReasonPageTokenInvalid, tokenField,
		"page token is invalid, or was issued for a different listing or different filters")
}

// Filter builds canonical filter bytes from parts. Each part is preceded by
// its length as an unsigned varint, so ("ab", "c") and ("a", "bc") differ.
// Callers pass every filter of the request in a fixed order, e.g.
// Filter([]byte(state), labels.Canonical(selector)).
func Filter(parts ...[]byte) []byte {
	n := 0
	for _, p := range parts {
		n += binary.MaxVarintLen64 + len(p)
	}
	b := make([]byte, 0, n)
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}
