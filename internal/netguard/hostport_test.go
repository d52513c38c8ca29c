package netguard

import (
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/fault"
)

func TestParseHostPortValid(t *testing.T) {
	long63 := strings.Repeat("a", 63)
	// 63*3 + 61 + 3 dots = 253 bytes.
	name253 := long63 + "." + long63 + "." + long63 + "." + strings.Repeat("b", 61)
	tests := []struct {
		in   string
		host string
		port uint16
	}{
		{"example.com:1080", "example.com", 1080},
		{"Example.COM:53", "Example.COM", 53},
		{"example.com.:53", "example.com.", 53},
		{"localhost:1", "localhost", 1},
		{"a:65535", "a", 65535},
		{"a-b.c-d.e:80", "a-b.c-d.e", 80},
		{"xn--bcher-kva.example:443", "xn--bcher-kva.example", 443},
		{"1.example:80", "1.example", 80},
		{"123abc:80", "123abc", 80},
		{"8.8.8.8:53", "8.8.8.8", 53},
		{"0.0.0.0:53", "0.0.0.0", 53},
		{"[2001:4860:4860::8888]:53", "2001:4860:4860::8888", 53},
		{"[::1]:1080", "::1", 1080},
		{"[::ffff:8.8.8.8]:53", "::ffff:8.8.8.8", 53},
		{"[2001:DB8::1]:53", "2001:DB8::1", 53},
		{long63 + ".com:80", long63 + ".com", 80},
		{name253 + ":80", name253, 80},
		{name253 + ".:80", name253 + ".", 80},
	}
	for _, tt := range tests {
		host, port, err := ParseHostPort("f", tt.in)
		if err != nil || host != tt.host || port != tt.port {
			t.Errorf("ParseHostPort(%q) = %q, %d, %v, want %q, %d, nil", tt.in, host, port, err, tt.host, tt.port)
		}
	}
}

func TestParseHostPortMalformed(t *testing.T) {
	long63 := strings.Repeat("a", 63)
	name254 := long63 + "." + long63 + "." + long63 + "." + strings.Repeat("b", 62)
	tests := []struct {
		name string
		in   string
	}{
		{"empty", ""},
		{"missing port", "example.com"},
		{"missing port ipv4", "8.8.8.8"},
		{"empty port", "example.com:"},
		{"empty host", ":53"},
		{"only colon", ":"},
		{"port zero", "example.com:0"},
		{"port too large", "example.com:65536"},
		{"port way too large", "example.com:99999999"},
		{"port leading zero", "example.com:053"},
		{"port all zeros", "example.com:00"},
		{"port plus sign", "example.com:+53"},
		{"port minus sign", "example.com:-53"},
		{"port hex", "example.com:0x35"},
		{"port name", "example.com:dns"},
		{"port space", "example.com: 53"},
		{"trailing space", "example.com:53 "},
		{"leading space", " example.com:53"},
		{"space in host", "exa mple.com:53"},
		{"unbracketed ipv6", "::1:53"},
		{"unbracketed ipv6 full", "2001:db8::1:53"},
		{"bracketed no port", "[::1]"},
		{"bracketed empty port", "[::1]:"},
		{"bracketed junk after", "[::1]x:53"},
		{"bracketed unterminated", "[::1:53"},
		{"bracketed empty", "[]:53"},
		{"bracketed ipv4", "[8.8.8.8]:53"},
		{"bracketed name", "[example.com]:53"},
		{"double brackets", "[[::1]]:53"},
		{"zone", "[fe80::1%eth0]:53"},
		{"zone escaped", "[fe80::1%25eth0]:53"},
		{"unbracketed zone", "fe80::1%eth0:53"},
		{"userinfo", "user@example.com:53"},
		{"userinfo password", "user:pass@example.com:53"},
		{"path", "example.com:53/path"},
		{"scheme", "socks5://example.com:1080"},
		{"query", "example.com:53?x"},
		{"underscore", "ex_ample.com:53"},
		{"leading hyphen", "-example.com:53"},
		{"trailing hyphen", "example-.com:53"},
		{"empty label", "example..com:53"},
		{"leading dot", ".example.com:53"},
		{"only dot", ".:53"},
		{"two trailing dots", "example.com..:53"},
		{"label too long", long63 + "a.com:53"},
		{"name too long", name254 + ":53"},
		{"unicode", "bücher.example:53"},
		{"short ipv4", "127.1:53"},
		{"ipv4 leading zero", "010.0.0.1:53"},
		{"ipv4 out of range", "256.0.0.1:53"},
		{"ipv4 five parts", "1.2.3.4.5:53"},
		{"decimal ipv4", "2130706433:53"},
		{"hex ipv4", "0x7f000001:53"},
		{"hex last label", "127.0.0.0x1:53"},
		{"numeric tld", "example.123:53"},
		{"nul byte", "example.com\x00:53"},
		{"backslash", "exa\\mple.com:53"},
		{"too long", strings.Repeat("a", 1000) + ":53"},
		{"many escaped bytes", strings.Repeat("\xc8", 58) + "0:"},
		{"many escaped runes", strings.Repeat("\u2028", 80) + ":53"},
	}
	for _, tt := range tests {
		host, port, err := ParseHostPort("spec.socks5.address", tt.in)
		fe := wantFault(t, "ParseHostPort("+tt.name+")", err, fault.KindInvalidArgument, fault.ReasonInvalidArgument, "spec.socks5.address")
		if err != nil && (host != "" || port != 0) {
			t.Errorf("ParseHostPort(%q) = %q, %d with error, want empty results", tt.in, host, port)
		}
		if fe != nil && len(fe.Message) > 200 {
			t.Errorf("ParseHostPort(%s) message is %d bytes, want a bounded echo", tt.name, len(fe.Message))
		}
	}
}
