package commandid

import (
	"regexp"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/fault"
)

const field = "metadata.command_id"

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		id     string
		reason fault.Reason // ReasonUnspecified: accepted
	}{
		{"single letter", "a", ""},
		{"single digit", "7", ""},
		{"all allowed bytes", "Az09._/-x", ""},
		{"uuid", "0f8fad5b-d9cb-469f-a165-70867728950e", ""},
		{"path like", "deploy/web/2024-01-01.1", ""},
		{"trailing slash", "a/", ""},
		{"trailing dot", "a.", ""},
		{"128 bytes", strings.Repeat("a", 128), ""},
		{"129 bytes", strings.Repeat("a", 129), fault.ReasonInvalidCommandID},
		{"huge", strings.Repeat("b", 10000), fault.ReasonInvalidCommandID},
		{"empty", "", fault.ReasonInvalidCommandID},
		{"leading dot", ".a", fault.ReasonInvalidCommandID},
		{"leading dash", "-a", fault.ReasonInvalidCommandID},
		{"leading slash", "/a", fault.ReasonInvalidCommandID},
		{"leading underscore", "_a", fault.ReasonInvalidCommandID},
		{"space", "a b", fault.ReasonInvalidCommandID},
		{"colon", "a:b", fault.ReasonInvalidCommandID},
		{"newline", "a\n", fault.ReasonInvalidCommandID},
		{"nul", "a\x00", fault.ReasonInvalidCommandID},
		{"non-ASCII", "caf\u00e9", fault.ReasonInvalidCommandID},
		{"non-ASCII first", "\u00e9t\u00e9", fault.ReasonInvalidCommandID},
		{"invalid UTF-8", "a\xff", fault.ReasonInvalidCommandID},
		{"expiration without slash", "expiration", ""},
		{"expiration as suffix", "x-expiration/1", ""},
		{"upper-case reserved prefix is not reserved", "Expiration/1", ""},
		{"expiration/", "expiration/", fault.ReasonReservedCommandID},
		{"expiration/x", "expiration/sb-1/7", fault.ReasonReservedCommandID},
		{"host-memory/x", "host-memory/node-3", fault.ReasonReservedCommandID},
		{"guest-shutdown/x", "guest-shutdown/sb-9", fault.ReasonReservedCommandID},
		{"host-memory without slash", "host-memory", ""},
		{"guest-shutdown without slash", "guest-shutdown", ""},
		{"reserved but too long", "expiration/" + strings.Repeat("a", 118), fault.ReasonInvalidCommandID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(field, tt.id)
			if tt.reason == fault.ReasonUnspecified {
				if err != nil {
					t.Fatalf("Validate(%q) = %v, want nil", tt.id, err)
				}
				return
			}
			fe, ok := fault.As(err)
			if !ok {
				t.Fatalf("Validate(%q) = %v, want a *fault.Error", tt.id, err)
			}
			if fe.Kind != fault.KindInvalidArgument || fe.Reason != tt.reason || fe.Field != field {
				t.Fatalf("Validate(%q) = kind %v reason %q field %q, want %v %q %q",
					tt.id, fe.Kind, fe.Reason, fe.Field, fault.KindInvalidArgument, tt.reason, field)
			}
			if len(fe.Message) > 600 {
				t.Fatalf("message is %d bytes long", len(fe.Message))
			}
			// Format-only validation accepts reserved prefixes.
			fmtErr := ValidateFormat(tt.id)
			if tt.reason == fault.ReasonReservedCommandID {
				if fmtErr != nil {
					t.Fatalf("ValidateFormat(%q) = %v, want nil", tt.id, fmtErr)
				}
				if !IsReserved(tt.id) {
					t.Fatalf("IsReserved(%q) = false", tt.id)
				}
			} else if fe2, ok := fault.As(fmtErr); !ok || fe2.Reason != fault.ReasonInvalidCommandID || fe2.Field != "" {
				t.Fatalf("ValidateFormat(%q) = %v, want INVALID_COMMAND_ID with no field", tt.id, fmtErr)
			}
		})
	}
}

func TestMessageTruncatesAndQuotes(t *testing.T) {
	long := strings.Repeat("x", 200) + "TAIL"
	fe, _ := fault.As(Validate(field, long))
	if strings.Contains(fe.Message, "TAIL") || strings.Contains(fe.Message, strings.Repeat("x", 129)) {
		t.Fatalf("message echoes the whole oversized ID: %s", fe.Message)
	}
	if !strings.Contains(fe.Message, `"xxxx`) {
		t.Fatalf("message does not quote the ID: %s", fe.Message)
	}
	fe, _ = fault.As(Validate(field, "a\nb"))
	if !strings.Contains(fe.Message, `"a\nb"`) {
		t.Fatalf("message does not quote with %%q: %s", fe.Message)
	}
}

func TestIsReserved(t *testing.T) {
	for _, p := range ReservedPrefixes {
		if !IsReserved(p + "x") {
			t.Errorf("IsReserved(%q) = false", p+"x")
		}
		if IsReserved(strings.TrimSuffix(p, "/")) {
			t.Errorf("IsReserved(%q) = true", strings.TrimSuffix(p, "/"))
		}
	}
}

func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewID()
		if err := Validate(field, id); err != nil {
			t.Fatalf("NewID() = %q fails Validate: %v", id, err)
		}
		if len(id) != 30 || !strings.HasPrefix(id, "cmd-") {
			t.Fatalf("NewID() = %q, want cmd- and 26 characters", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
}

var reference = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)

// FuzzValidate checks that the byte loop agrees with the regular expression
// and length rule that define the format.
func FuzzValidate(f *testing.F) {
	f.Fuzz(func(t *testing.T, id string) {
		want := reference.MatchString(id) && len(id) <= MaxLen
		err := ValidateFormat(id)
		if (err == nil) != want {
			t.Fatalf("ValidateFormat(%q) = %v, reference accepts: %v", id, err, want)
		}
		verr := Validate(field, id)
		reserved := IsReserved(id)
		if (verr == nil) != (want && !reserved) {
			t.Fatalf("Validate(%q) = %v, format ok %v, reserved %v", id, verr, want, reserved)
		}
		if verr != nil {
			fe, ok := fault.As(verr)
			if !ok || fe.Kind != fault.KindInvalidArgument || fe.Field != field {
				t.Fatalf("Validate(%q) = %#v", id, verr)
			}
			wantReason := fault.ReasonInvalidCommandID
			if want {
				wantReason = fault.ReasonReservedCommandID
			}
			if fe.Reason != wantReason {
				t.Fatalf("Validate(%q) reason %q, want %q", id, fe.Reason, wantReason)
			}
			if len(id) > MaxLen && strings.Contains(fe.Message, id) {
				t.Fatalf("message echoes the whole oversized ID")
			}
		}
	})
}
