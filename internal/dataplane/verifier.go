package dataplane

import (
	"context"
	"crypto/ed25519"
	"errors"
	"sync"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// DefaultMaxStale is how long the Verifier trusts a cached generation that
// no notification has invalidated: the revocation latency when a
// notification is lost (a revoke committed on another replica reaches this
// one through PostgreSQL's LISTEN/NOTIFY within milliseconds, as a hint).
const DefaultMaxStale = time.Second

// DefaultCacheSize bounds the Workspaces whose generation is cached.
const DefaultCacheSize = 4096

// Verifier checks presented tokens: the signature and expiry locally, the
// Workspace and scope against the request, and the generation against a
// per-Workspace cache. A cached generation is re-read from the store when
// the Workspace's topic (store.WorkspaceTopic) is notified — a revocation
// on this replica is seen by the next Verify after its commit, one on
// another replica as soon as its notification arrives — and at the
// latest MaxStale after it was read, which bounds the latency of a
// revocation whose notification is lost.
//
// Each cached Workspace holds one subscription of the Notifier (at most
// CacheSize, the entry read longest ago evicted first); Close releases them.
type Verifier struct {
	// Key is the public key tokens are signed for.
	Key ed25519.PublicKey
	// Store is read for generations and notifies their changes.
	Store store.Store
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// MaxStale: DefaultMaxStale when zero.
	MaxStale time.Duration
	// CacheSize: DefaultCacheSize when zero.
	CacheSize int

	mu    sync.Mutex
	cache map[string]*entry
}

// entry is the cached state of one Workspace.
type entry struct {
	generation uint64
	gone       bool // deleting or deleted: no token is accepted
	readAt     time.Time
	changed    <-chan struct{}
	release    func()
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

func (v *Verifier) maxStale() time.Duration {
	if v.MaxStale > 0 {
		return v.MaxStale
	}
	return DefaultMaxStale
}

// Refusals. Each is a fault, so the data plane answers with the API's one
// error mapping; none names the token.
func unauthenticated(reason fault.Reason, msg string) error {
	return &fault.Error{Kind: fault.KindUnauthenticated, Reason: reason, Message: msg}
}

func denied(msg string) error {
	return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied, Message: msg}
}

// Verify checks token for a request to workspaceID that needs scope, and
// returns its claims. In order: a malformed token or a bad signature is
// unauthenticated (PERMISSION_DENIED); an expired one unauthenticated
// (SESSION_EXPIRED); a token of another Workspace, or one without scope,
// permission_denied; a token whose generation is older than the
// Workspace's (revoked), or of a Workspace being deleted or gone,
// unauthenticated (SESSION_EXPIRED).
func (v *Verifier) Verify(ctx context.Context, token, workspaceID, scope string) (*Claims, error) {
	c, err := v.Authenticate(token)
	if err != nil {
		return nil, err
	}
	if c.WorkspaceID != workspaceID {
		return nil, denied("the data-plane token is for another workspace")
	}
	if !c.Has(scope) {
		return nil, denied("the data-plane token does not grant the scope " + scope)
	}
	gen, gone, err := v.generation(ctx, c.WorkspaceID)
	if err != nil {
		return nil, err
	}
	if gone || c.Generation < gen {
		return nil, unauthenticated(fault.ReasonSessionExpired, "the data-plane session was revoked; create a new one")
	}
	return c, nil
}

// Authenticate checks only the token itself, the first of Verify's checks:
// a malformed token or a bad signature is unauthenticated
// (PERMISSION_DENIED), an expired one unauthenticated (SESSION_EXPIRED).
func (v *Verifier) Authenticate(token string) (*Claims, error) {
	c, err := Parse(v.Key, token)
	if err != nil {
		return nil, unauthenticated(fault.ReasonPermissionDenied, "the data-plane token is not valid")
	}
	if !v.now().Before(c.Expiry()) {
		return nil, unauthenticated(fault.ReasonSessionExpired, "the data-plane session expired; create a new one")
	}
	return c, nil
}

// Watch returns a channel closed at the next change of the Workspace (a
// revocation among others) and its release: the hook of the data plane's
// open streams, which verify their token again (Verify) when it closes and
// at least every MaxStale, and end when it is refused.
func (v *Verifier) Watch(workspaceID string) (<-chan struct{}, func()) {
	return v.Store.Subscribe(store.WorkspaceTopic(workspaceID))
}

// generation returns the Workspace's current data_plane_generation, cached.
func (v *Verifier) generation(ctx context.Context, id string) (uint64, bool, error) {
	now := v.now()
	v.mu.Lock()
	e := v.cache[id]
	if e != nil && now.Sub(e.readAt) < v.maxStale() && !closed(e.changed) {
		gen, gone := e.generation, e.gone
		v.mu.Unlock()
		return gen, gone, nil
	}
	v.mu.Unlock()

	// Subscribe before reading: a change committed after the read closes
	// the channel, so it cannot be missed.
	changed, release := v.Store.Subscribe(store.WorkspaceTopic(id))
	fresh := &entry{readAt: now, changed: changed, release: release}
	err := v.Store.View(ctx, func(tx store.Tx) error {
		w, err := tx.GetWorkspace(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			fresh.gone = true
			return nil
		}
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		st := pub.GetState()
		fresh.gone = st == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING || st == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
		fresh.generation = pub.GetDataPlaneGeneration()
		return nil
	})
	if err != nil {
		release()
		if _, ok := fault.As(err); ok {
			return 0, false, err
		}
		return 0, false, fault.Unavailable(fault.ReasonUnavailable, "the data-plane generation could not be read; retry")
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cache == nil {
		v.cache = map[string]*entry{}
	}
	if old := v.cache[id]; old != nil {
		old.release()
	} else if len(v.cache) >= v.cacheSize() {
		v.evictLocked()
	}
	v.cache[id] = fresh
	return fresh.generation, fresh.gone, nil
}

func (v *Verifier) cacheSize() int {
	if v.CacheSize > 0 {
		return v.CacheSize
	}
	return DefaultCacheSize
}

// evictLocked drops the entry read longest ago.
func (v *Verifier) evictLocked() {
	var (
		oldest string
		at     time.Time
	)
	for id, e := range v.cache {
		if oldest == "" || e.readAt.Before(at) {
			oldest, at = id, e.readAt
		}
	}
	if e := v.cache[oldest]; e != nil {
		e.release()
		delete(v.cache, oldest)
	}
}

// Close releases the cache's subscriptions.
func (v *Verifier) Close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	for id, e := range v.cache {
		e.release()
		delete(v.cache, id)
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
