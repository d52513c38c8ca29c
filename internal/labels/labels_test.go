package labels

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/fault"
)

var (
	name63    = strings.Repeat("n", 62) + "9"
	name64    = strings.Repeat("n", 63) + "9"
	prefix253 = strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)
	prefix254 = prefix253 + "e"
)

// wantInvalid asserts that err is an invalid_argument fault with reason
// INVALID_ARGUMENT on field.
func wantInvalid(t *testing.T, err error, field string) {
	t.Helper()
	fe, ok := fault.As(err)
	if !ok {
		t.Fatalf("error = %v, want a *fault.Error", err)
	}
	if fe.Kind != fault.KindInvalidArgument || fe.Reason != fault.ReasonInvalidArgument || fe.Field != field {
		t.Fatalf("error = kind %v reason %q field %q (%s), want invalid_argument INVALID_ARGUMENT %q",
			fe.Kind, fe.Reason, fe.Field, fe.Message, field)
	}
}

var keyTests = []struct {
	key      string
	ok       bool
	reserved bool
}{
	{"app", true, false},
	{"a", true, false},
	{"A", true, false},
	{"9", true, false},
	{"App.Name_x-1", true, false},
	{name63, true, false},
	{name64, false, false},
	{"example.com/app", true, false},
	{"a-b.c-d.e/x", true, false},
	{"1.2.3/x", true, false},
	{prefix253 + "/x", true, false},
	{prefix254 + "/x", false, false},
	{strings.Repeat("a", 63) + "/x", true, false},
	{strings.Repeat("a", 64) + "/x", false, false}, // DNS label over 63 bytes
	{"example.com/" + name63, true, false},
	{"example.com/" + name64, false, false},
	{"", false, false},
	{"/", false, false},
	{"/app", false, false},
	{"example.com/", false, false},
	{"a/b/c", false, false},
	{"Example.com/app", false, false}, // upper-case prefix
	{"EXAMPLE/app", false, false},
	{"-example.com/app", false, false},
	{"example-.com/app", false, false},
	{"example..com/app", false, false},
	{".example.com/app", false, false},
	{"example.com./app", false, false},
	{"exa_mple.com/app", false, false},
	{".app", false, false},
	{"-app", false, false},
	{"_app", false, false},
	{"app.", false, false},
	{"app-", false, false},
	{"app_", false, false},
	{"a b", false, false},
	{"a:b", false, false},
	{"caf\u00e9", false, false},
	{"\u00e9xample.com/a", false, false},
	{"a\xff", false, false},
	{"kibotos.io/x", true, true},
	{"kibotos.io/owner", true, true},
	{"node.kibotos.io/zone", true, true},
	{"a.b.kibotos.io/zone", true, true},
	{"kibotos.io", true, false},           // name only, no prefix
	{"xkibotos.io/x", true, false},        // not a subdomain
	{"kibotos.io.example/x", true, false}, // not under kibotos.io
	{"kibotos.iox/x", true, false},
	{"Kibotos.io/x", false, false},
}

// TestKeys checks key syntax through selectors (which accept reserved
// keys) and labels (which refuse them).
func TestKeys(t *testing.T) {
	for _, tt := range keyTests {
		field := "sel[" + quote(tt.key) + "]"
		err := ValidateSelector("sel", map[string]string{tt.key: ""})
		if tt.ok {
			if err != nil {
				t.Errorf("ValidateSelector(%q) = %v, want nil", tt.key, err)
			}
		} else {
			wantInvalid(t, err, field)
		}
		lerr := ValidateLabels("labels", map[string]string{tt.key: ""})
		if (lerr == nil) != (tt.ok && !tt.reserved) {
			t.Errorf("ValidateLabels(%q) = %v, want ok %v", tt.key, lerr, tt.ok && !tt.reserved)
		}
		if got := IsReserved(tt.key); got != tt.reserved {
			t.Errorf("IsReserved(%q) = %v, want %v", tt.key, got, tt.reserved)
		}
	}
}

var valueTests = []struct {
	value string
	ok    bool
}{
	{"", true},
	{"v", true},
	{"V1.2_3-x", true},
	{name63, true},
	{name64, false},
	{".v", false},
	{"v.", false},
	{"-v", false},
	{"v_", false},
	{"a/b", false},
	{"a b", false},
	{"\u00e9", false},
	{" ", false},
}

func TestValidateLabels(t *testing.T) {
	for _, tt := range keyTests {
		err := ValidateLabels("labels", map[string]string{tt.key: "v"})
		if tt.ok && !tt.reserved {
			if err != nil {
				t.Errorf("labels key %q: %v, want nil", tt.key, err)
			}
		} else {
			wantInvalid(t, err, fmt.Sprintf("labels[%s]", quote(tt.key)))
		}
	}
	for _, tt := range valueTests {
		err := ValidateLabels("labels", map[string]string{"app": tt.value})
		if tt.ok {
			if err != nil {
				t.Errorf("labels value %q: %v, want nil", tt.value, err)
			}
		} else {
			wantInvalid(t, err, `labels["app"]`)
		}
	}
	if err := ValidateLabels("labels", nil); err != nil {
		t.Errorf("nil labels: %v", err)
	}
	if err := ValidateLabels("labels", numbered(64)); err != nil {
		t.Errorf("64 labels: %v", err)
	}
	wantInvalid(t, ValidateLabels("labels", numbered(65)), "labels")
	wantInvalid(t, ValidateLabels("labels", map[string]string{"bad key": ""}), `labels["bad key"]`)
}

func TestValidateLabelsDeterministic(t *testing.T) {
	m := map[string]string{"b key": "", "a key": "", "c key": ""}
	for range 20 {
		wantInvalid(t, ValidateLabels("labels", m), `labels["a key"]`)
	}
}

func TestValidateAnnotations(t *testing.T) {
	for _, tt := range keyTests {
		err := ValidateAnnotations("annotations", map[string]string{tt.key: "any value"})
		if tt.ok && !tt.reserved {
			if err != nil {
				t.Errorf("annotations key %q: %v, want nil", tt.key, err)
			}
		} else {
			wantInvalid(t, err, fmt.Sprintf("annotations[%s]", quote(tt.key)))
		}
	}
	for _, v := range []string{"", "a b c", "caf\u00e9 \u2603", "line\nbreak", "{\"json\": true}", strings.Repeat("x", 1000)} {
		if err := ValidateAnnotations("annotations", map[string]string{"note": v}); err != nil {
			t.Errorf("annotation value %q: %v", v, err)
		}
	}
	wantInvalid(t, ValidateAnnotations("annotations", map[string]string{"note": "bad \xff"}), `annotations["note"]`)

	// Exactly MaxAnnotationBytes, split over keys and values.
	exact := map[string]string{
		"a": strings.Repeat("x", MaxAnnotationBytes/2-1),
		"b": strings.Repeat("y", MaxAnnotationBytes/2-1),
	}
	if err := ValidateAnnotations("annotations", exact); err != nil {
		t.Errorf("exactly %d bytes: %v", MaxAnnotationBytes, err)
	}
	exact["b"] += "y"
	wantInvalid(t, ValidateAnnotations("annotations", exact), "annotations")

	// No count limit: many small annotations are fine.
	if err := ValidateAnnotations("annotations", numbered(1000)); err != nil {
		t.Errorf("1000 annotations: %v", err)
	}
}

func TestValidateSelector(t *testing.T) {
	for _, tt := range keyTests {
		err := ValidateSelector("filter.labels", map[string]string{tt.key: "v"})
		if tt.ok { // reserved keys are allowed in selectors
			if err != nil {
				t.Errorf("selector key %q: %v, want nil", tt.key, err)
			}
		} else {
			wantInvalid(t, err, fmt.Sprintf("filter.labels[%s]", quote(tt.key)))
		}
	}
	for _, tt := range valueTests {
		err := ValidateSelector("filter.labels", map[string]string{"app": tt.value})
		if tt.ok {
			if err != nil {
				t.Errorf("selector value %q: %v, want nil", tt.value, err)
			}
		} else {
			wantInvalid(t, err, `filter.labels["app"]`)
		}
	}
	if err := ValidateSelector("filter.labels", numbered(64)); err != nil {
		t.Errorf("64 entries: %v", err)
	}
	wantInvalid(t, ValidateSelector("filter.labels", numbered(65)), "filter.labels")
}

func TestMessages(t *testing.T) {
	long := "Bad" + strings.Repeat("k", 300) + "TAIL"
	fe, _ := fault.As(ValidateLabels("labels", map[string]string{long: ""}))
	if strings.Contains(fe.Message, "TAIL") || strings.Contains(fe.Field, "TAIL") {
		t.Errorf("long key not truncated: field %q message %q", fe.Field, fe.Message)
	}
	if !strings.Contains(fe.Message, "63") {
		t.Errorf("message does not name the broken rule: %q", fe.Message)
	}
	fe, _ = fault.As(ValidateLabels("labels", map[string]string{"a\tb": ""}))
	if !strings.Contains(fe.Message, `"a\tb"`) || fe.Field != `labels["a\tb"]` {
		t.Errorf("key not quoted: field %q message %q", fe.Field, fe.Message)
	}
	fe, _ = fault.As(ValidateLabels("labels", map[string]string{"kibotos.io/x": ""}))
	if !strings.Contains(fe.Message, "reserved") {
		t.Errorf("message does not say reserved: %q", fe.Message)
	}
	// Truncation does not split a UTF-8 sequence.
	if q := quote(strings.Repeat("a", 79) + "\u00e9" + "zzz"); q != `"`+strings.Repeat("a", 79)+`"...` {
		t.Errorf("quote = %s", q)
	}
}

func TestCanonical(t *testing.T) {
	a := map[string]string{"b": "2", "a": "1", "c": ""}
	first := Canonical(a)
	for range 20 {
		b := map[string]string{}
		for k, v := range a {
			b[k] = v
		}
		if !bytes.Equal(Canonical(b), first) {
			t.Fatal("Canonical is not deterministic")
		}
	}
	distinct := []map[string]string{
		nil,
		{"": ""},
		{"a": ""},
		{"": "a"},
		{"ab": "c"},
		{"a": "bc"},
		{"a": "b", "c": ""},
		{"a": "bc", "": ""},
		{"a": "1"},
		{"a": "2"},
	}
	seen := map[string]int{}
	for i, m := range distinct {
		s := string(Canonical(m))
		if j, ok := seen[s]; ok {
			t.Errorf("Canonical(%v) == Canonical(%v)", distinct[i], distinct[j])
		}
		seen[s] = i
	}
	if !bytes.Equal(Canonical(nil), Canonical(map[string]string{})) {
		t.Error("nil and empty maps differ")
	}
}

func numbered(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("example.com/key-%d", i)] = fmt.Sprintf("v%d", i)
	}
	return m
}

// Reference implementation built from regular expressions.
var (
	refName      = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)
	refSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

func refValidName(s string) bool { return len(s) <= 63 && refName.MatchString(s) }

func refValidKey(key string) bool {
	parts := strings.Split(key, "/")
	switch len(parts) {
	case 1:
		return refValidName(parts[0])
	case 2:
		prefix := parts[0]
		if len(prefix) > 253 || !refSubdomain.MatchString(prefix) {
			return false
		}
		for _, l := range strings.Split(prefix, ".") {
			if len(l) > 63 {
				return false
			}
		}
		return refValidName(parts[1])
	}
	return false
}

func refValidValue(v string) bool { return v == "" || refValidName(v) }

// FuzzKey checks key syntax against the reference: through a selector,
// which accepts reserved keys, and through labels, which refuse them.
func FuzzKey(f *testing.F) {
	f.Fuzz(func(t *testing.T, key string) {
		want := refValidKey(key)
		err := ValidateSelector("k", map[string]string{key: ""})
		if (err == nil) != want {
			t.Fatalf("key %q: %v, reference accepts: %v", key, err, want)
		}
		if err != nil {
			fe, ok := fault.As(err)
			if !ok || fe.Kind != fault.KindInvalidArgument || fe.Field != "k["+quote(key)+"]" {
				t.Fatalf("key %q: %#v", key, err)
			}
			if len(fe.Message) > 600 {
				t.Fatalf("message is %d bytes long", len(fe.Message))
			}
		}
		lerr := ValidateLabels("labels", map[string]string{key: ""})
		if (lerr == nil) != (want && !IsReserved(key)) {
			t.Fatalf("ValidateLabels(%q) = %v", key, lerr)
		}
	})
}

func FuzzValidateLabelValue(f *testing.F) {
	f.Fuzz(func(t *testing.T, value string) {
		want := refValidValue(value)
		err := ValidateLabels("labels", map[string]string{"k": value})
		if (err == nil) != want {
			t.Fatalf("label value %q: %v, reference accepts: %v", value, err, want)
		}
		if err != nil {
			wantInvalid(t, err, `labels["k"]`)
		}
		serr := ValidateSelector("sel", map[string]string{"k": value})
		if (serr == nil) != want {
			t.Fatalf("selector value %q: %v, reference accepts: %v", value, serr, want)
		}
	})
}

func FuzzSelector(f *testing.F) {
	f.Fuzz(func(t *testing.T, key, value string) {
		sel := map[string]string{key: value}
		want := refValidKey(key) && refValidValue(value)
		err := ValidateSelector("sel", sel)
		if (err == nil) != want {
			t.Fatalf("ValidateSelector(%q: %q) = %v, reference accepts: %v", key, value, err, want)
		}
		if err != nil {
			wantInvalid(t, err, fmt.Sprintf("sel[%s]", quote(key)))
		}
		lerr := ValidateLabels("labels", sel)
		if (lerr == nil) != (want && !IsReserved(key)) {
			t.Fatalf("ValidateLabels(%q: %q) = %v", key, value, lerr)
		}
		c := Canonical(sel)
		if !bytes.Equal(c, Canonical(map[string]string{key: value})) {
			t.Fatal("Canonical is not deterministic")
		}
		if bytes.Equal(c, Canonical(map[string]string{key + value: ""})) && value != "" {
			t.Fatal("Canonical is ambiguous")
		}
	})
}
