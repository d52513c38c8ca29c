package network

import (
	"context"
	"io"
	"net"
	"testing"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// sinkServer accepts on 127.0.0.1 until the benchmark ends: for each connection it
// either discards what it reads (and reports the count) or writes chunk until the
// peer goes away.
func sinkServer(b *testing.B, send []byte, got chan<- int64) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if send == nil {
					n, _ := io.Copy(io.Discard, c)
					if got != nil {
						got <- n
					}
					return
				}
				for {
					if _, err := c.Write(send); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// BenchmarkConnect is the time from the workspace's SYN to an established
// connection through the node (decision, the node's dial, the handshake), direct
// to a listener on loopback, over a pipe link; "kernel" is a plain loopback connect
// as the reference.
func BenchmarkConnect(b *testing.B) {
	addr := sinkServer(b, nil, nil)
	b.Run("direct", func(b *testing.B) {
		w := newWS(b, testConfig(&dialLog{}), &nodev1.NetworkConfig{Policy: public(1)})
		dst := standIn(b, addr)
		ctx := context.Background()
		for b.Loop() {
			c, err := w.dial(ctx, dst)
			if err != nil {
				b.Fatal(err)
			}
			c.Close()
		}
	})
	b.Run("kernel", func(b *testing.B) {
		for b.Loop() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			c.Close()
		}
	})
}

// BenchmarkThroughput is one connection's throughput through the node, direct, both
// directions, over a pipe link (the TAP of production is netstack's
// BenchmarkTAPThroughput).
func BenchmarkThroughput(b *testing.B) {
	chunk := make([]byte, 256<<10)
	b.Run("upload", func(b *testing.B) {
		got := make(chan int64, 1)
		addr := sinkServer(b, nil, got)
		w := newWS(b, testConfig(&dialLog{}), &nodev1.NetworkConfig{Policy: public(1)})
		c, err := w.dial(context.Background(), standIn(b, addr))
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(chunk)))
		for b.Loop() {
			if _, err := c.Write(chunk); err != nil {
				b.Fatal(err)
			}
		}
		c.CloseWrite()
		n := <-got
		c.Close()
		if n != int64(b.N)*int64(len(chunk)) {
			b.Fatalf("sink got %d bytes, want %d", n, int64(b.N)*int64(len(chunk)))
		}
	})
	b.Run("download", func(b *testing.B) {
		addr := sinkServer(b, chunk, nil)
		w := newWS(b, testConfig(&dialLog{}), &nodev1.NetworkConfig{Policy: public(1)})
		c, err := w.dial(context.Background(), standIn(b, addr))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, len(chunk))
		b.SetBytes(int64(len(chunk)))
		for b.Loop() {
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}
