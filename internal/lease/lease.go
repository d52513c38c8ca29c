// Package lease gives fleet-wide work exactly one owner among the ctrl
// replicas sharing a store: a named lease row in the store
// (store.LeaseTx), acquired and renewed by one loop per replica, with a
// fencing token that increases at every change of holder.
//
// A Keeper renews every Renew (1 s) for TTL (3 s). Its holder acts only
// while Held: until TTL after the start of its last successful renewal,
// measured on its own clock, so a replica that cannot reach the store
// stops acting before (or when) another replica may take over. Another
// replica takes over at its first attempt after the claim expired: at
// most TTL + Renew (4 s) after the holder's last renewal, plus one
// transaction. Replicas judge the expiry of each other's claims on their
// own clocks, so their clocks must agree to well within TTL (NTP).
//
// With SQLite (one ctrl by design) the single replica acquires the lease
// at its first attempt and keeps it: the same code path, never contended.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// Fleet is the lease of the fleet-wide work: placement timeouts,
// silent-node detection, the drain rule and retention.
const Fleet = "fleet"

// Defaults of Config.
const (
	DefaultTTL   = 3 * time.Second
	DefaultRenew = time.Second
)

// Config configures a Keeper.
type Config struct {
	Store store.Store
	// Name is the lease's name (Fleet).
	Name string
	// Holder names this replica; empty is NewHolder().
	Holder string
	// TTL is how long a claim lasts without renewal; zero is DefaultTTL.
	TTL time.Duration
	// Renew is the time between attempts; zero is DefaultRenew.
	Renew time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// OnAcquire, when set, is called (outside any lock) each time this
	// replica becomes the holder: the work it gates can start at once.
	OnAcquire func(fence int64)
	Log       *slog.Logger
}

// Keeper keeps one replica's claim on one lease.
type Keeper struct {
	cfg Config

	mu    sync.Mutex
	fence int64     // fence of the current tenure, 0 when never held
	until time.Time // Held until then (this replica's clock)
}

// NewHolder is a holder name unique to this process: host, PID and random
// bytes.
func NewHolder() string {
	host, _ := os.Hostname()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b)
}

// New returns a Keeper; Run makes it acquire and renew.
func New(cfg Config) *Keeper {
	if cfg.Holder == "" {
		cfg.Holder = NewHolder()
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Renew <= 0 {
		cfg.Renew = DefaultRenew
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Keeper{cfg: cfg}
}

// Holder is this replica's holder name.
func (k *Keeper) Holder() string { return k.cfg.Holder }

// Held reports whether this replica holds the lease now, and the fence of
// its tenure. Gated work checks it before each unit of work.
func (k *Keeper) Held() (int64, bool) {
	if k == nil {
		return 0, true
	}
	now := k.cfg.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fence, now.Before(k.until)
}

// IsHeld is Held without the fence.
func (k *Keeper) IsHeld() bool {
	_, ok := k.Held()
	return ok
}

// ErrNotHeld is Check's refusal: this replica does not hold the lease (any
// more), so the transaction of the unit of work must not commit.
var ErrNotHeld = errors.New("lease: not held by this replica")

// Check fences one unit of gated work: called inside the unit's write
// transaction, it reads the lease row in tx and returns ErrNotHeld unless
// this replica holds the lease by its own clock (Held) and the row still
// names it with the fence of its tenure, unexpired by this replica's
// clock. The caller returns the error, so the transaction rolls back.
// Reading the row in the transaction is the fence: with SQLite (one
// writer) a takeover either committed before (the row names another) or
// comes after the unit's commit; with PostgreSQL (SERIALIZABLE) a takeover
// committing while the unit runs makes one of the two fail to commit, so a
// stale holder's write never commits after another replica took over and
// acted. A nil Keeper (one ctrl, no lease) allows everything.
func (k *Keeper) Check(ctx context.Context, tx store.LeaseTx) error {
	if k == nil {
		return nil
	}
	fence, ok := k.Held()
	if !ok {
		return ErrNotHeld
	}
	l, err := tx.GetLease(ctx, k.cfg.Name)
	if errors.Is(err, store.ErrNotFound) {
		return ErrNotHeld
	}
	if err != nil {
		return err
	}
	if l.Holder != k.cfg.Holder || l.Fence != fence || !k.cfg.Now().Before(l.ExpiresAt) {
		return ErrNotHeld
	}
	return nil
}

// Run tries to acquire or renew the lease at once and then every Renew
// until ctx is done.
func (k *Keeper) Run(ctx context.Context) error {
	tick := time.NewTicker(k.cfg.Renew)
	defer tick.Stop()
	for {
		if err := k.Try(ctx); err != nil && ctx.Err() == nil {
			k.cfg.Log.Warn("lease: acquire or renew", "lease", k.cfg.Name, "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Try makes one attempt to acquire or renew the lease. A failed attempt
// changes nothing: a held lease stays held until its deadline.
func (k *Keeper) Try(ctx context.Context) error {
	start := k.cfg.Now()
	var l store.Lease
	err := k.cfg.Store.InTx(ctx, func(tx store.Tx) error {
		var err error
		l, err = tx.AcquireLease(ctx, k.cfg.Name, k.cfg.Holder, start, k.cfg.TTL)
		return err
	})
	if err != nil {
		return err
	}
	k.mu.Lock()
	was := k.cfg.Now().Before(k.until)
	gained := false
	if l.Holder == k.cfg.Holder {
		gained = !was
		k.fence, k.until = l.Fence, start.Add(k.cfg.TTL)
	} else {
		k.until = time.Time{}
	}
	k.mu.Unlock()
	if gained {
		k.cfg.Log.Info("lease acquired", "lease", k.cfg.Name, "holder", k.cfg.Holder, "fence", l.Fence)
		if k.cfg.OnAcquire != nil {
			k.cfg.OnAcquire(l.Fence)
		}
	} else if l.Holder != k.cfg.Holder && was {
		k.cfg.Log.Warn("lease lost", "lease", k.cfg.Name, "holder", l.Holder, "fence", l.Fence)
	}
	return nil
}
