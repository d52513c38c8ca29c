package protocol

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestNoticeBounds: the node reads at most MaxNotice of a notice, never
// receives a descriptor the guest attaches, and takes an empty message
// for the channel's end.
func TestNoticeBounds(t *testing.T) {
	node, guest, err := NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	nc := NewNodeChannel(node)
	defer nc.Close()
	defer guest.Close()
	gfd := int(guest.Fd())

	f, err := os.Open("/")
	if err != nil {
		t.Fatal(err)
	}
	msg := append([]byte{NoticePoweroff}, strings.Repeat("x", 100<<10)...)
	if err := unix.Sendmsg(gfd, msg, unix.UnixRights(int(f.Fd()), int(f.Fd())), nil, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	before := openFDs(t)
	kind, payload, err := nc.ReadNotice(true)
	if err != nil || kind != NoticePoweroff || len(payload) != MaxNotice-1 {
		t.Fatalf("ReadNotice = %q, %d bytes, %v", kind, len(payload), err)
	}
	if after := openFDs(t); after > before {
		t.Errorf("%d descriptors open after reading a notice with two attached, %d before", after, before)
	}
	if kind, _, err := nc.ReadNotice(false); kind != 0 || err != nil {
		t.Errorf("nothing queued: %q %v", kind, err)
	}
	if err := unix.Sendmsg(gfd, nil, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := nc.ReadNotice(true); !errors.Is(err, ErrChannelClosed) {
		t.Errorf("empty message: %v", err)
	}
}

// TestDialBounds: a guest that never accepts makes Dial wait no longer
// than its context; a guest that is gone makes it fail at once.
func TestDialBounds(t *testing.T) {
	node, guest, err := NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	nc := NewNodeChannel(node)
	defer nc.Close()
	var conns int
	t0 := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		c, err := nc.Dial(ctx)
		cancel()
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Dial to a full channel: %v", err)
			}
			break
		}
		c.Close()
		if conns++; conns > 10000 {
			t.Fatal("the channel never fills")
		}
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("filling the channel took %v", d)
	}
	t.Logf("the channel holds %d connections nobody accepted", conns)
	guest.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 = time.Now()
	if _, err := nc.Dial(ctx); err == nil || time.Since(t0) > time.Second {
		t.Errorf("Dial to a closed guest end: %v after %v", err, time.Since(t0))
	}
}
