//go:build linux

package nettest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what a TCPServer does with each connection.
type Mode int

const (
	// Echo writes back what it reads, until the client closes.
	Echo Mode = iota
	// Sink reads until the client half-closes (EOF), then writes the number
	// of bytes it read as a decimal line and closes: a client that waits
	// for the line knows its bytes arrived.
	Sink
	// Source reads one decimal line N, then writes N bytes and closes (N 0:
	// writes until the client closes).
	Source
	// Hold reads and discards until the client closes: a long-lived
	// connection whose end the test watches (Conn.Done).
	Hold
)

func (m Mode) String() string {
	switch m {
	case Echo:
		return "echo"
	case Sink:
		return "sink"
	case Source:
		return "source"
	case Hold:
		return "hold"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// TCPServer serves one Mode inside a Peer and records every connection.
type TCPServer struct {
	Addr netip.AddrPort // the Peer's address and the port
	mode Mode
	ln   *net.TCPListener

	mu      sync.Mutex
	conns   []*Conn
	changed chan struct{} // closed and replaced at each accept
	next    int           // Next's cursor
	closed  bool
	wg      sync.WaitGroup
}

// Conn is one accepted connection of a TCPServer.
type Conn struct {
	Remote   netip.AddrPort // the client's address as the server sees it
	Accepted time.Time
	In, Out  atomic.Int64 // bytes read and written

	c        net.Conn
	done     chan struct{}
	closedAt time.Time
	err      error
}

// Done is closed when the connection has ended (the client closed it, it
// failed, or the server closed it).
func (c *Conn) Done() <-chan struct{} { return c.done }

// Ended returns when the connection ended and how (nil: the client closed
// it cleanly), once Done is closed.
func (c *Conn) Ended() (time.Time, error) {
	<-c.done
	return c.closedAt, c.err
}

// Close closes the connection from the server's side.
func (c *Conn) Close() { c.c.Close() }

// TCP starts a TCPServer of mode inside the Peer on port (0: a free port).
func (p *Peer) TCP(mode Mode, port uint16) (*TCPServer, error) {
	ln, err := p.Listen(port)
	if err != nil {
		return nil, err
	}
	s := &TCPServer{Addr: ln.Addr().(*net.TCPAddr).AddrPort(), mode: mode, ln: ln, changed: make(chan struct{})}
	s.Addr = netip.AddrPortFrom(s.Addr.Addr().Unmap(), s.Addr.Port())
	go s.serve()
	p.onClose(func() error { s.Close(); return nil })
	return s, nil
}

func (s *TCPServer) serve() {
	for {
		c, err := s.ln.AcceptTCP()
		if err != nil {
			return
		}
		rem := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		conn := &Conn{Remote: netip.AddrPortFrom(rem.Addr().Unmap(), rem.Port()), Accepted: time.Now(), c: c, done: make(chan struct{})}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns = append(s.conns, conn)
		close(s.changed)
		s.changed = make(chan struct{})
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			err := s.handle(conn, c)
			c.Close()
			conn.closedAt, conn.err = time.Now(), err
			close(conn.done)
		}()
	}
}

// handle runs the mode on one connection; nil means the client ended it
// cleanly.
func (s *TCPServer) handle(conn *Conn, c *net.TCPConn) error {
	r := &countReader{r: c, n: &conn.In}
	w := &countWriter{w: c, n: &conn.Out}
	switch s.mode {
	case Echo:
		_, err := io.Copy(w, r)
		return err
	case Sink, Hold:
		if _, err := io.Copy(io.Discard, r); err != nil {
			return err
		}
		if s.mode == Sink {
			_, err := fmt.Fprintf(w, "%d\n", conn.In.Load())
			return err
		}
		return nil
	case Source:
		line, err := bufio.NewReaderSize(r, 64).ReadString('\n')
		if err != nil {
			return err
		}
		n, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("source: bad count %q", line)
		}
		// The client's close (or reset) ends an endless source.
		go io.Copy(io.Discard, c)
		buf := make([]byte, 256<<10)
		for n == 0 || conn.Out.Load() < n {
			chunk := buf
			if n > 0 {
				chunk = buf[:min(int64(len(buf)), n-conn.Out.Load())]
			}
			if _, err := w.Write(chunk); err != nil {
				if n == 0 {
					return nil
				}
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown mode %v", s.mode)
}

// Conns returns the connections accepted so far, in order.
func (s *TCPServer) Conns() []*Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Conn(nil), s.conns...)
}

// Open counts the connections that have not ended.
func (s *TCPServer) Open() int {
	n := 0
	for _, c := range s.Conns() {
		select {
		case <-c.done:
		default:
			n++
		}
	}
	return n
}

// Next returns the first connection accepted after those Next already
// returned, waiting for it until ctx ends.
func (s *TCPServer) Next(ctx context.Context) (*Conn, error) {
	for {
		s.mu.Lock()
		if s.next < len(s.conns) {
			c := s.conns[s.next]
			s.next++
			s.mu.Unlock()
			return c, nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("nettest: no new connection to %s: %w", s.Addr, ctx.Err())
		}
	}
}

// Close stops accepting, closes every connection and waits for the
// handlers.
func (s *TCPServer) Close() {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.mu.Unlock()
	s.ln.Close()
	for _, c := range conns {
		c.c.Close()
	}
	s.wg.Wait()
}

type countReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type countWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// HTTPServer is an HTTP server inside a Peer.
type HTTPServer struct {
	Addr netip.AddrPort // the Peer's address and the port
	srv  *http.Server

	mu   sync.Mutex
	reqs []Request
}

// Request is one request an HTTPServer answered.
type Request struct {
	Remote netip.AddrPort
	Path   string
	At     time.Time
}

// URL is http://ADDR plus path.
func (h *HTTPServer) URL(path string) string { return "http://" + h.Addr.String() + path }

// Requests returns the requests answered so far.
func (h *HTTPServer) Requests() []Request {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Request(nil), h.reqs...)
}

// WhoAmIBody is what the default HTTP handler answers: the Peer's address and
// the client's address as the server saw it. ParseWhoAmI reads it back.
func WhoAmIBody(peer netip.Addr, client netip.AddrPort) string {
	return fmt.Sprintf("kibotos-nettest peer %s client %s\n", peer, client)
}

// ParseWhoAmI returns the client address of a WhoAmIBody.
func ParseWhoAmI(body string) (peer netip.Addr, client netip.AddrPort, err error) {
	f := strings.Fields(body)
	if len(f) != 5 || f[0] != "kibotos-nettest" || f[1] != "peer" || f[3] != "client" {
		return peer, client, fmt.Errorf("nettest: not a who-am-I answer: %q", body)
	}
	if peer, err = netip.ParseAddr(f[2]); err != nil {
		return peer, client, err
	}
	client, err = netip.ParseAddrPort(f[4])
	return peer, client, err
}

// HTTP starts an HTTP server inside the Peer on a free port. A nil handler
// answers every request with WhoAmIBody.
func (p *Peer) HTTP(h http.Handler) (*HTTPServer, error) {
	ln, err := p.Listen(0)
	if err != nil {
		return nil, err
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	s := &HTTPServer{Addr: netip.AddrPortFrom(a.Addr().Unmap(), a.Port())}
	if h == nil {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rem, _ := netip.ParseAddrPort(r.RemoteAddr)
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, WhoAmIBody(p.Addr, netip.AddrPortFrom(rem.Addr().Unmap(), rem.Port())))
		})
	}
	s.srv = &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rem, _ := netip.ParseAddrPort(r.RemoteAddr)
			s.mu.Lock()
			s.reqs = append(s.reqs, Request{Remote: netip.AddrPortFrom(rem.Addr().Unmap(), rem.Port()), Path: r.URL.Path, At: time.Now()})
			s.mu.Unlock()
			h.ServeHTTP(w, r)
		}),
	}
	go s.srv.Serve(ln)
	p.onClose(func() error {
		if err := s.srv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	return s, nil
}
