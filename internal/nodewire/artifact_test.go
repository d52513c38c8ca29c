package nodewire

import (
	"strconv"
	"testing"
)

func TestGuestProtocolOf(t *testing.T) {
	if GuestProtocolDeclaration != GuestProtocolMarker+strconv.Itoa(GuestProtocolVersion)+";" {
		t.Fatalf("GuestProtocolDeclaration %q does not declare GuestProtocolVersion %d", GuestProtocolDeclaration, GuestProtocolVersion)
	}
	for _, tc := range []struct {
		in   string
		want uint32
		ok   bool
	}{
		{"\x7fELF...kibotos-guest-protocol=1;...", 1, true},
		{"kibotos-guest-protocol=42;", 42, true},
		{"kibotos-guest-protocol=;kibotos-guest-protocol=7;", 7, true},
		{"kibotos-guest-protocol=12", 0, false},
		{"kibotos-guest-protocol=1234567890;", 0, false},
		{"kibotos-guest-protocol=x;", 0, false},
		{"", 0, false},
		{"nothing here", 0, false},
	} {
		v, ok := GuestProtocolOf([]byte(tc.in))
		if v != tc.want || ok != tc.ok {
			t.Errorf("GuestProtocolOf(%q) = %d, %v; want %d, %v", tc.in, v, ok, tc.want, tc.ok)
		}
	}
}

func FuzzGuestProtocolOf(f *testing.F) {
	f.Add([]byte("kibotos-guest-protocol=1;"))
	f.Add([]byte("kibotos-guest-protocol=99999999999;"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, ok := GuestProtocolOf(b); !ok && v != 0 {
			t.Fatalf("not ok but version %d", v)
		}
	})
}
