package guest

import (
	"bytes"
	"testing"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
)

const (
	out = guestv1.Stream_STREAM_STDOUT
	er  = guestv1.Stream_STREAM_STDERR
)

// readAll reads r from off to its end: the bytes by stream and the drops.
func readAll(t *testing.T, r *ring, off uint64) (stdout, stderr []byte, drops []*guestv1.Dropped) {
	t.Helper()
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("read does not end")
		}
		ev, next, ok := r.read(off)
		if !ok {
			if off != r.end {
				t.Fatalf("read stopped at %d, end %d", off, r.end)
			}
			return
		}
		if next <= off {
			t.Fatalf("read(%d) → next %d", off, next)
		}
		switch e := ev.GetEvent().(type) {
		case *guestv1.EventsResponse_Dropped:
			drops = append(drops, e.Dropped)
		case *guestv1.EventsResponse_Output:
			if e.Output.GetOffset() != off {
				t.Fatalf("output at %d, want %d", e.Output.GetOffset(), off)
			}
			if e.Output.GetStream() == er {
				stderr = append(stderr, e.Output.GetData()...)
			} else {
				stdout = append(stdout, e.Output.GetData()...)
			}
		}
		off = next
	}
}

func TestRing(t *testing.T) {
	r := newRing(10)
	r.append(out, []byte("abc"))
	r.append(er, []byte("de"))
	r.append(out, []byte("fgh"))
	o, e, d := readAll(t, r, 0)
	if string(o) != "abcfgh" || string(e) != "de" || len(d) != 0 {
		t.Fatalf("readAll = %q %q %v", o, e, d)
	}
	// From the middle of a chunk.
	if o, e, _ := readAll(t, r, 4); string(o) != "fgh" || string(e) != "e" {
		t.Errorf("from 4: %q %q", o, e)
	}
	// Past the bound: the oldest bytes go, part of a chunk too, and a
	// reader from before them is told how many.
	r.append(out, []byte("ijklm")) // 13 bytes in all, 10 kept
	if r.start != 3 || r.size != 10 || r.end != 13 {
		t.Fatalf("start %d size %d end %d", r.start, r.size, r.end)
	}
	o, e, d = readAll(t, r, 0)
	if len(d) != 1 || d[0].GetOffset() != 0 || d[0].GetBytes() != 3 || string(o) != "fghijklm" || string(e) != "de" {
		t.Errorf("after a drop: %q %q %v", o, e, d)
	}
	r.append(out, []byte("0123456789")) // the whole ring turns over, within a chunk
	o, _, d = readAll(t, r, 5)
	if len(d) != 1 || d[0].GetOffset() != 5 || d[0].GetBytes() != 8 || string(o) != "0123456789" || len(r.chunks) != 1 {
		t.Errorf("turned over: %q %v (%d chunks)", o, d, len(r.chunks))
	}
	r.append(out, []byte("XYZ"))
	o, _, d = readAll(t, r, 20)
	if len(d) != 0 || string(o) != "789XYZ" {
		t.Errorf("trimmed chunk: %q %v", o, d)
	}
	// Nothing to read at the end, or past it.
	if _, _, ok := r.read(r.end); ok {
		t.Error("read at the end returned something")
	}
	// Memory: a ring never holds more than its bound.
	big := newRing(RingBytes)
	for range 100 {
		big.append(out, bytes.Repeat([]byte("x"), ChunkBytes))
	}
	if big.size != RingBytes || big.end != 100*ChunkBytes || len(big.chunks) != RingBytes/ChunkBytes {
		t.Errorf("size %d end %d chunks %d", big.size, big.end, len(big.chunks))
	}
}

func TestInputBuffer(t *testing.T) {
	b := inputBuffer{max: 8}
	if n, gap := b.accept(0, []byte("abcde")); n != 5 || gap || b.offset != 5 {
		t.Fatalf("accept(0, abcde) = %d %v, offset %d", n, gap, b.offset)
	}
	// A retry overlapping what was taken: only the new bytes are added,
	// and only what fits.
	if n, gap := b.accept(3, []byte("defghij")); n != 5 || gap || string(b.buf) != "abcdefgh" || b.offset != 8 {
		t.Fatalf("accept(3, defghij) = %d %v, buf %q offset %d", n, gap, b.buf, b.offset)
	}
	// Full: nothing more.
	if n, _ := b.accept(8, []byte("ij")); n != 0 {
		t.Errorf("accept when full = %d", n)
	}
	// All of it already taken.
	if n, _ := b.accept(2, []byte("cd")); n != 2 || b.offset != 8 {
		t.Errorf("accept of old bytes = %d, offset %d", n, b.offset)
	}
	// A gap.
	if n, gap := b.accept(9, []byte("x")); n != 0 || !gap {
		t.Errorf("accept past the offset = %d %v", n, gap)
	}
	// Written out: room again.
	b.buf = b.buf[8:]
	if n, _ := b.accept(8, []byte("ij")); n != 2 || b.offset != 10 || string(b.buf) != "ij" {
		t.Errorf("accept after a write = %d, offset %d buf %q", n, b.offset, b.buf)
	}
}
