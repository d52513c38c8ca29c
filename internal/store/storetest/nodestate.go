package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/kibotos/kibotos/internal/store"
)

// nodeStateTests are the conformance tests of NodeStates, TouchNodes, the
// node epoch and revision, and GetLease.
var nodeStateTests = []struct {
	name string
	fn   func(*testing.T, store.Store)
}{
	{"NodeStatesTouchEpoch", testNodeStatesTouchEpoch},
	{"GetLease", testGetLease},
}

// testNodeStatesTouchEpoch: NodeStates reads every node's last_seen, epoch
// and revision by ID; UpsertNode stores the epoch as given and increases
// the revision; TouchNodes writes last_seen only where the epoch matches,
// returns the touches it did not write, and changes neither epoch nor
// revision.
func testNodeStatesTouchEpoch(t *testing.T, s store.Store) {
	states := func() []store.NodeState {
		t.Helper()
		var out []store.NodeState
		view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
			out, err = tx.NodeStates(ctx)
			return err
		})
		return out
	}
	touchAll := func(touches ...store.NodeTouch) []string {
		t.Helper()
		stale, err := s.TouchNodes(context.Background(), touches)
		if err != nil {
			t.Fatalf("TouchNodes: %v", err)
		}
		return stale
	}
	touch := func(id string, epoch int64, at time.Time) bool {
		t.Helper()
		return len(touchAll(store.NodeTouch{ID: id, Epoch: epoch, Seen: at})) == 0
	}
	if stale := touchAll(); len(stale) != 0 {
		t.Errorf("TouchNodes of nothing: stale %v", stale)
	}
	if got := states(); len(got) != 0 {
		t.Fatalf("NodeStates of an empty store: %v", got)
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := tx.UpsertNode(ctx, &store.Node{ID: "b", CreatedAt: base, LastSeen: base, Doc: []byte{1}, Epoch: 3}); err != nil {
			return err
		}
		return tx.UpsertNode(ctx, &store.Node{ID: "a", CreatedAt: base, LastSeen: base, Epoch: 1, Revision: 99})
	})
	want := []store.NodeState{
		{ID: "a", LastSeen: micro(base), Epoch: 1, Revision: 1},
		{ID: "b", LastSeen: micro(base), Epoch: 3, Revision: 1},
	}
	if diff := gocmp.Diff(want, states()); diff != "" {
		t.Fatalf("NodeStates (-want +got):\n%s", diff)
	}
	later := base.Add(time.Minute)
	if !touch("b", 3, later) {
		t.Error("TouchNodes with the stored epoch: not written")
	}
	if touch("b", 2, later.Add(time.Hour)) {
		t.Error("TouchNodes with an older epoch: written")
	}
	if touch("missing", 0, later) {
		t.Error("TouchNodes of a missing node: written")
	}
	want[1].LastSeen = micro(later)
	if diff := gocmp.Diff(want, states()); diff != "" {
		t.Errorf("NodeStates after TouchNodes (-want +got):\n%s", diff)
	}
	// Several at once: each is checked on its own.
	stale := touchAll(store.NodeTouch{ID: "missing", Epoch: 0, Seen: later},
		store.NodeTouch{ID: "a", Epoch: 1, Seen: later.Add(time.Second)},
		store.NodeTouch{ID: "b", Epoch: 2, Seen: later.Add(time.Hour)})
	slices.Sort(stale)
	if !slices.Equal(stale, []string{"b", "missing"}) {
		t.Errorf("TouchNodes of a, b (older epoch), missing: stale %v, want [b missing]", stale)
	}
	want[0].LastSeen = micro(later.Add(time.Second))
	if diff := gocmp.Diff(want, states()); diff != "" {
		t.Errorf("NodeStates after three TouchNodes (-want +got):\n%s", diff)
	}
	// Replacing a node: a new epoch, the next revision, the rest as given.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		n, err := tx.GetNode(ctx, "b")
		if err != nil {
			return err
		}
		if n.Epoch != 3 || n.Revision != 1 || !n.LastSeen.Equal(micro(later)) {
			t.Errorf("GetNode after TouchNodes = epoch %d revision %d last_seen %v", n.Epoch, n.Revision, n.LastSeen)
		}
		n.Epoch++
		return tx.UpsertNode(ctx, n)
	})
	want[1].Epoch, want[1].Revision = 4, 2
	if diff := gocmp.Diff(want, states()); diff != "" {
		t.Errorf("NodeStates after UpsertNode (-want +got):\n%s", diff)
	}
	if touch("b", 3, later) {
		t.Error("TouchNodes with the superseded epoch: written")
	}
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		if e, err := tx.NodeEpoch(ctx, "b"); err != nil || e != 4 {
			t.Errorf("NodeEpoch = %d, %v; want 4", e, err)
		}
		if _, err := tx.NodeEpoch(ctx, "missing"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("NodeEpoch of a missing node: %v, want ErrNotFound", err)
		}
		return nil
	})
	// A write in View is refused.
	err := s.View(context.Background(), func(tx store.Tx) error {
		return tx.UpsertNode(context.Background(), &store.Node{ID: "c", CreatedAt: base, LastSeen: base})
	})
	wantErr(t, "UpsertNode in View", err, store.ErrReadOnly)
}

// testGetLease: a lease nobody tried is ErrNotFound; GetLease reads the
// row AcquireLease left, in the same transaction too.
func testGetLease(t *testing.T, s store.Store) {
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.GetLease(ctx, "fleet"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetLease of a lease never acquired: %v, want ErrNotFound", err)
		}
		return nil
	})
	ttl := 3 * time.Second
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		l, err := tx.AcquireLease(ctx, "fleet", "a", base, ttl)
		if err != nil {
			return err
		}
		got, err := tx.GetLease(ctx, "fleet")
		if err != nil || got != l {
			t.Errorf("GetLease in the acquiring transaction = %+v, %v; want %+v", got, err, l)
		}
		return nil
	})
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		got, err := tx.GetLease(ctx, "fleet")
		want := store.Lease{Name: "fleet", Holder: "a", Fence: 1, ExpiresAt: micro(base.Add(ttl))}
		if err != nil || !got.ExpiresAt.Equal(want.ExpiresAt) || got.Holder != want.Holder || got.Fence != want.Fence || got.Name != want.Name {
			t.Errorf("GetLease = %+v, %v; want %+v", got, err, want)
		}
		return nil
	})
}
