package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/artifact"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/node/template"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// Published artifacts on the node: Template versions fetched and extracted
// at the start that needs them, the Platform new executions boot with, and
// the reclamation of both.

// platformWait bounds how long a start waits for the desired Platform
// being fetched before it boots with the guest the node has ready.
const platformWait = 2 * time.Minute

// artifacts is the node's part of Runtime that deals with artifacts.
type artifacts struct {
	store     *artifact.Store
	templates string // the template directory
	log       *slog.Logger
	// executions lists the rootfs directories executions run from.
	executions func() []string

	// guestMu: a start holds it for reading while it uses a platform's
	// sealed guest; a reclamation that closes one holds it for writing.
	guestMu sync.RWMutex

	mu sync.Mutex
	// current is the Platform new executions boot with; nil: the node's
	// own guest.
	current *platform
	// held are the verified platforms by digest (current among them).
	held map[string]*platform
	// gen counts SetPlatform calls; a preparation whose gen is not the
	// latest leaves current alone.
	gen uint64
	// ready is closed when the latest SetPlatform's preparation ended.
	ready chan struct{}
	// desired is the latest desired platform (nil: the own guest).
	desired *nodev1.DesiredPlatform
	// refused are the digests of Platform versions whose guest failed the
	// protocol handshake of a start here (refuse); SetPlatform does not
	// bring them back. Kept in memory only: a restarted node tries such a
	// version once more.
	refused map[string]bool
	// reclaiming are digests to reclaim once no execution uses them.
	reclaiming map[string]bool
	// installing serializes the fetch and extraction of one template
	// version (by "id/version").
	installing map[string]*sync.Mutex
	// changed, when set, is called after what the node holds changed: a
	// template version installed or reclaimed, a platform verified or
	// reclaimed (agent.InventoryNotifier).
	changed func()
}

// platform is a verified Platform version, sealed in memory.
type platform struct {
	id, version, digest string
	guest               *os.File
}

func newArtifacts(store *artifact.Store, templates string, log *slog.Logger, executions func() []string) *artifacts {
	ready := make(chan struct{})
	close(ready)
	return &artifacts{store: store, templates: templates, log: log, executions: executions,
		held: map[string]*platform{}, ready: ready, refused: map[string]bool{}, reclaiming: map[string]bool{}, installing: map[string]*sync.Mutex{}}
}

// templateDir returns the rootfs of a published template version, fetched
// and extracted first when the node lacks it. Errors that no retry can fix
// (a malformed source, a hostile archive, a digest that mismatched twice)
// are agent.Permanent.
func (a *artifacts) templateDir(ctx context.Context, id, version string, src *nodev1.ArtifactSource) (string, error) {
	if err := template.CheckName(id); err != nil {
		return "", agent.Permanent(err)
	}
	if err := template.CheckName(version); err != nil {
		return "", agent.Permanent(err)
	}
	rootfs := template.Path(a.templates, id, version)
	if fi, err := os.Stat(rootfs); err == nil && fi.IsDir() {
		return rootfs, nil
	}
	// One fetch and extraction per version at a time; the others find
	// it installed.
	a.mu.Lock()
	l := a.installing[id+"/"+version]
	if l == nil {
		l = &sync.Mutex{}
		a.installing[id+"/"+version] = l
	}
	a.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	if fi, err := os.Stat(rootfs); err == nil && fi.IsDir() {
		return rootfs, nil
	}
	if src == nil || a.store == nil {
		return "", agent.Permanent(fmt.Errorf("template %s version %s is not on this node and ctrl sent no source", id, version))
	}
	var f template.Format
	switch src.GetFormat() {
	case ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR:
		f = template.FormatTar
	case ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR_GZIP:
		f = template.FormatTarGzip
	default:
		return "", agent.Permanent(fmt.Errorf("template %s version %s: format %s is not a template archive", id, version, src.GetFormat()))
	}
	a.log.Info("fetching template", "template_id", id, "version", version, "digest", src.GetDigest(), "size_bytes", src.GetSizeBytes())
	t0 := time.Now()
	path, err := a.fetch(ctx, src)
	if err != nil {
		return "", fmt.Errorf("template %s version %s: %w", id, version, err)
	}
	fetched := time.Since(t0)
	free, err := freeBytes(a.templates)
	if err != nil {
		return "", err
	}
	rootfs, err = template.Install(a.templates, id, version, src.GetDigest(), path, f, template.Limits{MaxBytes: free})
	if errors.Is(err, template.ErrHostileArchive) {
		return "", agent.Permanent(err)
	}
	if err != nil {
		return "", err
	}
	a.log.Info("template installed", "template_id", id, "version", version, "digest", src.GetDigest(), "took", time.Since(t0).String(),
		"fetch_took", fetched.String(), "extract_took", (time.Since(t0) - fetched).String())
	a.inventoryChanged()
	// The archive is not needed once extracted.
	_ = a.store.Remove(src.GetDigest())
	return rootfs, nil
}

// fetch fetches src; a digest that mismatched twice, or a malformed
// source, is permanent.
func (a *artifacts) fetch(ctx context.Context, src *nodev1.ArtifactSource) (string, error) {
	path, err := a.store.Fetch(ctx, src)
	switch {
	case errors.Is(err, artifact.ErrInvalid):
		return "", agent.Permanent(err)
	case errors.Is(err, artifact.ErrDigestMismatch) && a.store.Mismatches(src.GetDigest()) >= 2:
		return "", agent.Permanent(fmt.Errorf("%w (again)", err))
	}
	return path, err
}

func freeBytes(dir string) (uint64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// guest returns the platform new executions boot with (nil: the node's
// own guest), waiting (at most platformWait, or ctx) for the desired
// Platform's preparation; release ends the use of its sealed guest.
func (a *artifacts) guest(ctx context.Context) (p *platform, release func()) {
	a.mu.Lock()
	ready := a.ready
	a.mu.Unlock()
	t := time.NewTimer(platformWait)
	defer t.Stop()
	select {
	case <-ready:
	case <-t.C:
	case <-ctx.Done():
	}
	a.guestMu.RLock()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.current, a.guestMu.RUnlock
}

// boot runs start with the guest new executions boot with (nil: the
// node's own). When a Platform's guest fails the protocol handshake
// (sandbox.ErrGuestProtocol), the platform is refused and start runs once
// more with the node's own guest, whose error is the start's.
func (a *artifacts) boot(ctx context.Context, start func(guest *os.File) error) error {
	p, release := a.guest(ctx)
	if p == nil {
		defer release()
		return start(nil)
	}
	err := start(p.guest)
	release()
	if !errors.Is(err, sandbox.ErrGuestProtocol) {
		return err
	}
	a.refuse(p, err)
	return start(nil)
}

// refuse stops booting p, whose guest failed the handshake with err: it
// is dropped from what the node holds (and its cached binary deleted) and
// its digest remembered, so that new executions boot with the node's own
// guest until ctrl desires another version or digest.
func (a *artifacts) refuse(p *platform, err error) {
	a.mu.Lock()
	if a.refused[p.digest] {
		a.mu.Unlock()
		return // a concurrent start refused it already
	}
	a.refused[p.digest] = true
	if a.current == p {
		a.current = nil
	}
	held := a.held[p.digest] == p
	if held {
		delete(a.held, p.digest)
	}
	a.mu.Unlock()
	a.log.Warn("platform refused: its guest failed the protocol handshake; new executions boot with the node's own guest",
		"platform_id", p.id, "version", p.version, "digest", p.digest, "error", err.Error())
	if !held {
		return
	}
	a.guestMu.Lock() // no start uses it
	p.guest.Close()
	a.guestMu.Unlock()
	if a.store != nil {
		_ = a.store.Remove(p.digest)
	}
	a.inventoryChanged()
}

// SetPlatform makes p the Platform new executions boot with, once fetched
// and verified (in the background, retried until it succeeds or another
// platform is desired); nil is the node's own guest.
func (a *artifacts) SetPlatform(p *nodev1.DesiredPlatform) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if sameDesired(a.desired, p) {
		return
	}
	a.desired = p
	a.gen++
	gen := a.gen
	if p == nil {
		a.current = nil
		return
	}
	if a.refused[p.GetSource().GetDigest()] {
		a.current = nil
		a.log.Warn("platform refused earlier (its guest failed the protocol handshake): new executions boot with the node's own guest",
			"platform_id", p.GetPlatformId(), "version", p.GetVersion(), "digest", p.GetSource().GetDigest())
		return
	}
	if h := a.held[p.GetSource().GetDigest()]; h != nil {
		a.current = h
		return
	}
	ready := make(chan struct{})
	a.ready = ready
	go a.prepare(gen, p, ready)
}

func sameDesired(a, b *nodev1.DesiredPlatform) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.GetPlatformId() == b.GetPlatformId() && a.GetVersion() == b.GetVersion() && a.GetSource().GetDigest() == b.GetSource().GetDigest()
}

// prepare fetches and verifies p, retrying what may pass, and makes it
// current if it is still desired. A platform that cannot be used leaves
// the node on its own guest.
func (a *artifacts) prepare(gen uint64, p *nodev1.DesiredPlatform, ready chan struct{}) {
	var once sync.Once
	release := func() { once.Do(func() { close(ready) }) }
	defer release()
	log := a.log.With("platform_id", p.GetPlatformId(), "version", p.GetVersion(), "digest", p.GetSource().GetDigest())
	stale := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.gen != gen
	}
	backoff := time.Second
	for attempt := 0; ; attempt++ {
		if stale() {
			return
		}
		pl, err := a.loadPlatform(p)
		if err == nil {
			a.mu.Lock()
			a.held[pl.digest] = pl
			if a.gen == gen {
				a.current = pl
			}
			a.mu.Unlock()
			a.inventoryChanged()
			log.Info("platform ready: new executions boot with it")
			return
		}
		if errors.Is(err, agent.ErrPermanent) {
			a.mu.Lock()
			if a.gen == gen {
				a.current = nil
			}
			a.mu.Unlock()
			log.Error("platform refused: new executions boot with the node's own guest", "error", err.Error())
			return
		}
		log.Warn("platform fetch failed; retrying", "error", err.Error(), "attempt", attempt+1)
		// A start that waits is not held up by retries.
		release()
		time.Sleep(backoff)
		backoff = min(backoff*2, time.Minute)
	}
}

// loadPlatform fetches, checks and seals a platform. Its errors are
// agent.Permanent when no retry can fix them.
func (a *artifacts) loadPlatform(p *nodev1.DesiredPlatform) (*platform, error) {
	if err := template.CheckName(p.GetPlatformId()); err != nil {
		return nil, agent.Permanent(err)
	}
	if err := template.CheckName(p.GetVersion()); err != nil {
		return nil, agent.Permanent(err)
	}
	if p.GetProtocolVersion() != nodewire.GuestProtocolVersion {
		return nil, agent.Permanent(fmt.Errorf("the platform speaks guest protocol %d, the node %d", p.GetProtocolVersion(), nodewire.GuestProtocolVersion))
	}
	if p.GetSource().GetFormat() != ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF {
		return nil, agent.Permanent(fmt.Errorf("the platform's format is %s, not ELF", p.GetSource().GetFormat()))
	}
	if p.GetSource().GetSizeBytes() > maxGuestBytes {
		return nil, agent.Permanent(fmt.Errorf("the platform is %d bytes (at most %d)", p.GetSource().GetSizeBytes(), maxGuestBytes))
	}
	if a.store == nil {
		return nil, agent.Permanent(errors.New("the node has no artifact store"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	path, err := a.fetch(ctx, p.GetSource())
	if err != nil {
		return nil, err
	}
	return checkPlatform(p, path)
}

// maxGuestBytes bounds a Platform's binary (the guest is ~10 MiB).
const maxGuestBytes = 256 << 20

// checkPlatform verifies the fetched binary at path (again: its digest,
// then a static ELF declaring the node's guest protocol version) and seals
// it in memory. Its errors are permanent.
func checkPlatform(p *nodev1.DesiredPlatform, path string) (*platform, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	if artifact.DigestPrefix+hex.EncodeToString(sum[:]) != p.GetSource().GetDigest() {
		return nil, agent.Permanent(fmt.Errorf("%w: the cached platform", artifact.ErrDigestMismatch))
	}
	if err := sandbox.CheckGuestBinary(path); err != nil {
		return nil, agent.Permanent(err)
	}
	v, ok := nodewire.GuestProtocolOf(b)
	if !ok || v != nodewire.GuestProtocolVersion {
		return nil, agent.Permanent(fmt.Errorf("the platform binary declares guest protocol %d (declared: %v), the node speaks %d", v, ok, nodewire.GuestProtocolVersion))
	}
	f, err := sandbox.SealGuest(path)
	if err != nil {
		return nil, err
	}
	return &platform{id: p.GetPlatformId(), version: p.GetVersion(), digest: p.GetSource().GetDigest(), guest: f}, nil
}

// Platforms lists the verified Platform versions the node holds.
func (a *artifacts) Platforms() []*nodev1.TemplateInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*nodev1.TemplateInfo, 0, len(a.held))
	for _, p := range a.held {
		out = append(out, &nodev1.TemplateInfo{TemplateId: p.id, Version: p.version, Digest: p.digest})
	}
	return out
}

// Reclaim deletes what the node holds of these digests: cached files,
// extracted template versions no execution runs from (the others when
// their executions are gone: retried by reclaimPending), platforms other
// than the current one.
func (a *artifacts) Reclaim(digests []string) {
	a.mu.Lock()
	for _, d := range digests {
		if _, err := artifact.ParseDigest(d); err == nil {
			a.reclaiming[d] = true
		}
	}
	a.mu.Unlock()
	go a.reclaimPending()
}

// reclaimPending reclaims what Reclaim asked for that no execution uses
// any more.
func (a *artifacts) reclaimPending() {
	a.mu.Lock()
	var digests []string
	for d := range a.reclaiming {
		digests = append(digests, d)
	}
	a.mu.Unlock()
	if len(digests) == 0 {
		return
	}
	inUse := map[string]bool{}
	for _, dir := range a.executions() {
		inUse[dir] = true
	}
	published, err := template.Published(a.templates)
	if err != nil {
		a.log.Warn("list published templates", "error", err.Error())
		return
	}
	for _, d := range digests {
		done := true
		for _, t := range published {
			if t.Digest != d {
				continue
			}
			if inUse[t.Rootfs] {
				done = false
				continue
			}
			if err := template.Remove(a.templates, t.Name, t.Version); err != nil {
				a.log.Warn("reclaim template version", "template_id", t.Name, "version", t.Version, "error", err.Error())
				done = false
				continue
			}
			a.log.Info("template version reclaimed", "template_id", t.Name, "version", t.Version, "digest", d)
			a.inventoryChanged()
		}
		a.mu.Lock()
		if p := a.held[d]; p != nil && p != a.current {
			delete(a.held, d)
			a.mu.Unlock()
			a.guestMu.Lock() // no start uses it
			p.guest.Close()
			a.guestMu.Unlock()
			a.log.Info("platform version reclaimed", "platform_id", p.id, "version", p.version, "digest", d)
			a.inventoryChanged()
			a.mu.Lock()
		} else if p != nil {
			done = false // the current platform: kept until another is desired
		}
		a.mu.Unlock()
		if a.store != nil {
			if err := a.store.Remove(d); err != nil {
				done = false
			}
		}
		if done {
			a.mu.Lock()
			delete(a.reclaiming, d)
			a.mu.Unlock()
		}
	}
}

// inventoryChanged calls changed, when set.
func (a *artifacts) inventoryChanged() {
	if a.changed != nil {
		a.changed()
	}
}

// runReclaimer retries pending reclamations until ctx is done.
func (a *artifacts) runReclaimer(ctx context.Context) {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.reclaimPending()
		}
	}
}
