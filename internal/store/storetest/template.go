package storetest

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/kibotos/kibotos/internal/store"
)

// testWorkspaceQueryColumns: CPUMillis and TemplateKey are stored,
// replaced and read back as given, up to the largest CPUMillis a column
// holds; a larger one is refused and stores nothing.
func testWorkspaceQueryColumns(t *testing.T, s store.Store) {
	w := newWorkspace("ws-1", base, nil)
	w.CPUMillis, w.TemplateKey = math.MaxInt64, "python@2024.1-ünïcode"
	insertWorkspaces(t, s, w)
	if got, err := getWorkspace(t, s, "ws-1"); err != nil || got.CPUMillis != w.CPUMillis || got.TemplateKey != w.TemplateKey {
		t.Fatalf("GetWorkspace after insert: %+v, %v; want CPUMillis %d, TemplateKey %q", got, err, w.CPUMillis, w.TemplateKey)
	}
	w.CPUMillis, w.TemplateKey = 250, ""
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateWorkspace(ctx, w) })
	if got, err := getWorkspace(t, s, "ws-1"); err != nil || !gocmp.Equal(storedWorkspace(w), got) {
		t.Fatalf("GetWorkspace after update: %+v, %v; want %+v", got, err, storedWorkspace(w))
	}
	ctx := context.Background()
	big := newWorkspace("ws-2", base, nil)
	big.CPUMillis = math.MaxInt64 + 1
	if err := s.InTx(ctx, func(tx store.Tx) error { return tx.InsertWorkspace(ctx, big) }); err == nil {
		t.Errorf("InsertWorkspace with CPUMillis 2^63: no error")
	}
	w.CPUMillis = math.MaxInt64 + 1
	if err := s.InTx(ctx, func(tx store.Tx) error { return tx.UpdateWorkspace(ctx, w) }); err == nil {
		t.Errorf("UpdateWorkspace with CPUMillis 2^63: no error")
	}
	w.CPUMillis = 250
	if got, err := getWorkspace(t, s, "ws-1"); err != nil || !gocmp.Equal(storedWorkspace(w), got) {
		t.Errorf("GetWorkspace after refused update: %+v, %v; want %+v", got, err, storedWorkspace(w))
	}
}

// testCountWorkspacesWithTemplate: CountWorkspacesWithTemplate counts the
// Workspaces with that TemplateKey whose deletion has not completed, on any
// node or none, whatever their power, and follows every change of the key
// and of the deletion, in the transaction that makes it and after.
func testCountWorkspacesWithTemplate(t *testing.T, s store.Store) {
	count := func(tx store.Tx, key string) int {
		t.Helper()
		n, err := tx.CountWorkspacesWithTemplate(context.Background(), key)
		if err != nil {
			t.Fatalf("CountWorkspacesWithTemplate(%q): %v", key, err)
		}
		return n
	}
	check := func(what string, tx store.Tx, want map[string]int) {
		t.Helper()
		for key, n := range want {
			if got := count(tx, key); got != n {
				t.Errorf("%s: CountWorkspacesWithTemplate(%q) = %d, want %d", what, key, got, n)
			}
		}
	}
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		check("empty store", tx, map[string]int{"default@1": 0, "": 0})
		return nil
	})
	keys := []string{"default@1", "default@2", "python@1"}
	want := map[string]int{"default@1": 0, "default@2": 0, "python@1": 0, "default@": 0, "default": 0, "Default@1": 0}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for i := range 30 {
			w := newWorkspace(fmt.Sprintf("ws-%02d", i), base.Add(time.Duration(i)*time.Second), nil)
			w.TemplateKey = keys[i%3]
			w.NodeID = []string{"node-a", "node-b", "", "node-a", ""}[i%5]
			w.Power = []store.Power{store.PowerRunning, store.PowerStopped, store.PowerDeleted}[i%3]
			if i%7 == 6 {
				// Deletion completed: not counted.
				w.Power, w.State, w.DeletedAt = store.PowerDeleted, store.WorkspaceStateDeleted, base.Add(time.Hour)
			} else {
				want[w.TemplateKey]++
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		check("after inserts", tx, want)
		return nil
	})
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		update := func(id string, f func(w *store.Workspace)) {
			t.Helper()
			w, err := tx.GetWorkspace(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			f(w)
			if err := tx.UpdateWorkspace(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		update("ws-00", func(w *store.Workspace) { w.TemplateKey = "default@2" }) // default@1 → default@2
		want["default@1"]--
		want["default@2"]++
		update("ws-03", func(w *store.Workspace) { // default@1: deletion completes
			w.State, w.DeletedAt = store.WorkspaceStateDeleted, base.Add(2*time.Hour)
		})
		want["default@1"]--
		update("ws-06", func(w *store.Workspace) { w.TemplateKey = "python@1" }) // deleted: still not counted
		update("ws-04", func(w *store.Workspace) { w.NodeID = "" })              // default@2: unplaced, still counted
		check("in the transaction", tx, want)
		return nil
	})
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		check("after updates", tx, want)
		return nil
	})
}
