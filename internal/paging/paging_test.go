package paging

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/fault"
)

var (
	testKey  = []byte("0123456789abcdef0123456789abcdef")
	otherKey = []byte("fedcba9876543210fedcba9876543210")
	filter   = Filter([]byte("running"), []byte{0})
	cursor   = Cursor{CreatedAt: time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC), ID: "0f8fad5b-d9cb-469f-a165-70867728950e"}
)

func wantTokenInvalid(t *testing.T, err error) {
	t.Helper()
	fe, ok := fault.As(err)
	if !ok || fe.Kind != fault.KindInvalidArgument || fe.Reason != fault.ReasonPageTokenInvalid || fe.Field != "page_token" {
		t.Fatalf("error = %#v, want invalid_argument PAGE_TOKEN_INVALID on page_token", err)
	}
}

func TestPageSize(t *testing.T) {
	tests := []struct {
		n    uint32
		want int
		ok   bool
	}{
		{0, DefaultPageSize, true},
		{1, 1, true},
		{100, 100, true},
		{999, 999, true},
		{1000, 1000, true},
		{1001, 0, false},
		{1 << 31, 0, false},
		{^uint32(0), 0, false},
	}
	for _, tt := range tests {
		got, err := PageSize("page_size", tt.n)
		if tt.ok {
			if err != nil || got != tt.want {
				t.Errorf("PageSize(%d) = %d, %v, want %d", tt.n, got, err, tt.want)
			}
			continue
		}
		fe, ok := fault.As(err)
		if !ok || fe.Kind != fault.KindInvalidArgument || fe.Reason != fault.ReasonInvalidArgument || fe.Field != "page_size" {
			t.Errorf("PageSize(%d) = %d, %#v, want invalid_argument on page_size", tt.n, got, err)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	c := NewCodec(testKey)
	cursors := []Cursor{
		cursor,
		{},
		{CreatedAt: time.Unix(0, 0), ID: "x"},
		{CreatedAt: time.Date(1969, 12, 31, 23, 59, 59, 999999000, time.UTC), ID: "neg"},
		{CreatedAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.FixedZone("X", 3600)), ID: strings.Repeat("i", MaxCursorIDLen)},
	}
	for _, cur := range cursors {
		tok := c.Encode("sandbox", filter, cur)
		if len(tok) > MaxTokenLen {
			t.Fatalf("token is %d characters long", len(tok))
		}
		got, ok, err := c.Decode("sandbox", filter, tok)
		if err != nil || !ok {
			t.Fatalf("Decode = %v, %v, %v", got, ok, err)
		}
		if got.ID != cur.ID || !got.CreatedAt.Equal(cur.CreatedAt.Truncate(time.Microsecond)) || got.CreatedAt.Location() != time.UTC {
			t.Fatalf("Decode = %+v, want %+v", got, cur)
		}
	}
	if tok := c.Encode("sandbox", filter, cursor); len(tok) > 120 {
		t.Errorf("token for a UUID is %d characters long: %s", len(tok), tok)
	}
}

func TestEmptyToken(t *testing.T) {
	cur, ok, err := NewCodec(testKey).Decode("sandbox", filter, "")
	if err != nil || ok || cur != (Cursor{}) {
		t.Fatalf("Decode(\"\") = %+v, %v, %v", cur, ok, err)
	}
}

func TestTamper(t *testing.T) {
	c := NewCodec(testKey)
	tok := c.Encode("sandbox", filter, cursor)
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/.\n "
	for i := range len(tok) {
		for _, r := range []byte(alphabet) {
			if r == tok[i] {
				continue
			}
			bad := tok[:i] + string(r) + tok[i+1:]
			_, ok, err := c.Decode("sandbox", filter, bad)
			if ok || err == nil {
				t.Fatalf("tampered token %q (byte %d) verified", bad, i)
			}
			wantTokenInvalid(t, err)
		}
	}
	for _, bad := range []string{
		tok[:len(tok)-1], tok[1:], tok + "A", "A" + tok, tok + "\n", tok + "=", tok + tok,
		"x", "!!!!", strings.Repeat("A", 40), strings.Repeat("A", MaxTokenLen+1),
	} {
		_, _, err := c.Decode("sandbox", filter, bad)
		wantTokenInvalid(t, err)
	}
}

func TestBinding(t *testing.T) {
	c := NewCodec(testKey)
	tok := c.Encode("sandbox", filter, cursor)
	cases := []struct {
		name   string
		codec  *Codec
		kind   string
		filter []byte
	}{
		{"other kind", c, "egress", filter},
		{"empty kind", c, "", filter},
		{"other filter", c, "sandbox", Filter([]byte("stopped"), []byte{0})},
		{"no filter", c, "sandbox", nil},
		{"shifted filter", c, "sandbox", Filter([]byte("runnin"), []byte("g"), []byte{0})},
		{"other key", NewCodec(otherKey), "sandbox", filter},
	}
	for _, tt := range cases {
		_, ok, err := tt.codec.Decode(tt.kind, tt.filter, tok)
		if ok {
			t.Errorf("%s: token verified", tt.name)
			continue
		}
		wantTokenInvalid(t, err)
	}
	// Kind and filter are not interchangeable.
	a := c.Encode("ab", Filter([]byte("c")), cursor)
	if _, ok, _ := c.Decode("a", Filter([]byte("bc")), a); ok {
		t.Error("kind/filter boundary is ambiguous")
	}
}

func TestTokenHidesFilter(t *testing.T) {
	c := NewCodec(testKey)
	secret := []byte("tenant=acme-secret-project")
	tok := c.Encode("sandbox", secret, cursor)
	if strings.Contains(tok, "acme") {
		t.Fatal("token contains the filter")
	}
	// The token depends on the filter only through the tag.
	a := c.Encode("sandbox", secret, cursor)
	b := c.Encode("sandbox", []byte("other"), cursor)
	if a[:len(a)-24] != b[:len(b)-24] {
		t.Fatal("filter leaks into the token body")
	}
}

func TestWrongVersion(t *testing.T) {
	// A structurally valid token with a correct tag but another version.
	c := NewCodec(testKey)
	body := []byte{2, 0, 0, 0, 0, 0, 0, 0, 1, 'x'}
	raw := c.mac("sandbox", filter, body).Sum(body)[:len(body)+tagLen]
	tok := encode(raw)
	_, ok, err := c.Decode("sandbox", filter, tok)
	if ok {
		t.Fatal("token of version 2 verified")
	}
	wantTokenInvalid(t, err)
	body[0] = version
	raw = c.mac("sandbox", filter, body).Sum(body)[:len(body)+tagLen]
	if _, ok, err := c.Decode("sandbox", filter, encode(raw)); !ok || err != nil {
		t.Fatalf("hand-built version 1 token: %v, %v", ok, err)
	}
}

func TestSameErrorForAllFailures(t *testing.T) {
	c := NewCodec(testKey)
	tok := c.Encode("sandbox", filter, cursor)
	_, _, e1 := c.Decode("egress", filter, tok)
	_, _, e2 := c.Decode("sandbox", filter, "%%%")
	_, _, e3 := NewCodec(otherKey).Decode("sandbox", filter, tok)
	if e1.Error() != e2.Error() || e2.Error() != e3.Error() {
		t.Fatalf("errors differ: %v / %v / %v", e1, e2, e3)
	}
}

func TestNewCodecKeyLength(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("NewCodec accepted a 31-byte key")
		}
	}()
	NewCodec(make([]byte, 31))
}

func TestNewCodecCopiesKey(t *testing.T) {
	key := bytes.Clone(testKey)
	c := NewCodec(key)
	tok := c.Encode("k", nil, cursor)
	key[0] ^= 1
	if _, ok, err := c.Decode("k", nil, tok); !ok || err != nil {
		t.Fatal("codec shares the caller's key slice")
	}
}

func TestEncodePanicsOnLongID(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Encode accepted an oversized ID")
		}
	}()
	NewCodec(testKey).Encode("k", nil, Cursor{ID: strings.Repeat("i", MaxCursorIDLen+1)})
}

func TestFilter(t *testing.T) {
	if bytes.Equal(Filter([]byte("ab"), []byte("c")), Filter([]byte("a"), []byte("bc"))) {
		t.Error(`Filter("ab","c") == Filter("a","bc")`)
	}
	if bytes.Equal(Filter([]byte("a")), Filter([]byte("a"), nil)) {
		t.Error("trailing empty part is lost")
	}
	if !bytes.Equal(Filter([]byte("x"), nil), Filter([]byte("x"), []byte{})) {
		t.Error("nil and empty parts differ")
	}
}

func TestPrecedes(t *testing.T) {
	base := time.Date(2024, 1, 1, 0, 0, 0, 5000, time.UTC)
	c := Cursor{CreatedAt: base, ID: "m"}
	tests := []struct {
		at   time.Time
		id   string
		want bool
	}{
		{base, "m", false},
		{base, "n", true},
		{base, "l", false},
		{base.Add(time.Microsecond), "a", true},
		{base.Add(-time.Microsecond), "z", false},
		{base.Add(999 * time.Nanosecond), "m", false}, // same microsecond
		{base.In(time.FixedZone("X", 7200)), "n", true},
	}
	for _, tt := range tests {
		if got := c.Precedes(tt.at, tt.id); got != tt.want {
			t.Errorf("Precedes(%v, %q) = %v, want %v", tt.at, tt.id, got, tt.want)
		}
	}
}

func encode(raw []byte) string { return base64.RawURLEncoding.EncodeToString(raw) }

// FuzzDecode checks that Decode never panics, that tokens not produced by
// the codec never verify, and that Encode and Decode round-trip.
func FuzzDecode(f *testing.F) {
	fuzzCodec := NewCodec([]byte("fuzz key: never used to write seeds!"))
	f.Fuzz(func(t *testing.T, token, kind string, filter []byte, micro int64, id string) {
		cur, ok, err := fuzzCodec.Decode(kind, filter, token)
		if token == "" {
			if ok || err != nil || cur != (Cursor{}) {
				t.Fatalf("empty token: %+v, %v, %v", cur, ok, err)
			}
		} else {
			if ok || err == nil {
				t.Fatalf("random token %q verified as %+v", token, cur)
			}
			wantTokenInvalid(t, err)
		}

		if len(id) > MaxCursorIDLen {
			id = id[:MaxCursorIDLen]
		}
		in := Cursor{CreatedAt: time.UnixMicro(micro), ID: id}
		tok := fuzzCodec.Encode(kind, filter, in)
		if len(tok) > MaxTokenLen {
			t.Fatalf("token is %d characters long", len(tok))
		}
		out, ok, err := fuzzCodec.Decode(kind, filter, tok)
		if err != nil || !ok || out.ID != in.ID || !out.CreatedAt.Equal(in.CreatedAt) || out.CreatedAt.UnixMicro() != micro {
			t.Fatalf("round trip of %+v: %+v, %v, %v", in, out, ok, err)
		}
		if _, ok, _ := fuzzCodec.Decode(kind+"x", filter, tok); ok {
			t.Fatal("token verified for another kind")
		}
		if _, ok, _ := fuzzCodec.Decode(kind, append(bytes.Clone(filter), 0), tok); ok {
			t.Fatal("token verified for another filter")
		}
		if token != "" && token != tok {
			if _, ok, _ := fuzzCodec.Decode(kind, filter, token); ok {
				t.Fatalf("random token %q verified", token)
			}
		}
	})
}
