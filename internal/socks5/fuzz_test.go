package socks5

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzParseReply: the reply parser never panics, reads through readReply the
// same as parseReply on an exact reply, and what it accepts re-encodes to the
// same bytes.
func FuzzParseReply(f *testing.F) {
	f.Add([]byte{5, 0, 0, 1, 127, 0, 0, 1, 4, 56})
	f.Add([]byte{5, 2, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Add(append([]byte{5, 0, 0}, enc(name)...))
	f.Add(append([]byte{5, 0, 0}, enc(v6)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := parseReply(b)
		ra, rerr := readReply(bytes.NewReader(b))
		if err != nil {
			var re ReplyError
			if !errors.Is(err, ErrProtocol) && !errors.As(err, &re) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		if rerr != nil || ra != a {
			t.Fatalf("parseReply %v, readReply %v %v", a, ra, rerr)
		}
		again, err := appendAddr([]byte{5, 0, b[2]}, a) // RSV is not checked
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x (%v), parsed %x", again, err, b)
		}
	})
}

// FuzzParseUDP: the UDP header parser never panics, and what it accepts with
// FRAG 0 re-encodes to the same bytes.
func FuzzParseUDP(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 127, 0, 0, 1, 0, 53, 'h', 'i'})
	f.Add([]byte{0, 0, 1, 1, 127, 0, 0, 1, 0, 53})
	f.Add(append([]byte{0, 0, 0}, enc(name)...))
	f.Add(append(append([]byte{0, 0, 0}, enc(v6)...), "payload"...))
	f.Fuzz(func(t *testing.T, b []byte) {
		frag, a, payload, err := parseUDP(b)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		if frag != 0 {
			return
		}
		again, err := appendUDP(nil, a, payload)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x (%v), parsed %x", again, err, b)
		}
	})
}
