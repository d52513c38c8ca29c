package artifact

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
)

// fakeCtrl serves FetchArtifact from a blob, with faults.
type fakeCtrl struct {
	nodev1connect.UnimplementedNodeServiceHandler
	blob  []byte
	chunk int
	// breakAfter: end the stream with an error after this many bytes of
	// the call (0: never).
	breakAfter int
	// truncate: end the stream cleanly this many bytes early.
	truncate int
	// corrupt flips a byte.
	corrupt bool
	// gate, when set, is waited for before the first message.
	gate    chan struct{}
	calls   atomic.Int32
	offsets []uint64
	mu      sync.Mutex
}

func (f *fakeCtrl) FetchArtifact(ctx context.Context, req *connect.Request[nodev1.FetchArtifactRequest], st *connect.ServerStream[nodev1.FetchArtifactResponse]) error {
	f.calls.Add(1)
	f.mu.Lock()
	f.offsets = append(f.offsets, req.Msg.GetOffset())
	f.mu.Unlock()
	if f.gate != nil {
		<-f.gate
	}
	blob := append([]byte(nil), f.blob...)
	if f.corrupt {
		blob[len(blob)/2] ^= 0xff
	}
	end := len(blob) - f.truncate
	sent := 0
	for off := int(req.Msg.GetOffset()); off < end; off += f.chunk {
		n := min(f.chunk, end-off)
		if f.breakAfter > 0 && sent+n > f.breakAfter {
			n = f.breakAfter - sent
			if n > 0 {
				_ = st.Send(&nodev1.FetchArtifactResponse{SizeBytes: uint64(len(blob)), Data: blob[off : off+n]})
			}
			return connect.NewError(connect.CodeUnavailable, errors.New("broken"))
		}
		if err := st.Send(&nodev1.FetchArtifactResponse{SizeBytes: uint64(len(blob)), Data: blob[off : off+n]}); err != nil {
			return err
		}
		sent += n
	}
	return nil
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return DigestPrefix + hex.EncodeToString(s[:])
}

func newStore(t *testing.T, f *fakeCtrl) *Store {
	t.Helper()
	_, h := nodev1connect.NewNodeServiceHandler(f)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s, err := New(Config{Dir: filepath.Join(t.TempDir(), "artifacts"), Client: NewClient(srv.Client(), srv.URL)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func blob(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

func TestFetchGood(t *testing.T) {
	b := blob(3*MaxChunkBytes + 123)
	f := &fakeCtrl{blob: b, chunk: MaxChunkBytes}
	s := newStore(t, f)
	src := &nodev1.ArtifactSource{Digest: digestOf(b), SizeBytes: uint64(len(b))}
	p, err := s.Fetch(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	if !bytes.Equal(got, b) || !s.Has(src.Digest) {
		t.Fatal("fetched bytes differ")
	}
	// Cached: no second call.
	if _, err := s.Fetch(context.Background(), src); err != nil || f.calls.Load() != 1 {
		t.Fatalf("second fetch: %v, %d calls", err, f.calls.Load())
	}
	if err := s.Remove(src.Digest); err != nil || s.Has(src.Digest) {
		t.Fatalf("remove: %v", err)
	}
}

func TestFetchRefusesBadBytes(t *testing.T) {
	b := blob(100_000)
	for _, tc := range []struct {
		name string
		f    *fakeCtrl
		src  *nodev1.ArtifactSource
		want error
	}{
		{"wrong digest", &fakeCtrl{blob: b, chunk: 4096, corrupt: true}, &nodev1.ArtifactSource{Digest: digestOf(b), SizeBytes: uint64(len(b))}, ErrDigestMismatch},
		{"truncated", &fakeCtrl{blob: b, chunk: 4096, truncate: 10}, &nodev1.ArtifactSource{Digest: digestOf(b), SizeBytes: uint64(len(b))}, errTruncated},
		{"size differs", &fakeCtrl{blob: b, chunk: 4096}, &nodev1.ArtifactSource{Digest: digestOf(b), SizeBytes: uint64(len(b)) + 1}, ErrDigestMismatch},
		{"longer than the source", &fakeCtrl{blob: b, chunk: 4096}, &nodev1.ArtifactSource{Digest: digestOf(b[:50_000]), SizeBytes: 50_000}, ErrDigestMismatch},
		{"digest syntax", &fakeCtrl{blob: b, chunk: 4096}, &nodev1.ArtifactSource{Digest: "sha256:../../etc/passwd", SizeBytes: 1}, ErrInvalid},
		{"upper-case digest", &fakeCtrl{blob: b, chunk: 4096}, &nodev1.ArtifactSource{Digest: "sha256:" + string(bytes.Repeat([]byte("A"), 64)), SizeBytes: 1}, ErrInvalid},
		{"zero size", &fakeCtrl{blob: b, chunk: 4096}, &nodev1.ArtifactSource{Digest: digestOf(b), SizeBytes: 0}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.f)
			_, err := s.Fetch(context.Background(), tc.src)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if s.Has(tc.src.GetDigest()) {
				t.Fatal("refused bytes are held")
			}
			if ents, _ := os.ReadDir(s.cfg.Dir); len(ents) != 0 {
				t.Fatalf("left behind: %v", ents)
			}
		})
	}
}

func TestFetchMismatchCounted(t *testing.T) {
	b := blob(10_000)
	s := newStore(t, &fakeCtrl{blob: b, chunk: 4096, corrupt: true})
	src := &nodev1.ArtifactSource{Digest: digestOf(b), SizeBytes: uint64(len(b))}
	for i := 1; i <= 2; i++ {
		if _, err := s.Fetch(context.Background(), src); !errors.Is(err, ErrDigestMismatch) {
			t.Fatal(err)
		}
		if s.Mismatches(src.Digest) != i {
			t.Fatalf("mismatches = %d, want %d", s.Mismatches(src.Digest), i)
		}
	}
}

func TestFetchResumes(t *testing.T) {
	b := blob(200_000)
	f := &fakeCtrl{blob: b, chunk: 10_000, breakAfter: 65_000}
	s := newStore(t, f)
	src := &nodev1.ArtifactSource{Digest: digestOf(b), SizeBytes: uint64(len(b))}
	if _, err := s.Fetch(context.Background(), src); err == nil || errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("broken fetch: %v", err)
	}
	fi, err := os.Stat(s.Path(src.Digest) + ".partial")
	if err != nil || fi.Size() != 65_000 {
		t.Fatalf("partial: %v %v", fi, err)
	}
	f.breakAfter = 0
	p, err := s.Fetch(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, b) {
		t.Fatal("resumed bytes differ")
	}
	if f.offsets[1] != 65_000 {
		t.Fatalf("resumed at %d", f.offsets[1])
	}
	// A corrupt partial (bytes not of the artifact) is caught by the
	// digest at the end and deleted.
	s2 := newStore(t, &fakeCtrl{blob: b, chunk: 10_000})
	if err := os.WriteFile(s2.Path(src.Digest)+".partial", bytes.Repeat([]byte{1}, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Fetch(context.Background(), src); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("corrupt partial: %v", err)
	}
	if _, err := os.Stat(s2.Path(src.Digest) + ".partial"); !os.IsNotExist(err) {
		t.Fatal("corrupt partial kept")
	}
}

func TestConcurrentFetchesShareOne(t *testing.T) {
	b := blob(50_000)
	f := &fakeCtrl{blob: b, chunk: 4096, gate: make(chan struct{})}
	s := newStore(t, f)
	src := &nodev1.ArtifactSource{Digest: digestOf(b), SizeBytes: uint64(len(b))}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Fetch(context.Background(), src)
			errs <- err
		}()
	}
	time.Sleep(100 * time.Millisecond)
	close(f.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if f.calls.Load() != 1 {
		t.Fatalf("%d downloads, want 1", f.calls.Load())
	}
}

func TestFetchNoSpace(t *testing.T) {
	b := blob(10_000)
	s := newStore(t, &fakeCtrl{blob: b, chunk: 4096})
	s.cfg.Free = func() (uint64, error) { return 100, nil }
	if _, err := s.Fetch(context.Background(), &nodev1.ArtifactSource{Digest: digestOf(b), SizeBytes: uint64(len(b))}); !errors.Is(err, ErrNoSpace) {
		t.Fatal(err)
	}
}

// TestNewClientAsksNoCompression: a Store's client does not accept gzip,
// so ctrl sends the artifact's bytes as they are (gzip at ctrl held a
// fetch to what one core compresses), and the fetch still verifies them.
func TestNewClientAsksNoCompression(t *testing.T) {
	b := blob(2*MaxChunkBytes + 7)
	f := &fakeCtrl{blob: b, chunk: MaxChunkBytes}
	_, h := nodev1connect.NewNodeServiceHandler(f)
	var encoding atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		encoding.Store(w.Header().Get("Connect-Content-Encoding"))
	}))
	t.Cleanup(srv.Close)
	s, err := New(Config{Dir: filepath.Join(t.TempDir(), "artifacts"), Client: NewClient(srv.Client(), srv.URL)})
	if err != nil {
		t.Fatal(err)
	}
	src := &nodev1.ArtifactSource{Digest: digestOf(b), SizeBytes: uint64(len(b))}
	p, err := s.Fetch(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, b) {
		t.Fatal("fetched bytes differ")
	}
	if e, _ := encoding.Load().(string); e != "" && e != "identity" {
		t.Errorf("ctrl answered with %q", e)
	}
}

// TestFileWriter: the bytes land in order; a failed write is the error of
// a later write or of wait, and what is queued after it is dropped.
func TestFileWriter(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := newFileWriter(f, 0)
	b := blob(20 << 20)
	for off := 0; off < len(b); off += 1 << 20 {
		if err := w.write(b[off : off+1<<20]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.wait(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, b) {
		t.Fatal("written bytes differ")
	}
	ro, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	w = newFileWriter(ro, 0)
	var werr error
	for i := 0; i < 3*writeQueue && werr == nil; i++ {
		werr = w.write([]byte("x"))
		time.Sleep(time.Millisecond)
	}
	if err := w.wait(); err == nil || (werr != nil && !errors.Is(werr, err)) {
		t.Fatalf("write to a read-only file: %v, wait %v", werr, err)
	}
}
