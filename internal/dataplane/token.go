// Package dataplane issues and verifies data-plane credentials
// (SessionService): short-lived tokens bound to one Workspace, its
// data_plane_generation, a set of scopes and an expiry.
//
// A token is "kbd1.<claims>.<signature>": claims is the base64url (no
// padding) of the JSON of Claims, signature the base64url of the Ed25519
// signature of "kibotos data-plane token\x00kbd1.<claims>" with the key
// every replica shares (store.Secret(SecretName), a 32-byte seed). Ed25519
// is deterministic and Claims encodes to the same bytes every time, so the
// same claims always give the same token: ctrl never stores a token, it
// records the claims (the command's response without the token) and signs
// them again when the command ID is replayed.
//
// A token is checked without a store read per message (Verifier): the
// signature and expiry locally, the generation against a per-Workspace cache
// refreshed through the store's Notifier.
package dataplane

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// SecretName names the token signing key (an Ed25519 seed) in the store.
const SecretName = "data-plane-token-ed25519"

// Bounds of a token's lifetime.
const (
	DefaultTTL = 10 * time.Minute
	MinTTL     = 10 * time.Second
	MaxTTL     = 24 * time.Hour
)

// MaxTokenBytes bounds a presented token; longer ones are refused unread.
const MaxTokenBytes = 1024

const (
	tokenPrefix = "kbd1"
	sigDomain   = "kibotos data-plane token\x00"
	version     = 1
)

// Scope names in the claims.
const (
	ScopeExec       = "exec"
	ScopeFilesystem = "filesystem"
)

var scopeNames = map[ctrlv1.DataPlaneScope]string{
	ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC:       ScopeExec,
	ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM: ScopeFilesystem,
}

// ScopeName returns the claim name of a scope, "" for an unknown one.
func ScopeName(s ctrlv1.DataPlaneScope) string { return scopeNames[s] }

// Claims is what a token asserts. Its JSON (field order fixed by the
// struct) is the token's middle part.
type Claims struct {
	// Version is 1.
	Version int `json:"v"`
	// SessionID is the credential's ID ("dps-...").
	SessionID string `json:"sid"`
	// WorkspaceID is the only Workspace the token is accepted for.
	WorkspaceID string `json:"ws"`
	// Generation is the Workspace's data_plane_generation at issue.
	Generation uint64 `json:"gen"`
	// Scopes are the scope names (ScopeExec, ScopeFilesystem).
	Scopes []string `json:"scp"`
	// IssuedAt and ExpiresAt are Unix microseconds.
	IssuedAt  int64 `json:"iat"`
	ExpiresAt int64 `json:"exp"`
}

// Expiry returns ExpiresAt as a time.
func (c *Claims) Expiry() time.Time { return time.UnixMicro(c.ExpiresAt).UTC() }

// Has reports whether the claims grant scope.
func (c *Claims) Has(scope string) bool { return slices.Contains(c.Scopes, scope) }

// ClaimsOf returns the claims of an issued session (without its token).
func ClaimsOf(s *ctrlv1.DataPlaneSession) *Claims {
	c := &Claims{Version: version, SessionID: s.GetSessionId(), WorkspaceID: s.GetWorkspaceId(),
		Generation: s.GetDataPlaneGeneration(),
		IssuedAt:   s.GetCreatedAt().AsTime().UnixMicro(), ExpiresAt: s.GetExpireTime().AsTime().UnixMicro()}
	for _, sc := range s.GetScopes() {
		c.Scopes = append(c.Scopes, ScopeName(sc))
	}
	return c
}

// Sign returns the token of c under key.
func Sign(key ed25519.PrivateKey, c *Claims) (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	head := tokenPrefix + "." + base64.RawURLEncoding.EncodeToString(b)
	sig := ed25519.Sign(key, append([]byte(sigDomain), head...))
	return head + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// ErrMalformed is a token that is not a well-formed kbd1 token.
var ErrMalformed = errors.New("malformed data-plane token")

// ErrSignature is a well-formed token whose signature does not verify.
var ErrSignature = errors.New("data-plane token signature does not verify")

// Parse checks a token's form and signature under key and returns its
// claims. It does not check expiry, Workspace, scope or generation (the
// Verifier does). It never echoes the token in its errors.
func Parse(key ed25519.PublicKey, token string) (*Claims, error) {
	if len(token) > MaxTokenBytes {
		return nil, ErrMalformed
	}
	head, sigText, ok := cutLast(token)
	if !ok {
		return nil, ErrMalformed
	}
	prefix, claimsText, ok := strings.Cut(head, ".")
	if !ok || prefix != tokenPrefix || strings.Contains(claimsText, ".") {
		return nil, ErrMalformed
	}
	enc := base64.RawURLEncoding.Strict()
	sig, err := enc.DecodeString(sigText)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, ErrMalformed
	}
	raw, err := enc.DecodeString(claimsText)
	if err != nil {
		return nil, ErrMalformed
	}
	if len(key) != ed25519.PublicKeySize || !ed25519.Verify(key, append([]byte(sigDomain), head...), sig) {
		return nil, ErrSignature
	}
	var c Claims
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || dec.More() {
		return nil, ErrMalformed
	}
	if c.Version != version || c.SessionID == "" || c.WorkspaceID == "" || c.Generation == 0 || len(c.Scopes) == 0 {
		return nil, ErrMalformed
	}
	for _, s := range c.Scopes {
		if s != ScopeExec && s != ScopeFilesystem {
			return nil, ErrMalformed
		}
	}
	return &c, nil
}

func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, '.')
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}
