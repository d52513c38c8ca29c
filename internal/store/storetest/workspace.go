package storetest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/kibotos/kibotos/internal/store"
)

// workspaceTests are the conformance tests of store.WorkspaceTx, store.NodeTx
// and CommandTx.ProcessingCommands.
var workspaceTests = []struct {
	name string
	fn   func(*testing.T, store.Store)
}{
	{"Workspaces", testWorkspaces},
	{"WorkspaceLabels", testWorkspaceLabels},
	{"WorkspaceWritesInView", testWorkspaceWritesInView},
	{"WorkspaceRollback", testWorkspaceRollback},
	{"ListWorkspacesFilters", testListWorkspacesFilters},
	{"ListWorkspacesPaging", testListWorkspacesPaging},
	{"WorkspacesOnNode", testWorkspacesOnNode},
	{"NodeUsage", testNodeUsage},
	{"WorkspaceQueryColumns", testWorkspaceQueryColumns},
	{"CountWorkspacesWithTemplate", testCountWorkspacesWithTemplate},
	{"PendingWorkspaces", testPendingWorkspaces},
	{"ProcessingCommands", testProcessingCommands},
	{"Nodes", testNodes},
	{"DeniedNodeKeys", testDeniedNodeKeys},
	{"ConcurrentWorkspaces", testConcurrentWorkspaces},
	{"Expirations", testExpirations},
}

func newWorkspace(id string, createdAt time.Time, labels map[string]string) *store.Workspace {
	return &store.Workspace{
		ID:        id,
		CreatedAt: createdAt,
		UpdatedAt: createdAt,
		Doc:       []byte("doc:" + id),
		Labels:    labels,
		State:     3,
		NodeID:    "node-a",
		Power:     store.PowerRunning,
	}
}

// storedWorkspace is what a store returns for w.
func storedWorkspace(w *store.Workspace) *store.Workspace {
	s := *w
	s.CreatedAt, s.UpdatedAt = micro(w.CreatedAt), micro(w.UpdatedAt)
	if !w.DeletedAt.IsZero() {
		s.DeletedAt = micro(w.DeletedAt)
	}
	if !w.ObservedAt.IsZero() {
		s.ObservedAt = micro(w.ObservedAt)
	}
	if !w.ExpirationDeadline.IsZero() {
		s.ExpirationDeadline = micro(w.ExpirationDeadline)
	}
	s.Labels = map[string]string{}
	for k, v := range w.Labels {
		s.Labels[k] = v
	}
	if len(s.Doc) == 0 {
		s.Doc = nil
	}
	return &s
}

func getWorkspace(t *testing.T, s store.Store, id string) (*store.Workspace, error) {
	t.Helper()
	var w *store.Workspace
	var err error
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		w, err = tx.GetWorkspace(ctx, id)
		return nil
	})
	return w, err
}

func insertWorkspaces(t *testing.T, s store.Store, ws ...*store.Workspace) {
	t.Helper()
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for _, w := range ws {
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	})
}

func listWorkspaces(t *testing.T, s store.Store, q store.WorkspaceQuery) []*store.Workspace {
	t.Helper()
	var page []*store.Workspace
	view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
		page, err = tx.ListWorkspaces(ctx, q)
		return err
	})
	return page
}

// listAllWorkspaces pages through q with q.Limit and returns every item,
// checking that pages are full until the last one.
func listAllWorkspaces(t *testing.T, s store.Store, q store.WorkspaceQuery) []*store.Workspace {
	t.Helper()
	return pageAll(t, q.Limit, func(after *store.Cursor) []*store.Workspace {
		q.After = after
		return listWorkspaces(t, s, q)
	}, func(w *store.Workspace) store.Cursor { return store.Cursor{CreatedAt: w.CreatedAt, ID: w.ID} })
}

func workspaceIDs(ws []*store.Workspace) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.ID
	}
	return out
}

func workspaceKey(w *store.Workspace) key { return key{w.CreatedAt.UnixMicro(), w.ID} }

func sortWorkspaces(ws []*store.Workspace) {
	slices.SortFunc(ws, func(a, b *store.Workspace) int {
		ka, kb := workspaceKey(a), workspaceKey(b)
		return cmp.Or(cmp.Compare(ka.us, kb.us), cmp.Compare(ka.id, kb.id))
	})
}

// matches is the reference implementation of a WorkspaceQuery's filters.
func matches(q store.WorkspaceQuery, w *store.Workspace) bool {
	switch {
	case len(q.States) > 0:
		if !slices.Contains(q.States, w.State) {
			return false
		}
	case !q.IncludeDeleted:
		if w.State == store.WorkspaceStateDeleted {
			return false
		}
	}
	if q.GuestCondition != 0 && w.GuestCondition != q.GuestCondition {
		return false
	}
	for k, v := range q.Selector {
		if got, ok := w.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func testWorkspaces(t *testing.T, s store.Store) {
	w := &store.Workspace{
		ID:                 "ws-1",
		CreatedAt:          base,
		UpdatedAt:          base.Add(time.Second + 7),
		Doc:                []byte{0, 1, 2, 255, 0},
		Labels:             map[string]string{"app": "web", "tier": "front"},
		State:              3,
		GuestCondition:     2,
		NodeID:             "node-a",
		Power:              store.PowerRunning,
		ForceStop:          true,
		Generation:         1<<40 + 3,
		CommandID:          "cmd-9",
		ObservedGeneration: 7,
		ObservedState:      store.ExecRunning,
		HoldsExecution:     true,
		PolicyDrainSeconds: 600,
		ExecDNSVersion:     1,
	}
	insertWorkspaces(t, s, w)
	got, err := getWorkspace(t, s, "ws-1")
	if err != nil {
		t.Fatalf("GetWorkspace: %v", err)
	}
	if diff := gocmp.Diff(storedWorkspace(w), got); diff != "" {
		t.Errorf("GetWorkspace after insert (-want +got):\n%s", diff)
	}
	checkUTC(t, "GetWorkspace", got.CreatedAt, got.UpdatedAt)
	if !got.DeletedAt.IsZero() || !got.ObservedAt.IsZero() {
		t.Errorf("DeletedAt %v ObservedAt %v, want zero", got.DeletedAt, got.ObservedAt)
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		got, err := tx.GetWorkspace(ctx, "ws-1")
		if err != nil {
			return err
		}
		if diff := gocmp.Diff(storedWorkspace(w), got); diff != "" {
			t.Errorf("GetWorkspace in InTx (-want +got):\n%s", diff)
		}
		return nil
	})

	// Every field set, the extremes included.
	full := &store.Workspace{
		ID:                 "ws-full",
		CreatedAt:          base.Add(time.Minute),
		UpdatedAt:          base.Add(2 * time.Minute),
		DeletedAt:          base.Add(3*time.Minute + 999),
		Doc:                []byte("full"),
		Labels:             map[string]string{"k": ""},
		State:              math.MaxInt32,
		GuestCondition:     math.MinInt32,
		NodeID:             "node-é",
		Power:              store.PowerDeleted,
		Generation:         math.MaxInt64,
		CommandID:          "c",
		ObservedGeneration: math.MaxInt64 - 1,
		ObservedState:      store.ExecStarting,
		ObservedAt:         time.Date(1969, 7, 20, 20, 17, 40, 123_456_789, time.UTC),
		PolicyDrainSeconds: math.MaxUint32,
		ExecDNSVersion:     math.MaxUint32,
		ExpirationDeadline: time.Date(2035, 1, 2, 3, 4, 5, 678_901_234, zone),
		MemoryMiB:          math.MaxInt64,
		LayerBytes:         math.MaxInt64 - 1,
	}
	insertWorkspaces(t, s, full)
	got, err = getWorkspace(t, s, "ws-full")
	if err != nil {
		t.Fatalf("GetWorkspace: %v", err)
	}
	if diff := gocmp.Diff(storedWorkspace(full), got); diff != "" {
		t.Errorf("GetWorkspace of every field (-want +got):\n%s", diff)
	}
	checkUTC(t, "GetWorkspace", got.CreatedAt, got.UpdatedAt, got.DeletedAt, got.ObservedAt)

	// A generation out of the column's range is an error, not a wrap.
	err = s.InTx(context.Background(), func(tx store.Tx) error {
		huge := newWorkspace("ws-huge", base, nil)
		huge.Generation = math.MaxUint64
		return tx.InsertWorkspace(context.Background(), huge)
	})
	if err == nil {
		t.Error("InsertWorkspace with Generation 2^64-1: no error")
	}

	// A duplicate is ErrDuplicate, changes nothing and leaves the
	// transaction usable.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		dup := newWorkspace("ws-1", base.Add(time.Hour), map[string]string{"other": "x"})
		wantErr(t, "InsertWorkspace duplicate", tx.InsertWorkspace(ctx, dup), store.ErrDuplicate)
		return tx.InsertWorkspace(ctx, newWorkspace("ws-2", base, nil))
	})
	if got, err := getWorkspace(t, s, "ws-1"); err != nil || !gocmp.Equal(storedWorkspace(w), got) {
		t.Errorf("after a duplicate insert: %+v, %v; want the original", got, err)
	}
	if _, err := getWorkspace(t, s, "ws-2"); err != nil {
		t.Errorf("insert after a duplicate in the same transaction: %v", err)
	}

	// Update replaces every mutable field; CreatedAt stays.
	upd := &store.Workspace{
		ID:                 "ws-1",
		CreatedAt:          base.Add(time.Hour),
		UpdatedAt:          base.Add(5 * time.Second),
		DeletedAt:          base.Add(6*time.Second + 1),
		Doc:                []byte("doc v2"),
		Labels:             map[string]string{"app": "api", "new": "x"},
		State:              store.WorkspaceStateDeleted,
		GuestCondition:     0,
		NodeID:             "node-b",
		Power:              store.PowerDeleted,
		ForceStop:          false,
		Generation:         1<<40 + 4,
		CommandID:          "",
		ObservedGeneration: 1<<40 + 4,
		ObservedState:      store.ExecDeleted,
		HoldsExecution:     false,
		ObservedAt:         base.Add(7*time.Second + 1),
		PolicyDrainSeconds: 0,
		ExecDNSVersion:     2,
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateWorkspace(ctx, upd) })
	want := storedWorkspace(upd)
	want.CreatedAt = micro(w.CreatedAt)
	got, err = getWorkspace(t, s, "ws-1")
	if err != nil {
		t.Fatalf("GetWorkspace: %v", err)
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("GetWorkspace after update (-want +got):\n%s", diff)
	}
	checkUTC(t, "GetWorkspace", got.CreatedAt, got.UpdatedAt, got.DeletedAt, got.ObservedAt)

	// And back: zero times, no doc, no labels.
	back := *upd
	back.DeletedAt, back.ObservedAt = time.Time{}, time.Time{}
	back.Doc, back.Labels = nil, nil
	back.State, back.ForceStop, back.HoldsExecution = 5, true, true
	back.PolicyDrainSeconds, back.ExecDNSVersion = 3600, 0
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateWorkspace(ctx, &back) })
	want = storedWorkspace(&back)
	want.CreatedAt = micro(w.CreatedAt)
	got, err = getWorkspace(t, s, "ws-1")
	if err != nil {
		t.Fatalf("GetWorkspace: %v", err)
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("GetWorkspace after update to zero values (-want +got):\n%s", diff)
	}
	if got.Labels == nil || got.Doc != nil {
		t.Errorf("Labels %#v Doc %#v, want an empty map and nil", got.Labels, got.Doc)
	}

	// Not found.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		missing := newWorkspace("ws-missing", base, map[string]string{"a": "b"})
		wantErr(t, "UpdateWorkspace missing", tx.UpdateWorkspace(ctx, missing), store.ErrNotFound)
		_, err := tx.GetWorkspace(ctx, "ws-missing")
		wantErr(t, "GetWorkspace missing (in InTx)", err, store.ErrNotFound)
		// The transaction is still usable.
		return tx.InsertWorkspace(ctx, newWorkspace("ws-3", base, nil))
	})
	_, err = getWorkspace(t, s, "ws-missing")
	wantErr(t, "GetWorkspace missing", err, store.ErrNotFound)
	if page := listWorkspaces(t, s, store.WorkspaceQuery{Selector: map[string]string{"a": "b"}, Limit: 10}); len(page) != 0 {
		t.Errorf("the labels of a failed update are listed: %v", workspaceIDs(page))
	}
	if _, err := getWorkspace(t, s, "ws-3"); err != nil {
		t.Errorf("insert after a missing update in the same transaction: %v", err)
	}
}

func testWorkspaceLabels(t *testing.T, s store.Store) {
	w := newWorkspace("x", base, map[string]string{"a": "1", "b": "2", "c": "3"})
	insertWorkspaces(t, s, w)
	// Resources of the same ID and labels are other objects.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		return tx.InsertResource(ctx, egress("x", base, map[string]string{"a": "1", "e": "egress"}))
	})
	sel := func(q map[string]string) []string {
		t.Helper()
		return workspaceIDs(listWorkspaces(t, s, store.WorkspaceQuery{Selector: q, Limit: 10}))
	}
	if got := sel(map[string]string{"e": "egress"}); len(got) != 0 {
		t.Errorf("the label of an egress selects workspaces %v", got)
	}
	if got := ids(list(t, s, store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"b": "2"}, Limit: 10})); len(got) != 0 {
		t.Errorf("the label of a workspace selects egresses %v", got)
	}
	if r, err := getResource(t, s, store.KindEgress, "x"); err != nil || !gocmp.Equal(r.Labels, map[string]string{"a": "1", "e": "egress"}) {
		t.Errorf("egress x: %+v, %v", r, err)
	}

	upd := *w
	upd.Labels = map[string]string{"b": "20", "c": "3", "d": "4"}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateWorkspace(ctx, &upd) })
	got, err := getWorkspace(t, s, "x")
	if err != nil {
		t.Fatal(err)
	}
	if diff := gocmp.Diff(upd.Labels, got.Labels); diff != "" {
		t.Errorf("labels after update (-want +got):\n%s", diff)
	}
	for _, q := range []map[string]string{{"a": "1"}, {"b": "2"}} {
		if got := sel(q); len(got) != 0 {
			t.Errorf("selector %v on a replaced label matched %v", q, got)
		}
	}
	for _, q := range []map[string]string{{"b": "20"}, {"c": "3"}, {"d": "4"}, {"b": "20", "c": "3", "d": "4"}} {
		if got := sel(q); !slices.Equal(got, []string{"x"}) {
			t.Errorf("selector %v after update: %v, want [x]", q, got)
		}
	}
	// An update that keeps the labels keeps them.
	upd.Generation++
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateWorkspace(ctx, &upd) })
	if got, _ := getWorkspace(t, s, "x"); got == nil || !gocmp.Equal(got.Labels, upd.Labels) {
		t.Errorf("labels after an update keeping them: %+v", got)
	}
	// The egress's labels are untouched, and deleting the egress leaves the
	// workspace's.
	if r, err := getResource(t, s, store.KindEgress, "x"); err != nil || !gocmp.Equal(r.Labels, map[string]string{"a": "1", "e": "egress"}) {
		t.Errorf("egress x after the workspace's update: %+v, %v", r, err)
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.DeleteResource(ctx, store.KindEgress, "x") })
	if got := sel(map[string]string{"c": "3"}); !slices.Equal(got, []string{"x"}) {
		t.Errorf("selector after deleting the egress of the same ID: %v, want [x]", got)
	}
	// Updating to no labels removes them all.
	upd.Labels = map[string]string{}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateWorkspace(ctx, &upd) })
	if got, _ := getWorkspace(t, s, "x"); got == nil || got.Labels == nil || len(got.Labels) != 0 {
		t.Errorf("labels after update to none: %+v", got)
	}
	if got := sel(map[string]string{"c": "3"}); len(got) != 0 {
		t.Errorf("selector after removing the labels: %v", got)
	}
}

func testWorkspaceWritesInView(t *testing.T, s store.Store) {
	ctx := context.Background()
	seed := newWorkspace("seed", base, map[string]string{"v": "1"})
	insertWorkspaces(t, s, seed)
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		return tx.UpsertNode(ctx, &store.Node{ID: "n", CreatedAt: base, LastSeen: base})
	})
	writes := map[string]func(tx store.Tx) error{
		"InsertWorkspace": func(tx store.Tx) error { return tx.InsertWorkspace(ctx, newWorkspace("other", base, nil)) },
		"UpdateWorkspace": func(tx store.Tx) error {
			w := *seed
			w.Generation = 9
			w.Labels = map[string]string{"v": "2"}
			return tx.UpdateWorkspace(ctx, &w)
		},
		"UpsertNode new": func(tx store.Tx) error { return tx.UpsertNode(ctx, &store.Node{ID: "other", CreatedAt: base}) },
		"UpsertNode existing": func(tx store.Tx) error {
			return tx.UpsertNode(ctx, &store.Node{ID: "n", CreatedAt: base, MemoryMiB: 9})
		},
	}
	for name, write := range writes {
		err := s.View(ctx, func(tx store.Tx) error {
			if _, err := tx.GetWorkspace(ctx, "seed"); err != nil {
				return err
			}
			return write(tx)
		})
		wantErr(t, name+" in View", err, store.ErrReadOnly)
	}
	if got, err := getWorkspace(t, s, "seed"); err != nil || !gocmp.Equal(storedWorkspace(seed), got) {
		t.Errorf("workspace after writes in View: %+v, %v", got, err)
	}
	if _, err := getWorkspace(t, s, "other"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("workspace inserted in View: %v", err)
	}
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		if n, err := tx.GetNode(ctx, "n"); err != nil || n.MemoryMiB != 0 {
			t.Errorf("node after writes in View: %+v, %v", n, err)
		}
		if _, err := tx.GetNode(ctx, "other"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("node inserted in View: %v", err)
		}
		return nil
	})
}

func testWorkspaceRollback(t *testing.T, s store.Store) {
	ctx := context.Background()
	seed := newWorkspace("seed", base, map[string]string{"v": "1"})
	insertWorkspaces(t, s, seed)
	err := s.InTx(ctx, func(tx store.Tx) error {
		if err := tx.InsertWorkspace(ctx, newWorkspace("new", base, map[string]string{"v": "1"})); err != nil {
			return err
		}
		upd := *seed
		upd.Labels = map[string]string{"v": "2"}
		upd.Generation = 2
		if err := tx.UpdateWorkspace(ctx, &upd); err != nil {
			return err
		}
		if err := tx.UpsertNode(ctx, &store.Node{ID: "n", CreatedAt: base}); err != nil {
			return err
		}
		return errBoom
	})
	if err != errBoom { //nolint:errorlint // must be returned as is
		t.Fatalf("InTx = %v, want fn's error as is", err)
	}
	_, err = getWorkspace(t, s, "new")
	wantErr(t, "workspace of a rolled back tx", err, store.ErrNotFound)
	if got, err := getWorkspace(t, s, "seed"); err != nil || !gocmp.Equal(storedWorkspace(seed), got) {
		t.Errorf("workspace updated in a rolled back tx: %+v, %v", got, err)
	}
	if page := listWorkspaces(t, s, store.WorkspaceQuery{Selector: map[string]string{"v": "2"}, Limit: 10}); len(page) != 0 {
		t.Errorf("labels of a rolled back update are listed: %v", workspaceIDs(page))
	}
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.GetNode(ctx, "n")
		wantErr(t, "node of a rolled back tx", err, store.ErrNotFound)
		return nil
	})
}

func testListWorkspacesFilters(t *testing.T, s store.Store) {
	var all []*store.Workspace
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for i := range 160 {
			labels := map[string]string{
				"app":  fmt.Sprintf("app-%d", i%4),
				"tier": fmt.Sprintf("tier-%d", i%3),
			}
			if i%2 == 0 {
				labels["even"] = ""
			}
			// IDs run against time; two Workspaces share each timestamp.
			w := newWorkspace(fmt.Sprintf("ws-%03d", 159-i), base.Add(time.Duration(i/2)*time.Millisecond), labels)
			w.State = int32(1 + i%8)
			w.GuestCondition = int32(i % 3)
			if w.State == store.WorkspaceStateDeleted {
				w.DeletedAt = w.CreatedAt.Add(time.Second)
			}
			all = append(all, storedWorkspace(w))
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
			// The same labels on an egress must not leak in.
			if err := tx.InsertResource(ctx, egress(fmt.Sprintf("eg-%03d", i), base, labels)); err != nil {
				return err
			}
		}
		return nil
	})
	sortWorkspaces(all)
	for _, q := range []store.WorkspaceQuery{
		{},
		{IncludeDeleted: true},
		{States: []int32{3}},
		{States: []int32{store.WorkspaceStateDeleted}},
		{States: []int32{5, 3}},
		{States: []int32{5, 3, 3, 5}},
		{States: []int32{1, 2, 3, 4, 5, 6, 7}},
		{States: []int32{1, store.WorkspaceStateDeleted}},                       // States wins over IncludeDeleted
		{States: []int32{2, store.WorkspaceStateDeleted}, IncludeDeleted: true}, // and is not widened by it
		{States: []int32{9}},
		{States: []int32{0, 9, 4}},
		{States: []int32{-1, 3}, GuestCondition: -2},
		{Selector: map[string]string{"even": ""}, States: []int32{math.MinInt32, 2}, GuestCondition: math.MaxInt32},
		{GuestCondition: 2},
		{GuestCondition: 1, IncludeDeleted: true},
		{GuestCondition: 7},
		{Selector: map[string]string{"app": "app-1"}},
		{Selector: map[string]string{"even": ""}},
		{Selector: map[string]string{"app": "app-1", "tier": "tier-2"}},
		{Selector: map[string]string{"app": "app-2", "tier": "tier-0", "even": ""}},
		{Selector: map[string]string{"app": "app-9"}},
		{Selector: map[string]string{"app": "app-1", "missing": "x"}},
		{Selector: map[string]string{"app": "app-1"}, IncludeDeleted: true},
		{Selector: map[string]string{"tier": "tier-0"}, States: []int32{store.WorkspaceStateDeleted}},
		{Selector: map[string]string{"tier": "tier-1"}, States: []int32{2, 4, 6}},
		{Selector: map[string]string{"even": ""}, GuestCondition: 1},
		{Selector: map[string]string{"app": "app-3", "tier": "tier-2"}, States: []int32{4, 8}, GuestCondition: 2},
		{States: []int32{3, 4, 5}, GuestCondition: 1},
		{States: []int32{6}, GuestCondition: 0},
		{States: []int32{7}, GuestCondition: 1},
	} {
		var want []*store.Workspace
		for _, w := range all {
			if matches(q, w) {
				want = append(want, w)
			}
		}
		for _, limit := range []int{3, 100} {
			q.Limit = limit
			got := listAllWorkspaces(t, s, q)
			if diff := gocmp.Diff(want, got); diff != "" {
				t.Errorf("%+v (-want +got):\n%s", q, diff)
			}
		}
	}
}

func testListWorkspacesPaging(t *testing.T, s store.Store) {
	const n = 250
	var all []*store.Workspace
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for i := range n {
			// Three Workspaces share each timestamp, so IDs break ties; IDs
			// are not in time order, and "ws-A" < "ws-a" bytewise.
			id := fmt.Sprintf("ws-%03d", (i*919)%1000)
			if i%50 == 0 {
				id = fmt.Sprintf("ws-%c%d", 'A'+i/50, i)
			} else if i%50 == 1 {
				id = fmt.Sprintf("ws-%c%d", 'a'+i/50, i)
			}
			w := newWorkspace(id, base.Add(time.Duration(i/3)*time.Microsecond), map[string]string{"n": fmt.Sprint(i), "all": "yes"})
			w.State = int32(1 + (i*7)%8)
			all = append(all, storedWorkspace(w))
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	})
	sortWorkspaces(all)
	for _, q := range []store.WorkspaceQuery{
		{},
		{IncludeDeleted: true},
		{States: []int32{2}},
		{States: []int32{2, 3, store.WorkspaceStateDeleted}},
		{Selector: map[string]string{"all": "yes"}},
		{Selector: map[string]string{"all": "yes"}, IncludeDeleted: true},
	} {
		var want []*store.Workspace
		for _, w := range all {
			if matches(q, w) {
				want = append(want, w)
			}
		}
		for _, limit := range []int{1, 7, 100, n, n + 1} {
			q.Limit = limit
			got := listAllWorkspaces(t, s, q)
			if diff := gocmp.Diff(workspaceIDs(want), workspaceIDs(got)); diff != "" {
				t.Errorf("%+v: IDs (-want +got):\n%s", q, diff)
			} else if limit == 7 || limit == 100 {
				if diff := gocmp.Diff(want, got); diff != "" {
					t.Errorf("%+v: workspaces (-want +got):\n%s", q, diff)
				}
			}
		}
	}
	// A cursor between two items of the same timestamp.
	mid := all[100]
	for _, q := range []store.WorkspaceQuery{
		{IncludeDeleted: true},
		{States: []int32{1, 2, 3, 4, 5, 6, 7, 8}},
		{Selector: map[string]string{"all": "yes"}, IncludeDeleted: true},
	} {
		q.After = &store.Cursor{CreatedAt: mid.CreatedAt, ID: mid.ID}
		q.Limit = 5
		if diff := gocmp.Diff(workspaceIDs(all[101:106]), workspaceIDs(listWorkspaces(t, s, q))); diff != "" {
			t.Errorf("%+v: page after %v (-want +got):\n%s", q, mid.ID, diff)
		}
	}
	if got := listWorkspaces(t, s, store.WorkspaceQuery{IncludeDeleted: true, Limit: 0}); len(got) != 0 {
		t.Errorf("limit 0 returned %d items", len(got))
	}
}

func testWorkspacesOnNode(t *testing.T, s store.Store) {
	var want []*store.Workspace
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for i := range 40 {
			w := newWorkspace(fmt.Sprintf("ws-%02d", 39-i), base.Add(time.Duration(i/2)*time.Second), map[string]string{"i": fmt.Sprint(i)})
			switch i % 5 {
			case 0:
				w.NodeID = "node-b"
			case 1:
				w.NodeID = ""
			case 2:
				// Deletion completed.
				w.State, w.DeletedAt = store.WorkspaceStateDeleted, base.Add(time.Hour)
			case 3:
				// Deleting: still on the node.
				w.State = 7
			}
			if w.NodeID == "node-a" && w.DeletedAt.IsZero() {
				want = append(want, storedWorkspace(w))
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	})
	sortWorkspaces(want)
	onNode := func(node string) []*store.Workspace {
		t.Helper()
		var got []*store.Workspace
		view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
			got, err = tx.WorkspacesOnNode(ctx, node)
			return err
		})
		return got
	}
	if diff := gocmp.Diff(want, onNode("node-a")); diff != "" {
		t.Errorf("WorkspacesOnNode(node-a) (-want +got):\n%s", diff)
	}
	if got := onNode("node-b"); len(got) != 8 {
		t.Errorf("WorkspacesOnNode(node-b): %d workspaces, want 8", len(got))
	}
	if got := onNode("node-c"); len(got) != 0 {
		t.Errorf("WorkspacesOnNode(node-c): %v, want none", workspaceIDs(got))
	}
	// Moving a Workspace and completing a deletion are seen.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		w, err := tx.GetWorkspace(ctx, want[0].ID)
		if err != nil {
			return err
		}
		w.NodeID = "node-c"
		if err := tx.UpdateWorkspace(ctx, w); err != nil {
			return err
		}
		w, err = tx.GetWorkspace(ctx, want[1].ID)
		if err != nil {
			return err
		}
		w.State, w.DeletedAt = store.WorkspaceStateDeleted, base.Add(2*time.Hour)
		return tx.UpdateWorkspace(ctx, w)
	})
	if diff := gocmp.Diff(workspaceIDs(want[2:]), workspaceIDs(onNode("node-a"))); diff != "" {
		t.Errorf("WorkspacesOnNode(node-a) after moves (-want +got):\n%s", diff)
	}
	if got := workspaceIDs(onNode("node-c")); !slices.Equal(got, []string{want[0].ID}) {
		t.Errorf("WorkspacesOnNode(node-c) after moves: %v, want [%s]", got, want[0].ID)
	}
}

// testNodeUsage: NodeUsage sums the memory and CPU of the node's Workspaces desired
// RUNNING and the writable layers of all of them whose deletion has not
// completed, and follows every change of the columns, the power, the node
// and the deletion.
func testNodeUsage(t *testing.T, s store.Store) {
	usage := func(node string) store.NodeUsage {
		t.Helper()
		var u store.NodeUsage
		view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
			u, err = tx.NodeUsage(ctx, node)
			return err
		})
		return u
	}
	if got := usage("node-a"); got != (store.NodeUsage{}) {
		t.Errorf("NodeUsage of an empty store: %+v, want zero", got)
	}
	want := map[string]store.NodeUsage{}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for i := range 60 {
			w := newWorkspace(fmt.Sprintf("ws-%02d", i), base.Add(time.Duration(i)*time.Second), nil)
			w.MemoryMiB, w.LayerBytes, w.CPUMillis = uint64(1+i), uint64(1000*(1+i))<<20, uint64(100*(1+i))
			w.NodeID = []string{"node-a", "node-b", ""}[i%3]
			switch i % 4 {
			case 1:
				w.Power = store.PowerStopped
			case 2:
				w.Power = store.PowerDeleted // deleting: its layer still counts
			case 3:
				if i%8 == 7 {
					// Deletion completed: counts nothing.
					w.Power, w.State, w.DeletedAt = store.PowerDeleted, store.WorkspaceStateDeleted, base.Add(time.Hour)
				}
			}
			if w.NodeID != "" && w.DeletedAt.IsZero() {
				u := want[w.NodeID]
				u.LayerBytes += w.LayerBytes
				if w.Power == store.PowerRunning {
					u.RunningMemoryMiB += w.MemoryMiB
					u.RunningCPUMillis += w.CPUMillis
				}
				want[w.NodeID] = u
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	})
	for _, node := range []string{"node-a", "node-b", "node-c"} {
		if got := usage(node); got != want[node] {
			t.Errorf("NodeUsage(%s) = %+v, want %+v", node, got, want[node])
		}
	}
	// A change of memory, layer, power, node or deletion is seen at once,
	// in the transaction that makes it and after.
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
		a := want["node-a"]
		update("ws-00", func(w *store.Workspace) { w.MemoryMiB, w.LayerBytes, w.CPUMillis = 4096, 5<<30, 8000 }) // node-a, running: 1 MiB, 1000 MiB, 100 m
		a.RunningMemoryMiB += 4096 - 1
		a.LayerBytes += 5<<30 - 1000<<20
		a.RunningCPUMillis += 8000 - 100
		update("ws-12", func(w *store.Workspace) { w.Power = store.PowerStopped }) // node-a, running: 13 MiB, 1300 m
		a.RunningMemoryMiB -= 13
		a.RunningCPUMillis -= 1300
		update("ws-13", func(w *store.Workspace) { w.Power = store.PowerRunning }) // node-b, stopped: 14 MiB → node-a
		update("ws-13", func(w *store.Workspace) { w.NodeID = "node-a" })
		b := want["node-b"]
		b.LayerBytes -= 14000 << 20
		a.RunningMemoryMiB += 14
		a.RunningCPUMillis += 1400
		a.LayerBytes += 14000 << 20
		update("ws-06", func(w *store.Workspace) { // node-a, deleting: 7000 MiB
			w.State, w.DeletedAt = store.WorkspaceStateDeleted, base.Add(2*time.Hour)
		})
		a.LayerBytes -= 7000 << 20
		want["node-a"], want["node-b"] = a, b
		for _, node := range []string{"node-a", "node-b"} {
			got, err := tx.NodeUsage(ctx, node)
			if err != nil {
				return err
			}
			if got != want[node] {
				t.Errorf("NodeUsage(%s) in the transaction = %+v, want %+v", node, got, want[node])
			}
		}
		return nil
	})
	for _, node := range []string{"node-a", "node-b"} {
		if got := usage(node); got != want[node] {
			t.Errorf("NodeUsage(%s) after the changes = %+v, want %+v", node, got, want[node])
		}
	}
	// NodeUsages is NodeUsage of every node at once; unplaced Workspaces
	// belong to none.
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		all, err := tx.NodeUsages(ctx)
		if err != nil {
			return err
		}
		if len(all) != 2 || all["node-a"] != want["node-a"] || all["node-b"] != want["node-b"] {
			t.Errorf("NodeUsages = %+v, want node-a %+v, node-b %+v", all, want["node-a"], want["node-b"])
		}
		return nil
	})
}

func testPendingWorkspaces(t *testing.T, s store.Store) {
	type tc struct {
		id           string
		gen, obs     uint64
		node         string
		command      string
		deleted      bool
		wantPending  bool
		secondsAfter int
	}
	cases := []tc{
		{id: "ahead", gen: 2, obs: 1, node: "n", wantPending: true, secondsAfter: 5},
		{id: "done", gen: 2, obs: 2, node: "n", secondsAfter: 1},
		{id: "unplaced", gen: 1, obs: 1, node: "", command: "c-unplaced", wantPending: true, secondsAfter: 3},
		{id: "unplaced-new", gen: 0, obs: 0, node: "", command: "c-unplaced-new", wantPending: true, secondsAfter: 3},
		// A failed placement waits for a new command: not pending, however
		// far its generation is ahead.
		{id: "placement-failed", gen: 1, obs: 0, node: "", secondsAfter: 0},
		{id: "placement-failed-2", gen: 0, obs: 0, node: "", secondsAfter: 0},
		{id: "deleted-ahead", gen: 3, obs: 1, node: "n", deleted: true, secondsAfter: 0},
		{id: "deleted-unplaced", gen: 1, obs: 1, node: "", deleted: true, secondsAfter: 0},
		{id: "behind", gen: 1, obs: 2, node: "n", secondsAfter: 2},
		{id: "huge", gen: math.MaxInt64, obs: math.MaxInt64 - 1, node: "n", wantPending: true, secondsAfter: 4},
		{id: "huge-done", gen: math.MaxInt64, obs: math.MaxInt64, node: "n", secondsAfter: 4},
		{id: "a-first", gen: 5, obs: 0, node: "n", wantPending: true, secondsAfter: 3},
	}
	var want []*store.Workspace
	var ws []*store.Workspace
	for _, c := range cases {
		w := newWorkspace(c.id, base.Add(time.Duration(c.secondsAfter)*time.Second), map[string]string{"id": c.id})
		w.Generation, w.ObservedGeneration, w.NodeID, w.CommandID = c.gen, c.obs, c.node, c.command
		if c.deleted {
			w.State, w.DeletedAt = store.WorkspaceStateDeleted, base
		}
		ws = append(ws, w)
		if c.wantPending {
			want = append(want, storedWorkspace(w))
		}
	}
	insertWorkspaces(t, s, ws...)
	sortWorkspaces(want)
	pending := func(limit int) []*store.Workspace {
		t.Helper()
		var got []*store.Workspace
		view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
			got, err = tx.PendingWorkspaces(ctx, limit)
			return err
		})
		return got
	}
	if diff := gocmp.Diff(want, pending(100)); diff != "" {
		t.Errorf("PendingWorkspaces (-want +got):\n%s", diff)
	}
	for _, limit := range []int{1, 2, len(want)} {
		if diff := gocmp.Diff(workspaceIDs(want[:limit]), workspaceIDs(pending(limit))); diff != "" {
			t.Errorf("PendingWorkspaces(%d) (-want +got):\n%s", limit, diff)
		}
	}
	if got := pending(0); len(got) != 0 {
		t.Errorf("PendingWorkspaces(0) returned %d", len(got))
	}
	// Catching up, placement and deletion take Workspaces out; a new
	// generation brings one in.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for id, f := range map[string]func(*store.Workspace){
			"ahead":    func(w *store.Workspace) { w.ObservedGeneration = w.Generation },
			"unplaced": func(w *store.Workspace) { w.NodeID = "n" },
			"a-first":  func(w *store.Workspace) { w.State, w.DeletedAt = store.WorkspaceStateDeleted, base.Add(time.Hour) },
			"done":     func(w *store.Workspace) { w.Generation++ },
		} {
			w, err := tx.GetWorkspace(ctx, id)
			if err != nil {
				return err
			}
			f(w)
			if err := tx.UpdateWorkspace(ctx, w); err != nil {
				return err
			}
		}
		return nil
	})
	if got, want := workspaceIDs(pending(100)), []string{"done", "unplaced-new", "huge"}; !slices.Equal(got, want) {
		t.Errorf("PendingWorkspaces after updates: %v, want %v", got, want)
	}
}

func testProcessingCommands(t *testing.T, s store.Store) {
	cmds := []*store.Command{
		{ID: "c-3", ObjectKind: "workspace", ObjectID: "w1", Method: "m", Kind: 2, Initiator: 1, Fingerprint: []byte{1}, Status: store.CommandProcessing, CreatedAt: base.Add(2 * time.Second)},
		{ID: "c-1", ObjectKind: "workspace", ObjectID: "w2", Status: store.CommandProcessing, CreatedAt: base.Add(time.Second)},
		{ID: "c-2", ObjectKind: "workspace", ObjectID: "w3", Status: store.CommandProcessing, CreatedAt: base.Add(2 * time.Second)},
		{ID: "c-0", ObjectKind: "workspace", ObjectID: "w4", Status: store.CommandCompleted, Result: []byte("r"), CreatedAt: base, CompletedAt: base.Add(time.Second)},
		{ID: "c-4", ObjectKind: "egress", ObjectID: "e1", Status: store.CommandProcessing, CreatedAt: base},
		{ID: "c-5", ObjectKind: "workspace", ObjectID: "w5", Status: store.CommandProcessing, CreatedAt: base.Add(-time.Hour)},
		{ID: "c-6", ObjectKind: "workspace", ObjectID: "w6", Status: store.CommandCompleted, ErrorCode: "aborted", CreatedAt: base.Add(-2 * time.Hour), CompletedAt: base},
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for _, c := range cmds {
			if err := tx.InsertCommand(ctx, c); err != nil {
				return err
			}
		}
		return nil
	})
	processing := func(kind string, limit int) []*store.Command {
		t.Helper()
		var got []*store.Command
		view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
			got, err = tx.ProcessingCommands(ctx, kind, limit)
			return err
		})
		return got
	}
	stored := func(c *store.Command) *store.Command {
		w := *c
		w.CreatedAt = micro(c.CreatedAt)
		return &w
	}
	want := []*store.Command{stored(cmds[5]), stored(cmds[1]), stored(cmds[2]), stored(cmds[0])}
	if diff := gocmp.Diff(want, processing("workspace", 10)); diff != "" {
		t.Errorf("ProcessingCommands(workspace) (-want +got):\n%s", diff)
	}
	if diff := gocmp.Diff(want[:2], processing("workspace", 2)); diff != "" {
		t.Errorf("ProcessingCommands(workspace, 2) (-want +got):\n%s", diff)
	}
	if diff := gocmp.Diff([]*store.Command{stored(cmds[4])}, processing("egress", 10)); diff != "" {
		t.Errorf("ProcessingCommands(egress) (-want +got):\n%s", diff)
	}
	if got := processing("resolver", 10); len(got) != 0 {
		t.Errorf("ProcessingCommands(resolver): %d commands", len(got))
	}
	if got := processing("workspace", 0); len(got) != 0 {
		t.Errorf("ProcessingCommands(workspace, 0): %d commands", len(got))
	}
	// Completing a command takes it out.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		c := *cmds[1]
		c.Status, c.CompletedAt = store.CommandCompleted, base.Add(time.Minute)
		return tx.UpdateCommand(ctx, &c)
	})
	if diff := gocmp.Diff([]*store.Command{want[0], want[2], want[3]}, processing("workspace", 10)); diff != "" {
		t.Errorf("ProcessingCommands(workspace) after completion (-want +got):\n%s", diff)
	}
}

func testNodes(t *testing.T, s store.Store) {
	getNode := func(id string) (*store.Node, error) {
		t.Helper()
		var n *store.Node
		var err error
		view(t, s, func(ctx context.Context, tx store.Tx) error {
			n, err = tx.GetNode(ctx, id)
			return nil
		})
		return n, err
	}
	listNodes := func() []*store.Node {
		t.Helper()
		var ns []*store.Node
		view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
			ns, err = tx.ListNodes(ctx)
			return err
		})
		return ns
	}
	storedNode := func(n *store.Node) *store.Node {
		w := *n
		w.CreatedAt, w.LastSeen = micro(n.CreatedAt), micro(n.LastSeen)
		if len(w.Doc) == 0 {
			w.Doc = nil
		}
		if len(w.CertKeyHash) == 0 {
			w.CertKeyHash = nil
		}
		return &w
	}
	if got := listNodes(); len(got) != 0 {
		t.Errorf("ListNodes of an empty store: %d nodes", len(got))
	}
	a := &store.Node{ID: "node-a", CreatedAt: base, LastSeen: base.Add(time.Second + 1), MemoryMiB: 64 << 10, CPUMillis: 16000, StorageBytes: 1 << 40, Doc: []byte{0, 1, 2}, CertKeyHash: []byte{0xff, 0, 7}}
	b := &store.Node{ID: "node-B", CreatedAt: base.Add(time.Minute), LastSeen: base.Add(time.Minute), MemoryMiB: math.MaxInt64, CPUMillis: 0, StorageBytes: math.MaxInt64}
	c := &store.Node{ID: "node-c", CreatedAt: base, LastSeen: base, Doc: []byte{}, CertKeyHash: []byte{}}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for _, n := range []*store.Node{a, b, c} {
			if err := tx.UpsertNode(ctx, n); err != nil {
				return err
			}
		}
		return nil
	})
	got, err := getNode("node-a")
	if err != nil {
		t.Fatalf("GetNode: %v", err)
	}
	// A new node's revision is 1; UpsertNode stores the epoch as given.
	wantA := storedNode(a)
	wantA.Revision = 1
	if diff := gocmp.Diff(wantA, got); diff != "" {
		t.Errorf("GetNode (-want +got):\n%s", diff)
	}
	checkUTC(t, "GetNode", got.CreatedAt, got.LastSeen)
	// By ID, bytewise: "node-B" < "node-a".
	wantB, wantC := storedNode(b), storedNode(c)
	wantB.Revision, wantC.Revision = 1, 1
	if diff := gocmp.Diff([]*store.Node{wantB, wantA, wantC}, listNodes()); diff != "" {
		t.Errorf("ListNodes (-want +got):\n%s", diff)
	}

	// Replacing a node replaces every field but CreatedAt.
	a2 := &store.Node{ID: "node-a", CreatedAt: base.Add(time.Hour), LastSeen: base.Add(time.Hour + 1), MemoryMiB: 1, CPUMillis: 2, StorageBytes: 3}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpsertNode(ctx, a2) })
	want := storedNode(a2)
	want.CreatedAt, want.Revision = micro(a.CreatedAt), 2
	if got, err := getNode("node-a"); err != nil || !gocmp.Equal(want, got) {
		t.Errorf("GetNode after replace: %+v, %v; want %+v", got, err, want)
	}
	if got := listNodes(); len(got) != 3 {
		t.Errorf("ListNodes after replace: %d nodes, want 3", len(got))
	}

	err = s.InTx(context.Background(), func(tx store.Tx) error {
		return tx.UpsertNode(context.Background(), &store.Node{ID: "huge", MemoryMiB: math.MaxUint64})
	})
	if err == nil {
		t.Error("UpsertNode with MemoryMiB 2^64-1: no error")
	}
	_, err = getNode("node-missing")
	wantErr(t, "GetNode missing", err, store.ErrNotFound)
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.GetNode(ctx, "node-missing")
		wantErr(t, "GetNode missing (in InTx)", err, store.ErrNotFound)
		return nil
	})
}

// testDeniedNodeKeys: a denied key is found by its hash with its record;
// denying it again keeps the first record; a key that is not denied is
// ErrNotFound; a write in View is refused and a rolled back one leaves
// nothing.
func testDeniedNodeKeys(t *testing.T, s store.Store) {
	ctx := context.Background()
	get := func(h []byte) (*store.DeniedNodeKey, error) {
		t.Helper()
		var k *store.DeniedNodeKey
		var err error
		view(t, s, func(ctx context.Context, tx store.Tx) error {
			k, err = tx.GetDeniedNodeKey(ctx, h)
			return nil
		})
		return k, err
	}
	h1 := bytes.Repeat([]byte{0xa1}, 32)
	h2 := append(bytes.Repeat([]byte{0xa1}, 31), 0) // shares a prefix with h1
	_, err := get(h1)
	wantErr(t, "GetDeniedNodeKey of an empty store", err, store.ErrNotFound)

	first := &store.DeniedNodeKey{KeyHash: h1, NodeID: "node-é", DeniedAt: base, Reason: "retired"}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.DenyNodeKey(ctx, first) })
	want := *first
	want.DeniedAt = micro(base)
	got, err := get(h1)
	if err != nil || !gocmp.Equal(&want, got) {
		t.Errorf("GetDeniedNodeKey = %+v, %v; want %+v", got, err, &want)
	} else {
		checkUTC(t, "GetDeniedNodeKey", got.DeniedAt)
	}
	// Again, in one transaction with a lookup: no error, the first record
	// stays.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := tx.DenyNodeKey(ctx, &store.DeniedNodeKey{KeyHash: h1, NodeID: "other", DeniedAt: base.Add(time.Hour), Reason: "again"}); err != nil {
			return err
		}
		if k, err := tx.GetDeniedNodeKey(ctx, h1); err != nil || k.NodeID != "node-é" {
			t.Errorf("GetDeniedNodeKey in the denying transaction = %+v, %v", k, err)
		}
		return nil
	})
	if got, err := get(h1); err != nil || !gocmp.Equal(&want, got) {
		t.Errorf("after denying again: %+v, %v; want the first record %+v", got, err, &want)
	}
	for name, h := range map[string][]byte{"prefix sibling": h2, "empty": nil, "prefix": h1[:16]} {
		_, err := get(h)
		wantErr(t, "GetDeniedNodeKey of "+name, err, store.ErrNotFound)
	}
	if err := s.InTx(ctx, func(tx store.Tx) error { return tx.DenyNodeKey(ctx, &store.DeniedNodeKey{NodeID: "n"}) }); err == nil {
		t.Error("DenyNodeKey without a key hash: no error")
	}
	err = s.View(ctx, func(tx store.Tx) error {
		return tx.DenyNodeKey(ctx, &store.DeniedNodeKey{KeyHash: h2, NodeID: "n", DeniedAt: base})
	})
	wantErr(t, "DenyNodeKey in View", err, store.ErrReadOnly)
	err = s.InTx(ctx, func(tx store.Tx) error {
		if err := tx.DenyNodeKey(ctx, &store.DeniedNodeKey{KeyHash: h2, NodeID: "n", DeniedAt: base}); err != nil {
			return err
		}
		return errBoom
	})
	if err != errBoom { //nolint:errorlint // must be returned as is
		t.Fatalf("InTx = %v, want fn's error as is", err)
	}
	_, err = get(h2)
	wantErr(t, "a key denied in a rolled back tx", err, store.ErrNotFound)
}

// testConcurrentWorkspaces inserts and updates Workspaces from many
// goroutines at once: every transaction must commit (PostgreSQL retries its
// serialization failures).
func testConcurrentWorkspaces(t *testing.T, s store.Store) {
	ctx := context.Background()
	const n = 100
	run := func(stage string, fn func(i int, tx store.Tx) error) {
		t.Helper()
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { errs[i] = s.InTx(ctx, func(tx store.Tx) error { return fn(i, tx) }) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("%s %d: %v", stage, i, err)
			}
		}
	}
	run("insert", func(i int, tx store.Tx) error {
		return tx.InsertWorkspace(ctx, newWorkspace(fmt.Sprintf("c-%03d", i), base.Add(time.Duration(i)*time.Microsecond),
			map[string]string{"i": fmt.Sprint(i), "all": "yes"}))
	})
	run("update", func(i int, tx store.Tx) error {
		w, err := tx.GetWorkspace(ctx, fmt.Sprintf("c-%03d", i))
		if err != nil {
			return err
		}
		w.Generation++
		w.Labels["i"] = fmt.Sprint(i * 2)
		w.Labels["updated"] = "yes"
		return tx.UpdateWorkspace(ctx, w)
	})
	got := listAllWorkspaces(t, s, store.WorkspaceQuery{Selector: map[string]string{"all": "yes", "updated": "yes"}, Limit: 32})
	if len(got) != n {
		t.Fatalf("listed %d workspaces, want %d", len(got), n)
	}
	for i, w := range got {
		if want := fmt.Sprintf("c-%03d", i); w.ID != want || w.Labels["i"] != fmt.Sprint(i*2) || w.Generation != 1 {
			t.Errorf("item %d: %s %v generation %d, want %s", i, w.ID, w.Labels, w.Generation, want)
		}
	}
}
