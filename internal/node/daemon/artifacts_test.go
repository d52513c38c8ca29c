package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/artifact"
	"github.com/kibotos/kibotos/internal/node/template"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// blobCtrl serves FetchArtifact from blobs by digest; corrupt digests get
// other bytes.
type blobCtrl struct {
	nodev1connect.UnimplementedNodeServiceHandler
	mu      sync.Mutex
	blobs   map[string][]byte
	corrupt map[string]bool
}

func (c *blobCtrl) put(b []byte) string {
	s := sha256.Sum256(b)
	d := artifact.DigestPrefix + hex.EncodeToString(s[:])
	c.mu.Lock()
	c.blobs[d] = b
	c.mu.Unlock()
	return d
}

func (c *blobCtrl) FetchArtifact(_ context.Context, req *connect.Request[nodev1.FetchArtifactRequest], st *connect.ServerStream[nodev1.FetchArtifactResponse]) error {
	c.mu.Lock()
	b, ok := c.blobs[req.Msg.GetDigest()]
	bad := c.corrupt[req.Msg.GetDigest()]
	c.mu.Unlock()
	if !ok {
		return connect.NewError(connect.CodeNotFound, errors.New("no such artifact"))
	}
	if bad {
		b = append([]byte(nil), b...)
		b[0] ^= 1
	}
	for off := int(req.Msg.GetOffset()); off < len(b); off += artifact.MaxChunkBytes {
		if err := st.Send(&nodev1.FetchArtifactResponse{SizeBytes: uint64(len(b)), Data: b[off:min(off+artifact.MaxChunkBytes, len(b))]}); err != nil {
			return err
		}
	}
	return nil
}

// inUseMu guards the tests' lists of rootfs directories in use.
var inUseMu sync.Mutex

func setInUse(p *[]string, v []string) {
	inUseMu.Lock()
	*p = v
	inUseMu.Unlock()
}

func newTestArtifacts(t *testing.T, inUse *[]string) (*artifacts, *blobCtrl) {
	t.Helper()
	c := &blobCtrl{blobs: map[string][]byte{}, corrupt: map[string]bool{}}
	_, h := nodev1connect.NewNodeServiceHandler(c)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	store, err := artifact.New(artifact.Config{Dir: filepath.Join(dir, "artifacts"), Client: nodev1connect.NewNodeServiceClient(srv.Client(), srv.URL)})
	if err != nil {
		t.Fatal(err)
	}
	return newArtifacts(store, filepath.Join(dir, "templates"), slog.New(slog.NewTextHandler(testWriter{t}, nil)), func() []string {
		inUseMu.Lock()
		defer inUseMu.Unlock()
		return append([]string(nil), *inUse...)
	}), c
}

func rootfsTar(t *testing.T, extra ...*tar.Header) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hs := append([]*tar.Header{{Name: "etc/os-release", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10}}, extra...)
	for _, h := range hs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("ID=debian\n")[:h.Size])
		}
	}
	tw.Close()
	return buf.Bytes()
}

func TestStartFetchesAPublishedTemplate(t *testing.T) {
	var inUse []string
	a, c := newTestArtifacts(t, &inUse)
	good := rootfsTar(t)
	src := &nodev1.ArtifactSource{Digest: c.put(good), SizeBytes: uint64(len(good)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR}
	ctx := context.Background()
	rootfs, err := a.templateDir(ctx, "debian", "1", src)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(rootfs, "etc/os-release")); string(b) != "ID=debian\n" {
		t.Fatalf("extracted %q", b)
	}
	if a.store.Has(src.Digest) {
		t.Error("the archive is kept after extraction")
	}
	// Held now: no source needed.
	if again, err := a.templateDir(ctx, "debian", "1", nil); err != nil || again != rootfs {
		t.Fatalf("second start: %q %v", again, err)
	}
	pub, _ := template.Published(a.templates)
	if len(pub) != 1 || pub[0].Digest != src.Digest {
		t.Fatalf("published: %+v", pub)
	}

	// Reclaimed while an execution runs from it: kept until it is gone.
	setInUse(&inUse, []string{rootfs})
	a.Reclaim([]string{src.Digest, "sha256:not-a-digest"})
	time.Sleep(100 * time.Millisecond)
	if _, err := os.Stat(rootfs); err != nil {
		t.Fatalf("reclaimed under a running execution: %v", err)
	}
	setInUse(&inUse, nil)
	a.reclaimPending()
	if _, err := os.Stat(rootfs); !os.IsNotExist(err) {
		t.Fatalf("not reclaimed: %v", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.reclaiming) != 0 {
		t.Fatalf("still pending: %v", a.reclaiming)
	}
}

func TestStartRefusesBadTemplates(t *testing.T) {
	var inUse []string
	a, c := newTestArtifacts(t, &inUse)
	ctx := context.Background()
	good := rootfsTar(t)
	hostile := rootfsTar(t, &tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644})
	corrupt := rootfsTar(t, &tar.Header{Name: "etc/x", Typeflag: tar.TypeReg, Mode: 0o644})
	dCorrupt := c.put(corrupt)
	c.corrupt[dCorrupt] = true
	tarSrc := func(b []byte, d string) *nodev1.ArtifactSource {
		return &nodev1.ArtifactSource{Digest: d, SizeBytes: uint64(len(b)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR}
	}
	for _, tc := range []struct {
		name, id, version string
		src               *nodev1.ArtifactSource
		permanent         bool
	}{
		{"no source", "debian", "1", nil, true},
		{"bad id", "../etc", "1", tarSrc(good, c.put(good)), true},
		{"bad version", "debian", "a/b", tarSrc(good, c.put(good)), true},
		{"ELF as a template", "debian", "1", &nodev1.ArtifactSource{Digest: c.put(good), SizeBytes: uint64(len(good)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF}, true},
		{"hostile archive", "debian", "2", tarSrc(hostile, c.put(hostile)), true},
		{"digest mismatch", "debian", "3", tarSrc(corrupt, dCorrupt), false},
		{"digest mismatch again", "debian", "3", tarSrc(corrupt, dCorrupt), true},
		{"unknown to ctrl", "debian", "4", tarSrc(good, "sha256:"+hex.EncodeToString(make([]byte, 32))), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.templateDir(ctx, tc.id, tc.version, tc.src)
			if err == nil {
				t.Fatal("accepted")
			}
			if errors.Is(err, agent.ErrPermanent) != tc.permanent {
				t.Fatalf("permanent = %v, want %v: %v", errors.Is(err, agent.ErrPermanent), tc.permanent, err)
			}
			t.Log(err)
		})
	}
	if pub, _ := template.Published(a.templates); len(pub) != 0 {
		t.Fatalf("installed: %+v", pub)
	}
}

// A Platform is booted only when it is a static ELF declaring the node's
// guest protocol version, with the digest it was fetched by.
func TestPlatformChecks(t *testing.T) {
	busybox := staticStandIn(t)
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := os.ReadFile("/bin/ls")
	if err != nil {
		t.Skip("needs a dynamic executable: /bin/ls")
	}
	good := append(append([]byte(nil), bb...), nodewire.GuestProtocolDeclaration...)
	for _, tc := range []struct {
		name string
		bin  []byte
		ok   bool
	}{
		{"static guest declaring the version", good, true},
		{"no declaration", bb, false},
		{"another version", append(append([]byte(nil), bb...), nodewire.GuestProtocolMarker+"2;"...), false},
		{"dynamic", append(append([]byte(nil), dyn...), nodewire.GuestProtocolDeclaration...), false},
		{"not an ELF", []byte("#!/bin/sh\n" + nodewire.GuestProtocolDeclaration), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var inUse []string
			a, c := newTestArtifacts(t, &inUse)
			p := &nodev1.DesiredPlatform{PlatformId: "sandbox", Version: "7", ProtocolVersion: nodewire.GuestProtocolVersion,
				Source: &nodev1.ArtifactSource{Digest: c.put(tc.bin), SizeBytes: uint64(len(tc.bin)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF}}
			a.SetPlatform(p)
			g, release := a.guest(context.Background())
			release()
			if (g != nil) != tc.ok {
				t.Fatalf("platform used = %v, want %v", g != nil, tc.ok)
			}
			if got := a.Platforms(); (len(got) == 1) != tc.ok {
				t.Fatalf("platforms %v", got)
			}
			if !tc.ok {
				return
			}
			// Back to the node's own guest, then the old one is reclaimed.
			a.SetPlatform(nil)
			if g, release := a.guest(context.Background()); g != nil {
				t.Fatal("still booting the platform")
			} else {
				release()
			}
			a.Reclaim([]string{p.Source.Digest})
			deadline := time.Now().Add(5 * time.Second)
			for len(a.Platforms()) != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if len(a.Platforms()) != 0 || a.store.Has(p.Source.Digest) {
				t.Fatal("platform not reclaimed")
			}
		})
	}
	t.Run("protocol version in the desired state", func(t *testing.T) {
		var inUse []string
		a, c := newTestArtifacts(t, &inUse)
		a.SetPlatform(&nodev1.DesiredPlatform{PlatformId: "sandbox", Version: "8", ProtocolVersion: nodewire.GuestProtocolVersion + 1,
			Source: &nodev1.ArtifactSource{Digest: c.put(good), SizeBytes: uint64(len(good)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF}})
		if g, release := a.guest(context.Background()); g != nil {
			t.Fatal("platform of another protocol used")
		} else {
			release()
		}
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(bytes.TrimSpace(b)))
	return len(b), nil
}

// Concurrent starts of one version fetch and extract it once.
func TestConcurrentStartsShareOneInstall(t *testing.T) {
	var inUse []string
	a, c := newTestArtifacts(t, &inUse)
	good := rootfsTar(t)
	src := &nodev1.ArtifactSource{Digest: c.put(good), SizeBytes: uint64(len(good)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := a.templateDir(context.Background(), "debian", "5", src)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
