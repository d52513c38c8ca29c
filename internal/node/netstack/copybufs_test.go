package netstack

import (
	"sync"
	"testing"
)

// TestCopyBufsBounded: at most MaxCopyBuffers large buffers are out at once; beyond
// that Get hands out 64 KiB ones, and giving buffers back makes large ones available
// again. Without the bound a workspace with many busy connections it never reads
// makes the node hold CopyBuffer (and more) per connection.
func TestCopyBufsBounded(t *testing.T) {
	const size = 1 << 20
	small := &sync.Pool{New: func() any { b := make([]byte, heldCopyBuffer); return &b }}
	p := &copyBufs{size: size, small: small}
	p.big.New = func() any { b := make([]byte, size); return &b }
	var out []*[]byte
	for range MaxCopyBuffers {
		b := p.Get().(*[]byte)
		if len(*b) != size {
			t.Fatalf("buffer %d has %d bytes, want %d", len(out), len(*b), size)
		}
		out = append(out, b)
	}
	extra := p.Get().(*[]byte)
	if len(*extra) != heldCopyBuffer {
		t.Fatalf("buffer beyond the bound has %d bytes, want %d", len(*extra), heldCopyBuffer)
	}
	p.Put(extra)
	if got := p.out.Load(); got != MaxCopyBuffers {
		t.Fatalf("giving back a small buffer changed the count to %d", got)
	}
	p.Put(out[0])
	if b := p.Get().(*[]byte); len(*b) != size {
		t.Fatalf("after one was given back: %d bytes, want %d", len(*b), size)
	}
	for _, b := range out[1:] {
		p.Put(b)
	}
	if got := p.out.Load(); got != 1 {
		t.Fatalf("%d large buffers counted out, want 1", got)
	}
}
