package netguard

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/kibotos/kibotos/internal/fault"
)

// MaxHostnameLen is the longest DNS name accepted, not counting an optional
// trailing dot.
const MaxHostnameLen = 253

// maxAddressLen bounds the whole host:port string: a maximal name, its
// trailing dot, a colon and five port digits.
const maxAddressLen = MaxHostnameLen + 1 + 1 + 5

// maxEcho bounds the quoted length of a malformed input repeated in a
// message, so that escaped bytes cannot blow it up.
const maxEcho = 72

// echo quotes s for a message. When the quoted form is longer than maxEcho
// it is cut at a rune boundary and marked with "...".
func echo(s string) string {
	q := strconv.Quote(s)
	if len(q) <= maxEcho {
		return q
	}
	n := min(len(s)-1, maxEcho) // s itself quotes too long
	for n > 0 {
		if utf8.RuneStart(s[n]) {
			if q = strconv.Quote(s[:n]); len(q) <= maxEcho-3 {
				return q + "..."
			}
		}
		n--
	}
	return `""...`
}

// ParseHostPort splits an endpoint address of the form host:port.
//
// host is an IPv4 literal in dotted decimal, an IPv6 literal in brackets
// ("[2001:4860::1]:53", returned without the brackets), or a DNS name.
// IPv6 zone identifiers are rejected. A DNS name is a sequence of dot
// separated labels of 1 to 63 ASCII letters, digits and hyphens, neither
// starting nor ending with a hyphen, at most 253 bytes in all; a single
// trailing dot (fully qualified form) is accepted and kept in host. The
// last label may not be all digits or a 0x-prefixed hex number, so that
// strings such as "127.1" or "0x7f000001", which some resolvers treat as
// IPv4 addresses, are not accepted as names. Internationalized names must
// be given in their ASCII (xn--) form.
//
// port is decimal, 1 to 65535, without sign or leading zeros.
//
// Any other input is invalid_argument on field. host is returned as written
// (letter case and IPv6 spelling are preserved).
func ParseHostPort(field, s string) (host string, port uint16, err error) {
	if s == "" {
		return "", 0, fault.Invalid(field, "address is empty; want host:port")
	}
	if len(s) > maxAddressLen {
		return "", 0, fault.Invalid(field, "address is longer than %d bytes", maxAddressLen)
	}
	var portStr string
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", 0, fault.Invalid(field, "address %s has an unterminated '['", echo(s))
		}
		host = s[1:end]
		rest := s[end+1:]
		if rest == "" {
			return "", 0, fault.Invalid(field, "address %s has no port; want host:port", echo(s))
		}
		if rest[0] != ':' {
			return "", 0, fault.Invalid(field, "address %s: want ':' and a port after ']'", echo(s))
		}
		portStr = rest[1:]
		if err := checkBracketedHost(host); err != "" {
			return "", 0, fault.Invalid(field, "address %s: %s", echo(s), err)
		}
	} else {
		colon := strings.LastIndexByte(s, ':')
		if colon < 0 {
			return "", 0, fault.Invalid(field, "address %s has no port; want host:port", echo(s))
		}
		host, portStr = s[:colon], s[colon+1:]
		if host == "" {
			return "", 0, fault.Invalid(field, "address %s has no host; want host:port", echo(s))
		}
		if strings.IndexByte(host, ':') >= 0 {
			return "", 0, fault.Invalid(field, "address %s: an IPv6 address must be in brackets, as in [2001:db8::1]:53", echo(s))
		}
		if a, perr := netip.ParseAddr(host); perr == nil && a.Is4() {
			// IPv4 literal in dotted decimal.
		} else if msg := checkHostname(host); msg != "" {
			return "", 0, fault.Invalid(field, "address %s: %s", echo(s), msg)
		}
	}
	p, msg := parsePort(portStr)
	if msg != "" {
		return "", 0, fault.Invalid(field, "address %s: %s", echo(s), msg)
	}
	return host, p, nil
}

// checkBracketedHost validates the text between '[' and ']'; it returns a
// problem description, or "" when host is a plain IPv6 literal.
func checkBracketedHost(host string) string {
	if host == "" {
		return "empty host in brackets"
	}
	if strings.IndexByte(host, '%') >= 0 {
		return "IPv6 zone identifiers are not allowed"
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Is6() {
		return "brackets must hold an IPv6 address"
	}
	return ""
}

// checkHostname validates a DNS name as documented on ParseHostPort; it
// returns a problem description, or "" when name is acceptable.
func checkHostname(name string) string {
	name = strings.TrimSuffix(name, ".")
	if name == "" {
		return "host is not a valid DNS name"
	}
	if len(name) > MaxHostnameLen {
		return fmt.Sprintf("host name is longer than %d bytes", MaxHostnameLen)
	}
	var last string
	for label := range strings.SplitSeq(name, ".") {
		if msg := checkLabel(label); msg != "" {
			return msg
		}
		last = label
	}
	if numericLabel(last) {
		return "host is neither a valid IP address nor a DNS name (last label is numeric)"
	}
	return ""
}

// checkLabel validates one DNS label.
func checkLabel(label string) string {
	if label == "" {
		return "host name has an empty label"
	}
	if len(label) > 63 {
		return "host name has a label longer than 63 bytes"
	}
	if label[0] == '-' || label[len(label)-1] == '-' {
		return "host name label starts or ends with '-'"
	}
	for i := 0; i < len(label); i++ {
		c := label[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return "host name may only contain letters, digits, '-' and '.'"
		}
	}
	return ""
}

// numericLabel reports whether label is all decimal digits or a
// 0x-prefixed hex number, forms that inet_aton style parsers read as part
// of an IPv4 address.
func numericLabel(label string) bool {
	digits := label
	isDigit := func(c byte) bool { return c >= '0' && c <= '9' }
	if len(label) >= 2 && label[0] == '0' && (label[1] == 'x' || label[1] == 'X') {
		digits = label[2:]
		isDigit = func(c byte) bool {
			return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
		}
	}
	for i := 0; i < len(digits); i++ {
		if !isDigit(digits[i]) {
			return false
		}
	}
	return true
}

// parsePort parses a decimal port 1-65535 without sign or leading zeros; it
// returns a problem description on failure.
func parsePort(s string) (uint16, string) {
	if s == "" {
		return 0, "port is empty"
	}
	if len(s) > 5 {
		return 0, "port must be a decimal number from 1 to 65535"
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, "port must be a decimal number from 1 to 65535"
		}
		n = n*10 + int(c-'0')
	}
	if s[0] == '0' {
		if n == 0 {
			return 0, "port must be a decimal number from 1 to 65535"
		}
		return 0, "port has a leading zero"
	}
	if n > 65535 {
		return 0, "port must be a decimal number from 1 to 65535"
	}
	return uint16(n), ""
}
