package socks5

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// fake runs script as the proxy's side of a pipe and returns the client side.
// The script's failures are reported on t; the pipe is closed when it returns.
func fake(t *testing.T, script func(c net.Conn) error) net.Conn {
	t.Helper()
	client, server := net.Pipe()
	done := make(chan error, 1)
	go func() {
		err := script(server)
		server.Close()
		done <- err
	}()
	t.Cleanup(func() {
		client.Close()
		if err := <-done; err != nil {
			t.Errorf("fake proxy: %v", err)
		}
	})
	return client
}

// expect reads exactly len(want) bytes and compares them.
func expect(c net.Conn, want []byte) error {
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return &mismatch{got, want}
	}
	return nil
}

type mismatch struct{ got, want []byte }

func (m *mismatch) Error() string {
	return "got " + string(hexs(m.got)) + " want " + string(hexs(m.want))
}

func hexs(b []byte) []byte {
	const h = "0123456789abcdef"
	out := make([]byte, 0, 3*len(b))
	for _, c := range b {
		out = append(out, h[c>>4], h[c&15], ' ')
	}
	return out
}

// enc is the wire form of a valid address.
func enc(a Addr) []byte {
	b, err := appendAddr(nil, a)
	if err != nil {
		panic(err)
	}
	return b
}

var (
	v4   = Addr{IP: netip.MustParseAddr("192.0.2.7"), Port: 443}
	v6   = Addr{IP: netip.MustParseAddr("2001:db8::1"), Port: 8080}
	name = Addr{Name: "example.test", Port: 80}
)

func TestAddressEncoding(t *testing.T) {
	for _, tc := range []struct {
		a    Addr
		want []byte
	}{
		{v4, []byte{1, 192, 0, 2, 7, 1, 187}},
		{v6, append(append([]byte{4}, netip.MustParseAddr("2001:db8::1").AsSlice()...), 0x1f, 0x90)},
		{name, append(append([]byte{3, 12}, "example.test"...), 0, 80)},
	} {
		got := enc(tc.a)
		if !bytes.Equal(got, tc.want) {
			t.Errorf("%v: got %x want %x", tc.a, got, tc.want)
		}
		back, n, err := parseAddr(got)
		if err != nil || n != len(got) || back != tc.a {
			t.Errorf("%v: parsed back %v, %d, %v", tc.a, back, n, err)
		}
	}
	for _, bad := range []Addr{{}, {Name: strings.Repeat("a", 256), Port: 1}, {IP: netip.MustParseAddr("fe80::1%eth0")}, {IP: v4.IP, Name: "x"}} {
		if _, err := appendAddr(nil, bad); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%+v: err %v, want ErrInvalidRequest", bad, err)
		}
	}
	if _, err := appendAddr(nil, Addr{Name: strings.Repeat("a", 255), Port: 1}); err != nil {
		t.Errorf("255-byte name: %v", err)
	}
}

// TestConnectAddressTypes: the request carries each address type as is, and
// the bound address of each type comes back.
func TestConnectAddressTypes(t *testing.T) {
	for _, dst := range []Addr{v4, v6, name} {
		for _, bound := range []Addr{v4, v6, name} {
			conn := fake(t, func(c net.Conn) error {
				if err := expect(c, []byte{5, 1, 0}); err != nil {
					return err
				}
				c.Write([]byte{5, 0})
				if err := expect(c, append([]byte{5, 1, 0}, enc(dst)...)); err != nil {
					return err
				}
				_, err := c.Write(append(append([]byte{5, 0, 0}, enc(bound)...), "hello"...))
				return err
			})
			var cl Client
			got, err := cl.Connect(context.Background(), conn, dst)
			if err != nil {
				t.Fatalf("%v via %v: %v", dst, bound, err)
			}
			if got != bound {
				t.Errorf("bound %v, want %v", got, bound)
			}
			// The bytes after the reply are the destination's, untouched.
			data := make([]byte, 5)
			if _, err := io.ReadFull(conn, data); err != nil || string(data) != "hello" {
				t.Errorf("data after reply: %q %v", data, err)
			}
		}
	}
}

func authScript(user, pass string, status byte) func(c net.Conn) error {
	return func(c net.Conn) error {
		if err := expect(c, []byte{5, 2, 0, 2}); err != nil {
			return err
		}
		c.Write([]byte{5, 2})
		want := append(append([]byte{1, byte(len(user))}, user...), byte(len(pass)))
		if err := expect(c, append(want, pass...)); err != nil {
			return err
		}
		c.Write([]byte{1, status})
		if status != 0 {
			return nil
		}
		if err := expect(c, append([]byte{5, 1, 0}, enc(v4)...)); err != nil {
			return err
		}
		_, err := c.Write(append([]byte{5, 0, 0}, enc(v4)...))
		return err
	}
}

func TestAuth(t *testing.T) {
	cl := Client{Username: "alice", Password: "s3cret-Pa55"}
	if _, err := cl.Connect(context.Background(), fake(t, authScript("alice", "s3cret-Pa55", 0)), v4); err != nil {
		t.Fatalf("right password: %v", err)
	}
	_, err := cl.Connect(context.Background(), fake(t, authScript("alice", "s3cret-Pa55", 1)), v4)
	if !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("refused password: %v, want ErrAuthFailed", err)
	}
	if strings.Contains(err.Error(), cl.Password) {
		t.Errorf("error %q shows the password", err)
	}
	// A proxy that closes instead of answering the credentials.
	_, err = cl.Connect(context.Background(), fake(t, func(c net.Conn) error {
		io.ReadFull(c, make([]byte, 4))
		c.Write([]byte{5, 2})
		io.ReadFull(c, make([]byte, 3+5+11))
		return nil
	}), v4)
	if !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("closed after credentials: %v, want ErrAuthFailed", err)
	}
	// Longest credentials pass; longer ones are refused before anything is sent.
	long := strings.Repeat("p", 255)
	if _, err := (&Client{Username: long, Password: long}).Connect(context.Background(), fake(t, authScript(long, long, 0)), v4); err != nil {
		t.Fatalf("255-byte credentials: %v", err)
	}
	for _, bad := range []Client{{Username: long + "x", Password: "p"}, {Username: "u", Password: long + "x"}, {Username: "u"}, {Password: "p"}} {
		_, err := bad.Connect(context.Background(), fake(t, func(c net.Conn) error {
			if n, _ := c.Read(make([]byte, 1)); n != 0 {
				return errors.New("something was sent")
			}
			return nil
		}), v4)
		if !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("user %d bytes, password %d bytes: %v, want ErrInvalidRequest", len(bad.Username), len(bad.Password), err)
		}
		if bad.Password != "" && strings.Contains(err.Error(), bad.Password) {
			t.Errorf("error %q shows the password", err)
		}
	}
}

func TestMethodSelection(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client Client
		reply  []byte
		want   error
	}{
		{"no acceptable method", Client{}, []byte{5, 0xff}, ErrNoAcceptableMethod},
		{"user/password not offered", Client{}, []byte{5, 2}, ErrProtocol},
		{"GSSAPI never offered", Client{Username: "u", Password: "p"}, []byte{5, 1}, ErrProtocol},
		{"version 4", Client{}, []byte{4, 0}, ErrProtocol},
		{"closed", Client{}, nil, ErrProtocol},
		{"half a selection", Client{}, []byte{5}, ErrProtocol},
	} {
		conn := fake(t, func(c net.Conn) error {
			c.Read(make([]byte, 4))
			c.Write(tc.reply)
			return nil
		})
		if _, err := tc.client.Connect(context.Background(), conn, v4); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func noAuthThen(reply []byte) func(c net.Conn) error {
	return func(c net.Conn) error {
		if err := expect(c, []byte{5, 1, 0}); err != nil {
			return err
		}
		c.Write([]byte{5, 0})
		io.ReadFull(c, make([]byte, 3+7))
		c.Write(reply)
		return nil
	}
}

func TestReplyCodes(t *testing.T) {
	codes := []ReplyError{ErrGeneralFailure, ErrNotAllowed, ErrNetworkUnreachable, ErrHostUnreachable,
		ErrConnectionRefused, ErrTTLExpired, ErrCommandNotSupported, ErrAddressTypeNotSupported, ReplyError(0x42)}
	for _, code := range codes {
		// With a full reply, and with the proxy closing after the code.
		for _, reply := range [][]byte{append([]byte{5, byte(code), 0}, enc(v4)...), {5, byte(code)}} {
			_, err := (&Client{}).Connect(context.Background(), fake(t, noAuthThen(reply)), v4)
			if !errors.Is(err, code) {
				t.Errorf("code %d (%d bytes): %v", code, len(reply), err)
			}
			var re ReplyError
			if !errors.As(err, &re) || re != code {
				t.Errorf("code %d: As gives %v", code, re)
			}
		}
	}
	if ErrNotAllowed.Error() != "socks5: proxy replied: connection not allowed by ruleset" {
		t.Errorf("message %q", ErrNotAllowed.Error())
	}
}

func TestMalformedReplies(t *testing.T) {
	good := append([]byte{5, 0, 0}, enc(name)...)
	var cases [][]byte
	for i := 0; i < len(good); i++ {
		cases = append(cases, good[:i]) // truncated, then closed
	}
	cases = append(cases,
		append([]byte{4, 0, 0}, enc(v4)...),  // version
		[]byte{5, 0, 0, 9, 1, 2, 3, 4, 5, 6}, // address type
		[]byte{5, 0, 0, 3, 0, 0, 80},         // empty name
	)
	for _, reply := range cases {
		_, err := (&Client{}).Connect(context.Background(), fake(t, noAuthThen(reply)), v4)
		if !errors.Is(err, ErrProtocol) {
			t.Errorf("reply %x: %v, want ErrProtocol", reply, err)
		}
	}
}

// TestOversizedReply: a proxy that sends far more than a reply gets exactly
// one reply read; the rest stays on the connection.
func TestOversizedReply(t *testing.T) {
	long := Addr{Name: strings.Repeat("n", 255), Port: 1}
	flood := append(append([]byte{5, 0, 0}, enc(long)...), bytes.Repeat([]byte{0xee}, 1<<16)...)
	conn := fake(t, noAuthThen(flood))
	bound, err := (&Client{}).Connect(context.Background(), conn, v4)
	if err != nil || bound != long {
		t.Fatalf("bound %v, %v", bound, err)
	}
	rest, _ := io.ReadAll(conn)
	if len(rest) != 1<<16 {
		t.Errorf("%d bytes left after the reply, want %d", len(rest), 1<<16)
	}
}

// TestStall: a proxy that never answers fails the handshake at the deadline.
func TestStall(t *testing.T) {
	stall := func(c net.Conn) error { io.Copy(io.Discard, c); return nil }
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := (&Client{}).Connect(ctx, fake(t, stall), v4)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("context deadline: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
	// No deadline in the context: the Client's Timeout.
	_, err = (&Client{Timeout: 100 * time.Millisecond}).Connect(context.Background(), fake(t, stall), v4)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("client timeout: %v", err)
	}
	// Cancellation interrupts a read in progress.
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = (&Client{}).Connect(ctx, fake(t, stall), v4)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancel: %v", err)
	}
	// After a handshake the deadline is cleared.
	conn := fake(t, func(c net.Conn) error {
		if err := noAuthThen(append([]byte{5, 0, 0}, enc(v4)...))(c); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond)
		_, err := c.Write([]byte("late"))
		return err
	})
	ctx, cancel = context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	if _, err := (&Client{}).Connect(ctx, conn, v4); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, make([]byte, 4)); err != nil {
		t.Errorf("read after the handshake deadline: %v", err)
	}
}

func TestUDPHeaderRoundTrip(t *testing.T) {
	for _, a := range []Addr{v4, v6, name, {Name: strings.Repeat("z", 255), Port: 65535}} {
		for _, payload := range [][]byte{nil, []byte("x"), bytes.Repeat([]byte{7}, 1400)} {
			b, err := appendUDP(nil, a, payload)
			if err != nil {
				t.Fatal(err)
			}
			frag, got, p, err := parseUDP(b)
			if err != nil || frag != 0 || got != a || !bytes.Equal(p, payload) {
				t.Errorf("%v: %d %v %d bytes %v", a, frag, got, len(p), err)
			}
		}
	}
	for _, bad := range [][]byte{nil, {0, 0}, {1, 0, 0, 1, 1, 2, 3, 4, 0, 1}, {0, 0, 0, 9}, {0, 0, 0, 1, 1, 2}} {
		if _, _, _, err := parseUDP(bad); !errors.Is(err, ErrProtocol) {
			t.Errorf("%x: %v", bad, err)
		}
	}
}
