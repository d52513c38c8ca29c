package sandbox

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// fakeGuest is an execution whose channel leads to a guest that answers
// every request with line (no root needed: only the channel is real).
func fakeGuest(t *testing.T, line string) *execution {
	t.Helper()
	node, guest, err := protocol.NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(guest.Fd()))
	guest.Close()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := protocol.NewChannelListener(fd)
	if err != nil {
		t.Fatal(err)
	}
	e := &execution{ws: "ws-handshake", done: make(chan struct{}), cond: GuestBooting, ch: protocol.NewNodeChannel(node)}
	t.Cleanup(func() {
		ln.Close()
		e.ch.Close()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					if _, err := br.ReadString('\n'); err != nil {
						return
					}
					if _, err := c.Write([]byte(line + "\n")); err != nil {
						return
					}
				}
			}(c)
		}
	}()
	return e
}

// TestGuestHandshake: the first ping is the protocol version handshake. A
// guest that states the node's version starts READY; one that states
// another, none, or a version the node cannot decode fails the start with
// ErrGuestProtocol (Permanent), its message naming both versions and
// bounded; every later ping checks the version the same way.
func TestGuestHandshake(t *testing.T) {
	v := strconv.Itoa(nodewire.GuestProtocolVersion)
	other := strconv.Itoa(nodewire.GuestProtocolVersion + 1)
	cases := []struct {
		name string
		line string
		want string // "" for a successful handshake, else a part of the error
	}{
		{"stated", `{"ok":true,"condition":"READY","protocol_version":` + v + `}`, ""},
		{"stated with pressure", `{"ok":true,"condition":"DISK_PRESSURE","message":"full","protocol_version":` + v + `}`, ""},
		{"other", `{"ok":true,"condition":"READY","protocol_version":` + other + `}`, "the guest speaks protocol " + other + ", the node " + v},
		{"max uint32", `{"ok":true,"condition":"READY","protocol_version":4294967295}`, "the guest speaks protocol 4294967295, the node " + v},
		{"missing", `{"ok":true,"condition":"READY"}`, "the guest states no protocol version"},
		{"zero", `{"ok":true,"condition":"READY","protocol_version":0}`, "the guest states no protocol version"},
		{"null", `{"ok":true,"condition":"READY","protocol_version":null}`, "the guest states no protocol version"},
		{"string", `{"ok":true,"condition":"READY","protocol_version":"` + v + `"}`, "is not of protocol " + v},
		{"negative", `{"ok":true,"condition":"READY","protocol_version":-1}`, "is not of protocol"},
		{"fraction", `{"ok":true,"condition":"READY","protocol_version":1.5}`, "is not of protocol"},
		{"exponent", `{"ok":true,"condition":"READY","protocol_version":1e0}`, "is not of protocol"},
		{"overflow", `{"ok":true,"condition":"READY","protocol_version":4294967297}`, "is not of protocol"},
		{"object", `{"ok":true,"condition":"READY","protocol_version":{"v":1}}`, "is not of protocol"},
		{"two values", `{"ok":true,"condition":"READY","protocol_version":` + v + `} {"ok":true}`, "is not of protocol"},
		{"unknown field", `{"ok":true,"condition":"READY","protocol_version":` + v + `,"` + strings.Repeat("x", 60<<10) + `":1}`, "is not of protocol"},
		{"not json", `hello from another protocol`, "is not of protocol"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &Runtime{cfg: Config{StartTimeout: 5 * time.Second}}
			e := fakeGuest(t, c.line)
			err := r.waitGuest(context.Background(), e)
			if c.want == "" {
				if err != nil {
					t.Fatalf("waitGuest: %v", err)
				}
				if e.cond == GuestBooting || e.cond == "" {
					t.Fatalf("condition after the handshake: %q", e.cond)
				}
				return
			}
			if !errors.Is(err, ErrGuestProtocol) || !Permanent(err) || errors.Is(err, ErrGuestNotReady) {
				t.Fatalf("waitGuest = %v; want a permanent ErrGuestProtocol", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("waitGuest = %q; want it to say %q", err, c.want)
			}
			if len(err.Error()) > protocol.MaxText+200 {
				t.Errorf("an error of %d bytes", len(err.Error()))
			}
			if e.cond != GuestBooting {
				t.Errorf("condition %q after a failed handshake", e.cond)
			}
			// A later ping (health, adoption) checks the same.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, _, err := r.ping(ctx, e); !errors.Is(err, ErrGuestProtocol) {
				t.Errorf("ping = %v; want ErrGuestProtocol", err)
			}
		})
	}
}

// TestGuestHandshakeNotAProtocolFailure: a guest that does not answer in
// time, or answers an error, is not ready (a retry may pass), not a
// protocol mismatch.
func TestGuestHandshakeNotAProtocolFailure(t *testing.T) {
	r := &Runtime{cfg: Config{StartTimeout: 300 * time.Millisecond}}
	for name, line := range map[string]string{
		"error": `{"ok":false,"error":"busy"}`,
		"lie":   `{"ok":true,"condition":"UNRESPONSIVE","protocol_version":` + strconv.Itoa(nodewire.GuestProtocolVersion) + `}`,
	} {
		t.Run(name, func(t *testing.T) {
			err := r.waitGuest(context.Background(), fakeGuest(t, line))
			if !errors.Is(err, ErrGuestNotReady) || Permanent(err) {
				t.Fatalf("waitGuest = %v; want ErrGuestNotReady, not permanent", err)
			}
		})
	}
}
