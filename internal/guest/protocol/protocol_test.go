package protocol

import (
	"bufio"
	"errors"
	"strings"
	"testing"
)

// TestReadMessageStrict: a line decodes into exactly one value of its type;
// anything else (a field of the wrong type, an unknown field, a second
// value, no JSON) is ErrMalformed, and a line past its bound ErrTooLong.
func TestReadMessageStrict(t *testing.T) {
	cases := []struct {
		line    string
		version uint32
		err     error
	}{
		{`{"ok":true,"protocol_version":7}`, 7, nil},
		{`{"ok":true}`, 0, nil},
		{`{"ok":true,"protocol_version":4294967295}` + "  ", 4294967295, nil},
		{`{"ok":true,"protocol_version":"7"}`, 0, ErrMalformed},
		{`{"ok":true,"protocol_version":-7}`, 0, ErrMalformed},
		{`{"ok":true,"protocol_version":7.0}`, 0, ErrMalformed},
		{`{"ok":true,"protocol_version":4294967296}`, 0, ErrMalformed},
		{`{"ok":true,"version":7}`, 0, ErrMalformed},
		{`{"ok":true} {"ok":true}`, 0, ErrMalformed},
		{`{"ok":true}x`, 0, ErrMalformed},
		{`ok`, 0, ErrMalformed},
		{`{"ok":true,"message":"` + strings.Repeat("m", MaxResponse) + `"}`, 0, ErrTooLong},
	}
	for _, c := range cases {
		var resp Response
		err := ReadMessage(bufio.NewReader(strings.NewReader(c.line+"\n")), &resp, MaxResponse)
		if c.err == nil && (err != nil || resp.ProtocolVersion != c.version) {
			t.Errorf("%.80s: %+v, %v; want protocol version %d", c.line, resp, err, c.version)
		}
		if c.err != nil && !errors.Is(err, c.err) {
			t.Errorf("%.80s: %v; want %v", c.line, err, c.err)
		}
	}
}
