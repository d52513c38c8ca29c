//go:build linux

package netstack

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// countingPool counts the buffers taken and not given back.
type countingPool struct {
	p         sync.Pool
	gets, out atomic.Int64
}

func (c *countingPool) Get() any  { c.gets.Add(1); c.out.Add(1); return c.p.Get() }
func (c *countingPool) Put(x any) { c.out.Add(-1); c.p.Put(x) }

// TestReadSocketHoldsNoBufferWhileWaiting: a read of an upstream socket with nothing to
// read holds no buffer while it waits; once data comes it returns it in one buffer, and
// the socket's end is io.EOF with no buffer.
func TestReadSocketHoldsNoBufferWhileWaiting(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	rc := rawConn(client)
	if rc == nil {
		t.Fatal("no raw socket of a TCP connection")
	}
	pool := &countingPool{}
	pool.p.New = func() any { b := make([]byte, 1<<20); return &b }

	type result struct {
		bp  *[]byte
		n   int
		err error
	}
	res := make(chan result, 1)
	go func() {
		bp, n, err := readSocket(rc, pool)
		res <- result{bp, n, err}
	}()
	// Waiting: it looked once (and gave the buffer back).
	waitFor(t, func() bool { return pool.gets.Load() >= 1 && pool.out.Load() == 0 })
	select {
	case r := <-res:
		t.Fatalf("read returned before any data: %d bytes, %v", r.n, r.err)
	default:
	}

	msg := []byte("hello through the node")
	if _, err := server.Write(msg); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || string((*r.bp)[:r.n]) != string(msg) {
		t.Fatalf("read %q, %v; want %q", (*r.bp)[:r.n], r.err, msg)
	}
	if out := pool.out.Load(); out != 1 {
		t.Fatalf("%d buffers out with the data, want 1", out)
	}
	pool.Put(r.bp)

	server.Close()
	bp, n, err := readSocket(rc, pool)
	if err != io.EOF || n != 0 || bp != nil {
		t.Fatalf("at the peer's close: %v, %d bytes, buffer %v; want io.EOF and none", err, n, bp != nil)
	}
	if out := pool.out.Load(); out != 0 {
		t.Fatalf("%d buffers out after EOF, want 0", out)
	}
}
