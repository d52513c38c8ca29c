// Package artifact is the node's store of published artifacts (Template
// archives and Platform binaries): it fetches a version from ctrl by digest
// (NodeService.FetchArtifact), resumes a broken fetch from what it has,
// hashes the bytes as it writes them and keeps them, named by their digest,
// only once their SHA-256 and size match the source. Bytes that do not
// match are deleted and never handed out.
//
// Layout under Dir:
//
//	<64 hex digits>           a verified artifact (read-only)
//	<64 hex digits>.partial   a fetch under way or broken off (resumed)
//
// No name in Dir comes from the wire but through ParseDigest, which
// accepts only "sha256:" and 64 lowercase hex digits.
package artifact

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
)

// DigestPrefix begins every digest.
const DigestPrefix = "sha256:"

// MaxChunkBytes bounds the data of one FetchArtifact message.
const MaxChunkBytes = 1 << 20

// MaxArtifactBytes bounds any artifact the node fetches (64 GiB).
const MaxArtifactBytes = 64 << 30

// DefaultIdleTimeout ends a fetch whose stream brings nothing for this long.
const DefaultIdleTimeout = 60 * time.Second

// ErrDigestMismatch: the bytes fetched do not have the digest they were
// fetched by (the partial file is deleted). Test with errors.Is.
var ErrDigestMismatch = errors.New("artifact: the bytes do not match their digest")

// ErrInvalid: the source is malformed (digest syntax, size, format).
var ErrInvalid = errors.New("artifact: invalid source")

// ErrNoSpace: the pool has no room for the artifact.
var ErrNoSpace = errors.New("artifact: not enough free space")

// ParseDigest returns the 64 hex digits of a digest "sha256:<64 lowercase
// hex digits>"; anything else is ErrInvalid.
func ParseDigest(d string) (string, error) {
	h, ok := strings.CutPrefix(d, DigestPrefix)
	if !ok || len(h) != 64 {
		return "", fmt.Errorf("%w: digest %q is not sha256: and 64 hex digits", ErrInvalid, cut(d))
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", fmt.Errorf("%w: digest %q is not sha256: and 64 lowercase hex digits", ErrInvalid, cut(d))
		}
	}
	return h, nil
}

// cut bounds a hostile string quoted in an error.
func cut(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Config configures a Store.
type Config struct {
	// Dir is where the artifacts are (made when missing).
	Dir string
	// Client reaches ctrl's NodeService with the node's certificate; build
	// it with NewClient.
	Client nodev1connect.NodeServiceClient
	// IdleTimeout ends a fetch whose stream brings nothing for so long;
	// zero is DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Free returns the free bytes of Dir's pool; nil is statfs of Dir.
	Free func() (uint64, error)
}

// NewClient returns the NodeService client a Store fetches with: the
// options given plus no compression of the responses. A template archive
// is either compressed already (tar.gz) or not worth ctrl's CPU: gzip at
// ctrl bounds a fetch to what one core compresses (about 40 MiB/s of
// incompressible bytes, measured in bench/templates), well under what the
// wire and the disk carry.
func NewClient(hc connect.HTTPClient, endpoint string, opts ...connect.ClientOption) nodev1connect.NodeServiceClient {
	opts = append(opts[:len(opts):len(opts)], connect.WithAcceptCompression("gzip", nil, nil))
	return nodev1connect.NewNodeServiceClient(hc, endpoint, opts...)
}

// Store fetches and keeps artifacts. Its methods are safe for concurrent
// use; concurrent fetches of one digest share one download.
type Store struct {
	cfg Config

	mu         sync.Mutex
	inflight   map[string]*call
	mismatches map[string]int
}

type call struct {
	done chan struct{}
	path string
	err  error
}

// New returns a Store over cfg.Dir.
func New(cfg Config) (*Store, error) {
	if cfg.Dir == "" || cfg.Client == nil {
		return nil, errors.New("artifact: Config.Dir and Config.Client are required")
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Free == nil {
		dir := cfg.Dir
		cfg.Free = func() (uint64, error) {
			var st syscall.Statfs_t
			if err := syscall.Statfs(dir, &st); err != nil {
				return 0, err
			}
			return st.Bavail * uint64(st.Bsize), nil
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("artifact: %w", err)
	}
	return &Store{cfg: cfg, inflight: map[string]*call{}, mismatches: map[string]int{}}, nil
}

// Path returns where the verified artifact of digest is (whether or not
// it is there); "" for a malformed digest.
func (s *Store) Path(digest string) string {
	h, err := ParseDigest(digest)
	if err != nil {
		return ""
	}
	return filepath.Join(s.cfg.Dir, h)
}

// Has reports whether the verified artifact of digest is in the store.
func (s *Store) Has(digest string) bool {
	p := s.Path(digest)
	if p == "" {
		return false
	}
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode().IsRegular()
}

// Mismatches returns how many fetches of digest ended in ErrDigestMismatch
// since the store was made.
func (s *Store) Mismatches(digest string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mismatches[digest]
}

// Remove deletes the artifact of digest and any partial fetch of it (none
// is not an error).
func (s *Store) Remove(digest string) error {
	p := s.Path(digest)
	if p == "" {
		return fmt.Errorf("%w: digest", ErrInvalid)
	}
	var errs []error
	for _, e := range []error{os.Remove(p), os.Remove(p + ".partial")} {
		if e != nil && !errors.Is(e, os.ErrNotExist) {
			errs = append(errs, e)
		}
	}
	return errors.Join(errs...)
}

// Fetch returns the path of the verified artifact src names, fetching it
// from ctrl first when the store does not hold it: from where a previous
// fetch broke off, hashing every byte. Bytes whose digest or size does
// not match src are deleted (ErrDigestMismatch); a fetch that broke off
// keeps its partial file for the next. Concurrent calls for one digest
// share one download; ctx ends only this caller's wait.
func (s *Store) Fetch(ctx context.Context, src *nodev1.ArtifactSource) (string, error) {
	h, err := ParseDigest(src.GetDigest())
	if err != nil {
		return "", err
	}
	if src.GetSizeBytes() == 0 || src.GetSizeBytes() > MaxArtifactBytes {
		return "", fmt.Errorf("%w: size %d (1 byte to %d)", ErrInvalid, src.GetSizeBytes(), uint64(MaxArtifactBytes))
	}
	if s.Has(src.GetDigest()) {
		return s.Path(src.GetDigest()), nil
	}
	s.mu.Lock()
	c := s.inflight[h]
	if c == nil {
		c = &call{done: make(chan struct{})}
		s.inflight[h] = c
		go func() {
			c.path, c.err = s.download(h, src.GetSizeBytes())
			s.mu.Lock()
			delete(s.inflight, h)
			if errors.Is(c.err, ErrDigestMismatch) {
				s.mismatches[src.GetDigest()]++
			}
			s.mu.Unlock()
			close(c.done)
		}()
	}
	s.mu.Unlock()
	select {
	case <-c.done:
		return c.path, c.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// download fetches the artifact of hex digest h and size bytes into
// h.partial, from its length on, and renames it to h once it matches.
func (s *Store) download(h string, size uint64) (string, error) {
	final := filepath.Join(s.cfg.Dir, h)
	partial := final + ".partial"
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", fmt.Errorf("artifact: %w", err)
	}
	defer f.Close()
	sum := sha256.New()
	have, err := rehash(f, sum)
	if err != nil {
		return "", err
	}
	if have > size {
		// More than the artifact's size: not ours to resume.
		if err := f.Truncate(0); err != nil {
			return "", fmt.Errorf("artifact: %w", err)
		}
		have, sum = 0, sha256.New()
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return "", fmt.Errorf("artifact: %w", err)
		}
	}
	if free, err := s.cfg.Free(); err == nil && size-have > free {
		return "", fmt.Errorf("%w: %d bytes to fetch, %d free", ErrNoSpace, size-have, free)
	}
	if have < size {
		if err := s.stream(f, sum, h, have, size); err != nil {
			if errors.Is(err, ErrDigestMismatch) || errors.Is(err, errTruncated) {
				_ = os.Remove(partial)
			}
			return "", err
		}
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != h {
		_ = os.Remove(partial)
		return "", fmt.Errorf("%w: fetched as sha256:%s, the bytes are sha256:%s", ErrDigestMismatch, h, got)
	}
	if err := f.Sync(); err != nil {
		return "", fmt.Errorf("artifact: %w", err)
	}
	if err := f.Chmod(0o400); err != nil {
		return "", fmt.Errorf("artifact: %w", err)
	}
	if err := os.Rename(partial, final); err != nil {
		return "", fmt.Errorf("artifact: %w", err)
	}
	return final, nil
}

// rehash hashes what f holds and leaves its offset at its end.
func rehash(f *os.File, sum hash.Hash) (uint64, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, fmt.Errorf("artifact: %w", err)
	}
	n, err := io.Copy(sum, f)
	if err != nil {
		return 0, fmt.Errorf("artifact: read the partial fetch: %w", err)
	}
	return uint64(n), nil
}

// errTruncated: the stream ended, without error, before the artifact's
// size. Those bytes are not trusted to be a prefix worth resuming.
var errTruncated = errors.New("artifact: the fetch ended early (truncated)")

// stream appends the bytes from offset have to f and sum. A stream that
// sends more than size, or a size other than size, is ErrDigestMismatch
// (those bytes are not the artifact) and one that ends without error
// before size errTruncated (the partial file is deleted for both); one
// that breaks off with an error keeps what it wrote, and the next fetch
// resumes from there.
func (s *Store) stream(f *os.File, sum hash.Hash, h string, have, size uint64) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	idle := time.AfterFunc(s.cfg.IdleTimeout, cancel)
	defer idle.Stop()
	st, err := s.cfg.Client.FetchArtifact(ctx, connect.NewRequest(&nodev1.FetchArtifactRequest{Digest: DigestPrefix + h, Offset: have}))
	if err != nil {
		return fmt.Errorf("artifact: fetch: %w", err)
	}
	defer st.Close()
	// The bytes are written to f by another goroutine, so that the file's
	// writes overlap the next message's receipt and hashing; what f holds
	// when the fetch breaks off is rehashed by the next one anyway.
	w := newFileWriter(f, int64(have))
	defer w.wait()
	for have < size && st.Receive() {
		idle.Reset(s.cfg.IdleTimeout)
		msg := st.Msg()
		if msg.GetSizeBytes() != size {
			return fmt.Errorf("%w: ctrl sends %d bytes, the source says %d", ErrDigestMismatch, msg.GetSizeBytes(), size)
		}
		d := msg.GetData()
		if len(d) > MaxChunkBytes {
			return fmt.Errorf("artifact: fetch: a message of %d bytes (at most %d)", len(d), MaxChunkBytes)
		}
		if uint64(len(d)) > size-have {
			return fmt.Errorf("%w: ctrl sends more than the %d bytes of the source", ErrDigestMismatch, size)
		}
		sum.Write(d)
		if err := w.write(d); err != nil {
			return fmt.Errorf("artifact: write: %w", err)
		}
		have += uint64(len(d))
	}
	if err := w.wait(); err != nil {
		return fmt.Errorf("artifact: write: %w", err)
	}
	if err := st.Err(); err != nil {
		return fmt.Errorf("artifact: fetch broke off at %d of %d bytes: %w", have, size, err)
	}
	if have < size {
		return fmt.Errorf("%w at %d of %d bytes", errTruncated, have, size)
	}
	return nil
}

// fileWriter appends to a file from its own goroutine, in order, and
// starts the write-back of every writeBackBytes written (so the fsync
// before the rename finds little left to write).
type fileWriter struct {
	f     *os.File
	queue chan []byte
	done  chan struct{}
	err   error // set before done is closed
	once  sync.Once
}

// writeQueue bounds the messages received but not yet written.
const writeQueue = 4

// writeBackBytes is how often the write-back of written bytes is started.
const writeBackBytes = 8 << 20

func newFileWriter(f *os.File, off int64) *fileWriter {
	w := &fileWriter{f: f, queue: make(chan []byte, writeQueue), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		started := off
		for d := range w.queue {
			if w.err != nil {
				continue // drain
			}
			n, err := f.Write(d)
			off += int64(n)
			if err != nil {
				w.err = err
				continue
			}
			if off-started >= writeBackBytes {
				startWriteBack(f, started, off-started)
				started = off
			}
		}
	}()
	return w
}

// write queues d (which the caller no longer changes); an error is the
// first one of an earlier write.
func (w *fileWriter) write(d []byte) error {
	select {
	case <-w.done:
		return w.err
	default:
	}
	select {
	case w.queue <- d:
		return nil
	case <-w.done:
		return w.err
	}
}

// wait writes what is queued and returns the first error.
func (w *fileWriter) wait() error {
	w.once.Do(func() { close(w.queue) })
	<-w.done
	return w.err
}
