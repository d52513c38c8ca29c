package dataplane

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

func testKey(b byte) ed25519.PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = b
	}
	k, _ := KeyFromSeed(seed)
	return k
}

func testClaims() *Claims {
	now := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	return &Claims{Version: 1, SessionID: "dps-1", WorkspaceID: "ws-1", Generation: 3,
		Scopes: []string{ScopeExec}, IssuedAt: now.UnixMicro(), ExpiresAt: now.Add(time.Minute).UnixMicro()}
}

func sign(t *testing.T, k ed25519.PrivateKey, c *Claims) string {
	t.Helper()
	tok, err := Sign(k, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestSignParse(t *testing.T) {
	k := testKey(1)
	c := testClaims()
	tok := sign(t, k, c)
	if !strings.HasPrefix(tok, "kbd1.") || strings.Count(tok, ".") != 2 || len(tok) > MaxTokenBytes {
		t.Fatalf("Sign = %q, want kbd1.<claims>.<sig> within %d bytes", tok, MaxTokenBytes)
	}
	// Deterministic: the same claims give the same token (replays re-sign).
	if again := sign(t, k, testClaims()); again != tok {
		t.Fatalf("Sign is not deterministic: %q then %q", tok, again)
	}
	got, err := Parse(k.Public().(ed25519.PublicKey), tok)
	if err != nil {
		t.Fatalf("Parse = %v", err)
	}
	if got.SessionID != c.SessionID || got.WorkspaceID != c.WorkspaceID || got.Generation != c.Generation ||
		got.ExpiresAt != c.ExpiresAt || got.IssuedAt != c.IssuedAt || len(got.Scopes) != 1 || !got.Has(ScopeExec) || got.Has(ScopeFilesystem) {
		t.Fatalf("Parse = %+v, want %+v", got, c)
	}
}

func TestParseRefuses(t *testing.T) {
	k := testKey(1)
	pub := k.Public().(ed25519.PublicKey)
	tok := sign(t, k, testClaims())
	head, sig, _ := cutLast(tok)
	claimsOf := func(edit func(*Claims)) string {
		c := testClaims()
		edit(c)
		return sign(t, k, c)
	}
	enc := base64.RawURLEncoding.EncodeToString
	signRaw := func(json string) string {
		h := "kbd1." + enc([]byte(json))
		return h + "." + enc(ed25519.Sign(k, append([]byte(sigDomain), h...)))
	}
	for _, tc := range []struct {
		name, token string
		want        error
	}{
		{"empty", "", ErrMalformed},
		{"no dots", "kbd1", ErrMalformed},
		{"other prefix", "kbd2" + tok[4:], ErrMalformed},
		{"extra part", head + ".x." + sig, ErrMalformed},
		{"padded signature", tok + "=", ErrMalformed},
		{"short signature", head + "." + sig[:10], ErrMalformed},
		{"too long", tok + strings.Repeat("A", MaxTokenBytes), ErrMalformed},
		{"wrong key", sign(t, testKey(2), testClaims()), ErrSignature},
		{"signature of other claims", claimsOf(func(c *Claims) { c.Generation = 4 })[:len(head)] + "." + sig, ErrSignature},
		{"version 2", claimsOf(func(c *Claims) { c.Version = 2 }), ErrMalformed},
		{"no scopes", claimsOf(func(c *Claims) { c.Scopes = nil }), ErrMalformed},
		{"unknown scope", claimsOf(func(c *Claims) { c.Scopes = []string{"root"} }), ErrMalformed},
		{"no workspace", claimsOf(func(c *Claims) { c.WorkspaceID = "" }), ErrMalformed},
		{"generation 0", claimsOf(func(c *Claims) { c.Generation = 0 }), ErrMalformed},
		{"unknown field", signRaw(`{"v":1,"sid":"s","ws":"w","gen":1,"scp":["exec"],"iat":1,"exp":2,"x":1}`), ErrMalformed},
		{"trailing JSON", signRaw(`{"v":1,"sid":"s","ws":"w","gen":1,"scp":["exec"],"iat":1,"exp":2} {}`), ErrMalformed},
		{"not JSON", signRaw(`nope`), ErrMalformed},
	} {
		if _, err := Parse(pub, tc.token); !errors.Is(err, tc.want) {
			t.Errorf("Parse(%s) = %v, want %v", tc.name, err, tc.want)
		}
	}
	// Any single changed character is refused.
	for i := range tok {
		b := []byte(tok)
		b[i] ^= 0x01
		if _, err := Parse(pub, string(b)); err == nil {
			t.Errorf("Parse accepts the token with byte %d changed", i)
		}
	}
}

// FuzzParse: Parse never panics, and whatever it accepts re-signs to the
// same token (one token per claims).
func FuzzParse(f *testing.F) {
	k := testKey(1)
	pub := k.Public().(ed25519.PublicKey)
	tok, _ := Sign(k, testClaims())
	f.Add(tok)
	f.Add("kbd1..")
	f.Add("kbd1.e30.AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse(pub, s)
		if err != nil {
			return
		}
		again, err := Sign(k, c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(pub, again); err != nil {
			t.Fatalf("re-signed claims do not parse: %v", err)
		}
	})
}
