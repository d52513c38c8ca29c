package kibotos_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/kibotos/kibotos"
	"github.com/kibotos/kibotos/internal/commandid"
)

func TestValidateCommandID(t *testing.T) {
	tests := []struct {
		id   string
		want error // nil: valid
	}{
		{"a", nil},
		{"7", nil},
		{"Az09._/-x", nil},
		{"0f8fad5b-d9cb-469f-a165-70867728950e", nil},
		{"deploy/web/2024-01-01.1", nil},
		{strings.Repeat("a", 128), nil},
		{"expiration", nil},
		{"Expiration/1", nil},
		{"x-expiration/1", nil},
		{"", kibotos.ErrInvalidCommandID},
		{strings.Repeat("a", 129), kibotos.ErrInvalidCommandID},
		{".a", kibotos.ErrInvalidCommandID},
		{"-a", kibotos.ErrInvalidCommandID},
		{"/a", kibotos.ErrInvalidCommandID},
		{"_a", kibotos.ErrInvalidCommandID},
		{"a b", kibotos.ErrInvalidCommandID},
		{"a:b", kibotos.ErrInvalidCommandID},
		{"a\n", kibotos.ErrInvalidCommandID},
		{"caf\u00e9", kibotos.ErrInvalidCommandID},
		{"a\xff", kibotos.ErrInvalidCommandID},
		{"expiration/", kibotos.ErrReservedCommandID},
		{"expiration/ws-1/3", kibotos.ErrReservedCommandID},
		{"host-memory/node-1", kibotos.ErrReservedCommandID},
		{"guest-shutdown/ws-9", kibotos.ErrReservedCommandID},
		{"expiration/" + strings.Repeat("a", 118), kibotos.ErrInvalidCommandID},
	}
	for _, tt := range tests {
		err := kibotos.ValidateCommandID(tt.id)
		if tt.want == nil {
			if err != nil {
				t.Errorf("ValidateCommandID(%q) = %v, want nil", tt.id, err)
			}
			continue
		}
		if !errors.Is(err, tt.want) {
			t.Errorf("ValidateCommandID(%q) = %v, want an error wrapping %v", tt.id, err, tt.want)
		}
	}
}

func TestMaxCommandIDLen(t *testing.T) {
	if kibotos.MaxCommandIDLen != commandid.MaxLen {
		t.Errorf("MaxCommandIDLen = %d, the server allows %d", kibotos.MaxCommandIDLen, commandid.MaxLen)
	}
}

func TestNewCommandID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := kibotos.NewCommandID()
		if err := kibotos.ValidateCommandID(id); err != nil {
			t.Fatalf("ValidateCommandID(NewCommandID() = %q) = %v", id, err)
		}
		if seen[id] {
			t.Fatalf("NewCommandID() returned %q twice", id)
		}
		seen[id] = true
	}
}

var commandIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)

// FuzzValidateCommandID checks ValidateCommandID against the rules as the
// spec writes them.
func FuzzValidateCommandID(f *testing.F) {
	f.Add("cmd-1")
	f.Add("expiration/x")
	f.Fuzz(func(t *testing.T, id string) {
		err := kibotos.ValidateCommandID(id)
		formatOK := len(id) >= 1 && len(id) <= 128 && commandIDPattern.MatchString(id)
		reserved := false
		for _, p := range kibotos.ReservedCommandIDPrefixes() {
			reserved = reserved || strings.HasPrefix(id, p)
		}
		switch {
		case !formatOK:
			if !errors.Is(err, kibotos.ErrInvalidCommandID) || errors.Is(err, kibotos.ErrReservedCommandID) {
				t.Fatalf("ValidateCommandID(%q) = %v, want ErrInvalidCommandID", id, err)
			}
		case reserved:
			if !errors.Is(err, kibotos.ErrReservedCommandID) || errors.Is(err, kibotos.ErrInvalidCommandID) {
				t.Fatalf("ValidateCommandID(%q) = %v, want ErrReservedCommandID", id, err)
			}
		default:
			if err != nil {
				t.Fatalf("ValidateCommandID(%q) = %v, want nil", id, err)
			}
		}
	})
}
