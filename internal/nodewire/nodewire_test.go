package nodewire

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestCut: short valid text is unchanged; long text is cut on a character
// boundary with the marker, within the bound; invalid UTF-8 becomes U+FFFD.
func TestCut(t *testing.T) {
	const max = 16
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"short", "disk 91% full", "disk 91% full"},
		{"exactly the bound", strings.Repeat("a", max), strings.Repeat("a", max)},
		{"one byte over", strings.Repeat("a", max+1), strings.Repeat("a", max-3) + "…"},
		{"long", strings.Repeat("a", 5<<20), strings.Repeat("a", max-3) + "…"},
		{"multi-byte not split", "ab" + strings.Repeat("é", 10), "ab" + strings.Repeat("é", 5) + "…"},
		{"four-byte runes", strings.Repeat("𝄞", 5), strings.Repeat("𝄞", 3) + "…"},
		{"invalid bytes replaced", "a\xffb", "a\uFFFDb"},
		{"invalid and long", strings.Repeat("\xff", 40), strings.Repeat("\uFFFD", 4) + "…"},
		{"invalid, fits only once replaced", "abcdefghijklmn\xff", "abcdefghijklm…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Cut(tc.in, max)
			if got != tc.want {
				t.Errorf("Cut(%.40q, %d) = %q, want %q", tc.in, max, got, tc.want)
			}
			if len(got) > max || !utf8.ValidString(got) {
				t.Errorf("Cut(%.40q) = %q: %d bytes, valid UTF-8 %v", tc.in, got, len(got), utf8.ValidString(got))
			}
		})
	}
}

func FuzzCut(f *testing.F) {
	for _, s := range []string{"", "abc", "é𝄞\xff", strings.Repeat("x", 100)} {
		f.Add(s, 8)
	}
	f.Fuzz(func(t *testing.T, s string, max int) {
		if max < len(marker) || max > 1<<16 {
			return
		}
		got := Cut(s, max)
		if len(got) > max || !utf8.ValidString(got) {
			t.Fatalf("Cut(%q, %d) = %q", s, max, got)
		}
		if len(s) <= max && utf8.ValidString(s) && got != s {
			t.Fatalf("Cut changed a text within the bound: %q → %q", s, got)
		}
	})
}
