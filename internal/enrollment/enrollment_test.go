package enrollment

import (
	"strings"
	"testing"
	"unicode"
)

func testService() *Service {
	return &Service{Key: []byte("0123456789abcdef0123456789abcdef")}
}

func TestTokenRoundTrip(t *testing.T) {
	s := testService()
	tok := s.Token("en-abcdefghijklmnopqrst")
	id, ok := s.checkToken(tok)
	if !ok || id != "en-abcdefghijklmnopqrst" {
		t.Fatalf("checkToken(Token) = %q, %v", id, ok)
	}
	other := &Service{Key: []byte("another key, another deployment")}
	if _, ok := other.checkToken(tok); ok {
		t.Error("a token verified under another deployment's key")
	}
	for _, bad := range []string{
		"", tok + "x", tok[:len(tok)-1], strings.Replace(tok, "kbe1", "kbe0", 1),
		strings.Replace(tok, "en-abc", "en-abd", 1), strings.Replace(tok, "en-", "eg-", 1),
		tok + ".", "kbe1.." + tok[strings.LastIndexByte(tok, '.')+1:],
	} {
		if _, ok := s.checkToken(bad); ok {
			t.Errorf("checkToken(%q) accepted", bad)
		}
	}
}

func TestValidateNodeID(t *testing.T) {
	for id, ok := range map[string]bool{
		"a": true, "node-1": true, "0": true, strings.Repeat("a", 63): true,
		"": false, "-a": false, "a-": false, "A": false, "a_b": false, "a.b": false,
		strings.Repeat("a", 64): false, "ä": false, "a b": false,
	} {
		if err := ValidateNodeID("node_id", id); (err == nil) != ok {
			t.Errorf("ValidateNodeID(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}

func TestHostNodeID(t *testing.T) {
	for in, want := range map[string]string{"Worker-7.example.com": "worker-7", "box": "box", "": ""} {
		if got := hostNodeID(in); got != want {
			t.Errorf("hostNodeID(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzCheckToken: no input panics; only the exact token of an ID checks.
func FuzzCheckToken(f *testing.F) {
	s := testService()
	f.Add(s.Token("en-abcdefghijklmnopqrst"))
	f.Add("kbe1.en-x.")
	f.Add("kbe1.en-x.AAAA")
	f.Add("....")
	f.Add("kbe1.en-" + strings.Repeat("a", 100) + ".x")
	f.Fuzz(func(t *testing.T, tok string) {
		id, ok := s.checkToken(tok)
		if ok && tok != s.Token(id) {
			t.Fatalf("checkToken(%q) accepted a token that is not Token(%q)", tok, id)
		}
	})
}

// FuzzValidateNodeID: whatever is accepted is a DNS label in lower case.
func FuzzValidateNodeID(f *testing.F) {
	for _, s := range []string{"a", "node-1", "-", "A", "a..b", strings.Repeat("z", 63)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if ValidateNodeID("node_id", id) != nil {
			return
		}
		if len(id) < 1 || len(id) > 63 || id[0] == '-' || id[len(id)-1] == '-' {
			t.Fatalf("accepted %q", id)
		}
		for _, r := range id {
			if !(r == '-' || unicode.IsDigit(r) || (r >= 'a' && r <= 'z')) {
				t.Fatalf("accepted %q (rune %q)", id, r)
			}
		}
	})
}
