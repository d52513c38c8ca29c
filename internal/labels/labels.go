// Package labels validates object labels, annotations and label selectors,
// following the Kubernetes rules, and encodes them canonically (Canonical).
// Selectors are matched by the store's queries.
//
// A key is an optional prefix and '/' followed by a name. The prefix is a DNS
// subdomain: lower-case RFC 1123 labels ([a-z0-9] at both ends, [a-z0-9-]
// inside, 1 to 63 bytes each) separated by dots, at most 253 bytes in all.
// The name is 1 to 63 bytes matching [A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?.
// A key contains at most one '/', and a '/' needs a non-empty prefix.
//
// Keys whose prefix is exactly "kibotos.io" or ends in ".kibotos.io" (for
// example "kibotos.io/owner" or "node.kibotos.io/zone") are reserved for the
// server: callers may not set them on labels or annotations, but may select
// on them.
//
// A label value is empty or 1 to 63 bytes matching the name pattern. An
// object has at most MaxLabels labels. Annotation values are any valid UTF-8;
// the keys and values of all annotations together take at most
// MaxAnnotationBytes bytes.
package labels

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/kibotos/kibotos/internal/fault"
)

const (
	// MaxLabels is the maximum number of labels on an object, and of entries
	// in a label selector.
	MaxLabels = 64
	// MaxAnnotationBytes bounds the total length of all annotation keys and
	// values of an object.
	MaxAnnotationBytes = 256 << 10
	// ReservedPrefix is the key prefix reserved for the server. Subdomains of
	// kibotos.io ("x.kibotos.io/") are reserved too.
	ReservedPrefix = "kibotos.io/"

	maxPrefixLen   = 253
	maxDNSLabelLen = 63
	maxNameLen     = 63
	maxValueLen    = 63
	displayLen     = 80
)

// IsReserved reports whether key has a prefix reserved for the server:
// "kibotos.io" or any subdomain of it.
func IsReserved(key string) bool {
	prefix, _, ok := strings.Cut(key, "/")
	return ok && (prefix == "kibotos.io" || strings.HasSuffix(prefix, ".kibotos.io"))
}

// ValidateLabels checks caller-supplied labels: at most MaxLabels entries,
// valid keys that are not reserved, and valid values. field is the request
// field path, e.g. "labels"; an error about one entry has the Field
// field["key"]. Entries are checked in key order, so the error is
// deterministic.
func ValidateLabels(field string, m map[string]string) error {
	if len(m) > MaxLabels {
		return fault.Invalid(field, "%d labels given, at most %d are allowed", len(m), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if err := checkKey(field, "label", k, false); err != nil {
			return err
		}
		if p := valueProblem(m[k]); p != "" {
			return fault.Invalid(entryField(field, k), "label value %s: %s", quote(m[k]), p)
		}
	}
	return nil
}

// ValidateAnnotations checks caller-supplied annotations: valid keys that
// are not reserved, values that are valid UTF-8, and at most
// MaxAnnotationBytes of keys and values together. field is the request field
// path, e.g. "annotations".
func ValidateAnnotations(field string, m map[string]string) error {
	total := 0
	for k, v := range m {
		total += len(k) + len(v)
	}
	if total > MaxAnnotationBytes {
		return fault.Invalid(field, "annotations take %d bytes (keys and values together), at most %d are allowed",
			total, MaxAnnotationBytes)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if err := checkKey(field, "annotation", k, false); err != nil {
			return err
		}
		if !utf8.ValidString(m[k]) {
			return fault.Invalid(entryField(field, k), "annotation value is not valid UTF-8")
		}
	}
	return nil
}

// ValidateSelector checks a label selector: at most MaxLabels entries, keys
// and values following the label rules. Reserved keys are allowed, since the
// server may set them. field is the request field path, e.g.
// "filter.labels".
func ValidateSelector(field string, m map[string]string) error {
	if len(m) > MaxLabels {
		return fault.Invalid(field, "label selector has %d entries, at most %d are allowed", len(m), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if err := checkKey(field, "selector", k, true); err != nil {
			return err
		}
		if p := valueProblem(m[k]); p != "" {
			return fault.Invalid(entryField(field, k), "selector value %s: %s", quote(m[k]), p)
		}
	}
	return nil
}

// Canonical returns a deterministic encoding of m for fingerprints and for
// binding page tokens to their filters: the number of entries, then each key
// and value in ascending key order, every item preceded by its length, all
// as unsigned varints. A nil and an empty map encode the same.
func Canonical(m map[string]string) []byte {
	n := binary.MaxVarintLen64
	for k, v := range m {
		n += 2*binary.MaxVarintLen64 + len(k) + len(v)
	}
	b := make([]byte, 0, n)
	b = binary.AppendUvarint(b, uint64(len(m)))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(m[k])))
		b = append(b, m[k]...)
	}
	return b
}

// checkKey validates key as an entry of the map at field; noun names the
// map's kind in the message.
func checkKey(field, noun, key string, allowReserved bool) error {
	if p := keyProblem(key); p != "" {
		return fault.Invalid(entryField(field, key), "%s key %s: %s", noun, quote(key), p)
	}
	if !allowReserved && IsReserved(key) {
		return fault.Invalid(entryField(field, key),
			"%s key %s uses a prefix reserved for the server (kibotos.io and its subdomains)", noun, quote(key))
	}
	return nil
}

// keyProblem describes what is wrong with key, or returns "".
func keyProblem(key string) string {
	if key == "" {
		return "must not be empty"
	}
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name = key
	} else {
		if strings.Contains(name, "/") {
			return "a key contains at most one '/'"
		}
		if p := prefixProblem(prefix); p != "" {
			return p
		}
	}
	switch {
	case name == "":
		return "name (the part after the prefix) is empty"
	case len(name) > maxNameLen:
		return fmt.Sprintf("name is %d bytes long, at most %d are allowed", len(name), maxNameLen)
	case !isName(name):
		return "name must consist of ASCII letters, digits, '-', '_' and '.', and start and end with a letter or digit"
	}
	return ""
}

// prefixProblem describes what is wrong with a key prefix, or returns "".
func prefixProblem(prefix string) string {
	if prefix == "" {
		return "prefix before '/' is empty"
	}
	if len(prefix) > maxPrefixLen {
		return fmt.Sprintf("prefix is %d bytes long, at most %d are allowed", len(prefix), maxPrefixLen)
	}
	const rule = "prefix must be a lower-case DNS subdomain: labels of 1 to 63 bytes of [a-z0-9-], starting and ending with a letter or digit, separated by '.'"
	start := 0
	for i := 0; i <= len(prefix); i++ {
		if i < len(prefix) && prefix[i] != '.' {
			c := prefix[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return rule
			}
			continue
		}
		// prefix[start:i] is one DNS label.
		n := i - start
		if n == 0 || n > maxDNSLabelLen || prefix[start] == '-' || prefix[i-1] == '-' {
			return rule
		}
		start = i + 1
	}
	return ""
}

// valueProblem describes what is wrong with a label value, or returns "".
func valueProblem(v string) string {
	switch {
	case v == "":
		return ""
	case len(v) > maxValueLen:
		return fmt.Sprintf("value is %d bytes long, at most %d are allowed", len(v), maxValueLen)
	case !isName(v):
		return "value must be empty or consist of ASCII letters, digits, '-', '_' and '.', and start and end with a letter or digit"
	}
	return ""
}

// isName reports whether s matches [A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?.
func isName(s string) bool {
	if s == "" || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		c := s[i]
		if !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// entryField returns the field path of one map entry, e.g. labels["app"].
func entryField(field, key string) string {
	return field + "[" + quote(key) + "]"
}

// quote quotes s with %q, keeping only its first displayLen bytes.
func quote(s string) string {
	if len(s) <= displayLen {
		return strconv.Quote(s)
	}
	n := displayLen
	for i := 1; i < utf8.UTFMax && !utf8.RuneStart(s[n]); i++ {
		n-- // do not split a UTF-8 sequence
	}
	return strconv.Quote(s[:n]) + "..."
}
