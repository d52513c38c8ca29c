package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// retentionTests are the conformance tests of store.RetentionTx.
var retentionTests = []struct {
	name string
	fn   func(*testing.T, store.Store)
}{
	{"PruneCommands", testPruneCommands},
	{"PruneDeletedWorkspaces", testPruneDeletedWorkspaces},
	{"PruneResources", testPruneResources},
}

// prune runs one pruning call in its own transaction.
func prune(t *testing.T, s store.Store, fn func(ctx context.Context, tx store.Tx) (int, error)) int {
	t.Helper()
	var n int
	inTx(t, s, func(ctx context.Context, tx store.Tx) (err error) {
		n, err = fn(ctx, tx)
		return err
	})
	return n
}

// testPruneCommands: completed commands older than the cutoff go, oldest
// first, at most limit a call; PROCESSING ones, those of a kept method and
// those a Workspace names as its CommandID stay, as do newer ones.
func testPruneCommands(t *testing.T, s store.Store) {
	old, cutoff, recent := base, base.Add(time.Hour), base.Add(2*time.Hour)
	completed := func(id, method string, at time.Time) *store.Command {
		return &store.Command{ID: id, Method: method, ObjectKind: "workspace", ObjectID: "ws-1", Initiator: 1,
			Status: store.CommandCompleted, CreatedAt: at.Add(-time.Second), CompletedAt: at}
	}
	cmds := []*store.Command{
		completed("old-1", "m", old),
		completed("old-2", "m", old.Add(time.Microsecond)),
		completed("old-3", "m", old.Add(2*time.Microsecond)),
		completed("old-4", "m", old.Add(3*time.Microsecond)),
		completed("kept", "ctrl/keep", old),
		completed("named", "m", old),
		completed("recent", "m", recent),
		{ID: "processing", Method: "m", ObjectKind: "workspace", ObjectID: "ws-1", Initiator: 1,
			Status: store.CommandProcessing, CreatedAt: old},
	}
	w := newWorkspace("ws-1", base, nil)
	w.CommandID = "named"
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for _, c := range cmds {
			if err := tx.InsertCommand(ctx, c); err != nil {
				return err
			}
		}
		return tx.InsertWorkspace(ctx, w)
	})
	keep := []string{"ctrl/keep", "ctrl/other"}
	pruneOnce := func(limit int) int {
		return prune(t, s, func(ctx context.Context, tx store.Tx) (int, error) {
			return tx.PruneCommands(ctx, cutoff, keep, limit)
		})
	}
	if n := pruneOnce(0); n != 0 {
		t.Errorf("limit 0 pruned %d", n)
	}
	exists := func(id string) bool {
		_, err := getCommand(t, s, id)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("GetCommand %s: %v", id, err)
		}
		return err == nil
	}
	if n := pruneOnce(2); n != 2 {
		t.Fatalf("first batch pruned %d, want 2", n)
	}
	if exists("old-1") || exists("old-2") || !exists("old-3") || !exists("old-4") {
		t.Errorf("first batch: not the two oldest")
	}
	if n := pruneOnce(10); n != 2 {
		t.Errorf("second batch pruned %d, want 2", n)
	}
	if n := pruneOnce(10); n != 0 {
		t.Errorf("third batch pruned %d, want 0 (idempotent)", n)
	}
	for _, id := range []string{"kept", "named", "recent", "processing"} {
		if !exists(id) {
			t.Errorf("%s was pruned", id)
		}
	}
	// Without keep, the kept method's record goes too; once the Workspace
	// names no command, so does the one it named.
	if n := prune(t, s, func(ctx context.Context, tx store.Tx) (int, error) {
		return tx.PruneCommands(ctx, cutoff, nil, 10)
	}); n != 1 || exists("kept") {
		t.Errorf("without keep: pruned %d, kept exists %v; want 1 and gone", n, exists("kept"))
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		got, err := tx.GetWorkspace(ctx, "ws-1")
		if err != nil {
			return err
		}
		got.CommandID = ""
		return tx.UpdateWorkspace(ctx, got)
	})
	if n := pruneOnce(10); n != 1 || exists("named") {
		t.Errorf("after the Workspace let go: pruned %d, named exists %v; want 1 and gone", n, exists("named"))
	}
}

// testPruneDeletedWorkspaces: Workspaces whose deletion completed before
// the cutoff go with their labels and references; live ones and recent
// deletions stay.
func testPruneDeletedWorkspaces(t *testing.T, s store.Store) {
	cutoff := base.Add(time.Hour)
	live := newWorkspace("ws-live", base, map[string]string{"app": "x"})
	oldDel := newWorkspace("ws-old", base, map[string]string{"app": "x"})
	oldDel2 := newWorkspace("ws-old2", base.Add(time.Microsecond), map[string]string{"app": "x"})
	recentDel := newWorkspace("ws-recent", base.Add(2*time.Microsecond), map[string]string{"app": "x"})
	insertWorkspaces(t, s, live, oldDel, oldDel2, recentDel)
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := tx.SetReferences(ctx, "ws-old", []store.Reference{{Kind: store.RefEgress, TargetID: "e1"}}); err != nil {
			return err
		}
		if err := tx.SetReferences(ctx, "ws-live", []store.Reference{{Kind: store.RefEgress, TargetID: "e1"}}); err != nil {
			return err
		}
		for id, at := range map[string]time.Time{"ws-old": base, "ws-old2": base.Add(time.Minute), "ws-recent": base.Add(2 * time.Hour)} {
			w, err := tx.GetWorkspace(ctx, id)
			if err != nil {
				return err
			}
			w.State, w.DeletedAt, w.Power, w.NodeID = store.WorkspaceStateDeleted, at, store.PowerDeleted, ""
			if err := tx.UpdateWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	})
	pruneOnce := func(limit int) int {
		return prune(t, s, func(ctx context.Context, tx store.Tx) (int, error) {
			return tx.PruneDeletedWorkspaces(ctx, cutoff, limit)
		})
	}
	if n := pruneOnce(1); n != 1 {
		t.Fatalf("first batch pruned %d, want 1", n)
	}
	if _, err := getWorkspace(t, s, "ws-old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetWorkspace of the oldest deletion after a batch of 1: %v, want not found", err)
	}
	if n := pruneOnce(10); n != 1 {
		t.Errorf("second batch pruned %d, want 1", n)
	}
	if n := pruneOnce(10); n != 0 {
		t.Errorf("third batch pruned %d, want 0 (idempotent)", n)
	}
	for _, id := range []string{"ws-live", "ws-recent"} {
		if _, err := getWorkspace(t, s, id); err != nil {
			t.Errorf("GetWorkspace %s: %v", id, err)
		}
	}
	got := workspaceIDs(listAllWorkspaces(t, s, store.WorkspaceQuery{IncludeDeleted: true, Selector: map[string]string{"app": "x"}, Limit: 10}))
	if !slices.Equal(got, []string{"ws-live", "ws-recent"}) {
		t.Errorf("listed by label after pruning: %q, want ws-live and ws-recent", got)
	}
	var refs []string
	view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
		refs, err = tx.ReferencingWorkspaces(ctx, store.RefEgress, "e1")
		return err
	})
	if !slices.Equal(refs, []string{"ws-live"}) {
		t.Errorf("references to e1 after pruning: %q, want only ws-live's", refs)
	}
}

// testPruneResources: resources of the kind last updated before the
// cutoff go with their labels; newer ones and other kinds stay.
func testPruneResources(t *testing.T, s store.Store) {
	const kind store.ResourceKind = "volume-deleted"
	cutoff := base.Add(time.Hour)
	res := func(kind store.ResourceKind, id string, updated time.Time) *store.Resource {
		r := egress(id, base, map[string]string{"app": "x"})
		r.Kind, r.UpdatedAt = kind, updated
		return r
	}
	rs := []*store.Resource{
		res(kind, "vol-old", base), res(kind, "vol-old2", base.Add(time.Minute)), res(kind, "vol-recent", base.Add(2*time.Hour)),
		res("volume", "vol-live", base),
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for _, r := range rs {
			if err := tx.InsertResource(ctx, r); err != nil {
				return err
			}
		}
		return nil
	})
	pruneOnce := func(limit int) int {
		return prune(t, s, func(ctx context.Context, tx store.Tx) (int, error) {
			return tx.PruneResources(ctx, kind, cutoff, limit)
		})
	}
	if n := pruneOnce(0); n != 0 {
		t.Errorf("limit 0 pruned %d", n)
	}
	if n := pruneOnce(1); n != 1 {
		t.Fatalf("first batch pruned %d, want 1", n)
	}
	if _, err := getResource(t, s, kind, "vol-old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the oldest after a batch of 1: %v, want not found", err)
	}
	if n := pruneOnce(10); n != 1 {
		t.Errorf("second batch pruned %d, want 1", n)
	}
	if n := pruneOnce(10); n != 0 {
		t.Errorf("third batch pruned %d, want 0 (idempotent)", n)
	}
	if got := ids(listAll(t, s, store.ListQuery{Kind: kind, Selector: map[string]string{"app": "x"}, Limit: 10})); !slices.Equal(got, []string{"vol-recent"}) {
		t.Errorf("%s by label after pruning: %q, want vol-recent", kind, got)
	}
	if _, err := getResource(t, s, "volume", "vol-live"); err != nil {
		t.Errorf("another kind's resource: %v", err)
	}
}
