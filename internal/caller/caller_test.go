package caller

import (
	"context"
	"crypto/x509/pkix"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSubject(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   pkix.Name
		want string
	}{
		{"operator", pkix.Name{CommonName: "dev-operator", OrganizationalUnit: []string{"operator"}}, "CN=dev-operator,OU=operator"},
		{"escaped", pkix.Name{CommonName: "a,b"}, `CN=a\,b`},
		{"empty", pkix.Name{}, ""},
	} {
		if got := Subject(tc.in); got != tc.want {
			t.Errorf("%s: Subject = %q, want %q", tc.name, got, tc.want)
		}
	}
	long := Subject(pkix.Name{CommonName: strings.Repeat("é", 2000)})
	if len(long) > MaxSubject || !utf8.ValidString(long) {
		t.Errorf("long subject: %d bytes, valid UTF-8 %v", len(long), utf8.ValidString(long))
	}
}

func TestContext(t *testing.T) {
	ctx := context.Background()
	if got := From(ctx); got != "" {
		t.Errorf("From(empty) = %q", got)
	}
	if got := From(With(ctx, "CN=x")); got != "CN=x" {
		t.Errorf("From = %q", got)
	}
}
