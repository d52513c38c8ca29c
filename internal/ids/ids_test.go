package ids

import (
	"regexp"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/fault"
)

func TestNew(t *testing.T) {
	re := regexp.MustCompile(`^eg-[a-z2-7]{20}$`)
	seen := map[string]bool{}
	for range 100 {
		id := New("eg-")
		if !re.MatchString(id) {
			t.Fatalf("New(eg-) = %q, want eg- and 20 base32 characters", id)
		}
		if seen[id] {
			t.Fatalf("New(eg-) repeated %q", id)
		}
		seen[id] = true
		if err := Validate("egress_id", "eg-", "egress", id); err != nil {
			t.Fatalf("Validate(New) = %v", err)
		}
	}
}

func TestValidate(t *testing.T) {
	long := "eg-" + strings.Repeat("a", MaxLen)
	for _, tt := range []struct {
		id   string
		kind fault.Kind
		ok   bool
	}{
		{"eg-abc", 0, true},
		{"eg-" + strings.Repeat("a", MaxLen-3), 0, true},
		{"", fault.KindInvalidArgument, false},
		{"rs-abc", fault.KindNotFound, false},
		{"eg", fault.KindNotFound, false},
		{long, fault.KindNotFound, false},
	} {
		err := Validate("egress_id", "eg-", "egress", tt.id)
		if tt.ok {
			if err != nil {
				t.Errorf("Validate(%q) = %v, want nil", tt.id, err)
			}
			continue
		}
		fe, ok := fault.As(err)
		if !ok || fe.Kind != tt.kind {
			t.Errorf("Validate(%q) = %v, want a %v fault", tt.id, err, tt.kind)
			continue
		}
		if tt.kind == fault.KindInvalidArgument && fe.Field != "egress_id" {
			t.Errorf("Validate(%q) field = %q, want egress_id", tt.id, fe.Field)
		}
		if len(fe.Message) > MaxLen+40 {
			t.Errorf("Validate(%q) message is not truncated: %q", tt.id, fe.Message)
		}
	}
}

func TestTruncate(t *testing.T) {
	if got := Truncate("short"); got != "short" {
		t.Errorf("Truncate(short) = %q", got)
	}
	s := strings.Repeat("x", MaxLen+1)
	if got := Truncate(s); got != s[:MaxLen]+"…" {
		t.Errorf("Truncate(%d bytes) = %q", len(s), got)
	}
}
