package tunnel

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// setup serves a Registry on a plain HTTP/1.1 listener and runs a Dialer
// serving h towards it; it returns the Registry and a count of openings.
func setup(t *testing.T, h http.Handler, conns int) (*Registry, *atomic.Int64) {
	t.Helper()
	return setupWith(t, h, conns, &Registry{}, nil)
}

// setupWith is setup with the Registry g, and mod (when set) changing the
// Dialer before it runs.
func setupWith(t *testing.T, h http.Handler, conns int, g *Registry, mod func(*Dialer)) (*Registry, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := g.Accept(w, r, "node-1", []byte("key-1")); err != nil && !errors.Is(err, errTooMany) {
			t.Errorf("Accept = %v", err)
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); g.Close() })
	opened := &atomic.Int64{}
	d := &Dialer{Endpoint: "http://" + ln.Addr().String(), Handler: h, Conns: conns, Opened: func() { opened.Add(1) },
		Dial: func(ctx context.Context) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
		}}
	if mod != nil {
		mod(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, func() bool { return g.Count("node-1") == max(conns, 1) })
	return g, opened
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConcurrentStreams: one tunnel carries many streams at once, each
// held open until all have started.
func TestConcurrentStreams(t *testing.T) {
	const n = 32
	var started sync.WaitGroup
	started.Add(n)
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	g, _ := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Done()
		<-all
		fmt.Fprintf(w, "hello %s", r.URL.Query().Get("i"))
	}), 1)
	hc := &http.Client{Transport: g}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := hc.Get(fmt.Sprintf("%s/x?i=%d", NodeURL("node-1"), i))
			if err != nil {
				t.Errorf("stream %d: %v", i, err)
				return
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			if want := fmt.Sprintf("hello %d", i); string(b) != want {
				t.Errorf("stream %d = %q, want %q", i, b, want)
			}
		}()
	}
	wg.Wait()
	if _, err := hc.Get(NodeURL("node-2") + "/x"); err == nil {
		t.Error("a request to a node without a tunnel succeeded")
	}
}

// TestRedial: a dropped tunnel is dialed again.
func TestRedial(t *testing.T) {
	g, opened := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), 2)
	for round := range 3 {
		before := opened.Load()
		g.CloseNode("node-1")
		waitFor(t, func() bool { return g.Count("node-1") == 2 && opened.Load() >= before+2 })
		res, err := (&http.Client{Transport: g}).Get(NodeURL("node-1") + "/")
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		res.Body.Close()
	}
}

// TestLargeStream: 64 MiB through a tunnel arrive intact.
func TestLargeStream(t *testing.T) {
	const size = 64 << 20
	g, _ := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil || n != size {
			http.Error(w, fmt.Sprintf("read %d bytes: %v", n, err), 500)
			return
		}
		w.Write(h.Sum(nil))
	}), 1)
	data := make([]byte, size)
	rand.Read(data)
	want := sha256.Sum256(data)
	req, _ := http.NewRequest("POST", NodeURL("node-1")+"/", io.NopCloser(&byteReader{b: data}))
	res, err := (&http.Client{Transport: g}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got, _ := io.ReadAll(res.Body)
	if string(got) != string(want[:]) {
		t.Fatalf("digest = %x (%s), want %x", got, res.Status, want)
	}
}

type byteReader struct{ b []byte }

func (r *byteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestCloseKey: CloseKey closes the tunnels opened with that certificate
// key (they are dialed again: ctrl then refuses a denied key), and no
// other.
func TestCloseKey(t *testing.T) {
	g, opened := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), 2)
	waitFor(t, func() bool { return g.Count("node-1") == 2 })
	before := opened.Load()
	g.CloseKey([]byte("another-key"))
	time.Sleep(100 * time.Millisecond)
	if n := opened.Load(); n != before || g.Count("node-1") != 2 {
		t.Fatalf("another key's CloseKey: %d tunnels opened since, %d open", n-before, g.Count("node-1"))
	}
	g.CloseKey([]byte("key-1"))
	waitFor(t, func() bool { return opened.Load() >= before+2 })
}
