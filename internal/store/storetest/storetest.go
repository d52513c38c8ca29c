// Package storetest is the conformance suite every store.Store dialect must
// pass. A dialect's tests call Run with a function that opens a new, empty
// store.
//
// Conventions the suite pins down (every dialect must follow them):
//   - Timestamps come back in UTC, truncated to microseconds; a zero
//     Command.CompletedAt comes back zero.
//   - Resource.Labels and Resource.Annotations always come back non-nil,
//     empty when there are none; nil and empty maps are stored alike.
//   - Byte fields (Spec, Fingerprint, Result, ErrorDetail) come back nil when
//     empty.
//   - Command.Message is written by InsertCommand only: UpdateCommand
//     keeps it.
//   - An ErrDuplicate from InsertCommand or InsertResource leaves the
//     transaction usable.
//   - ListResources orders by (CreatedAt, ID), comparing IDs bytewise.
//   - Workspaces follow the same conventions (Doc nil when empty, Labels
//     non-nil); a zero DeletedAt or ObservedAt comes back zero. Every
//     Workspace listing orders by (CreatedAt, ID); PendingWorkspaces and
//     ProcessingCommands are oldest first by (CreatedAt, ID), and a limit of
//     0 or less returns nothing.
//   - UpdateWorkspace keeps the stored CreatedAt; UpsertNode replacing a
//     node keeps the CreatedAt it was first stored with. ListNodes orders by
//     ID bytewise.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kibotos/kibotos/internal/store"
)

// Run runs the conformance suite against the stores open returns. open is
// called once per subtest and must return a new, empty store; it is
// responsible for closing it (with t.Cleanup).
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(*testing.T, store.Store)
	}{
		{"Ping", testPing},
		{"Commands", testCommands},
		{"CommandMessage", testCommandMessage},
		{"Resources", testResources},
		{"EmptyMaps", testEmptyMaps},
		{"LabelsReplaced", testLabelsReplaced},
		{"Timestamps", testTimestamps},
		{"ListPaging", testListPaging},
		{"ListPagingWithChurn", testListPagingWithChurn},
		{"ListSelectors", testListSelectors},
		{"KindsIsolated", testKindsIsolated},
		{"References", testReferences},
		{"Rollback", testRollback},
		{"ViewReadOnly", testViewReadOnly},
		{"ViewSnapshot", testViewSnapshot},
		{"Secret", testSecret},
		{"ConcurrentSameCommand", testConcurrentSameCommand},
		{"ConcurrentInserts", testConcurrentInserts},
		{"Notify", testNotify},
	}
	tests = append(tests, workspaceTests...)
	tests = append(tests, blobTests...)
	tests = append(tests, retentionTests...)
	tests = append(tests, leaseTests...)
	tests = append(tests, nodeStateTests...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t)) })
	}
}

var errBoom = errors.New("storetest: boom")

// zone is a non-UTC location: inputs use it, outputs must be UTC.
var zone = time.FixedZone("UTC+05:30", 5*3600+1800)

// base is an input time with sub-microsecond digits.
var base = time.Date(2024, 3, 1, 12, 0, 0, 123456789, zone)

// micro is what a store returns for t.
func micro(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

func inTx(t *testing.T, s store.Store, fn func(ctx context.Context, tx store.Tx) error) {
	t.Helper()
	ctx := context.Background()
	if err := s.InTx(ctx, func(tx store.Tx) error { return fn(ctx, tx) }); err != nil {
		t.Fatalf("InTx: %v", err)
	}
}

func view(t *testing.T, s store.Store, fn func(ctx context.Context, tx store.Tx) error) {
	t.Helper()
	ctx := context.Background()
	if err := s.View(ctx, func(tx store.Tx) error { return fn(ctx, tx) }); err != nil {
		t.Fatalf("View: %v", err)
	}
}

func getCommand(t *testing.T, s store.Store, id string) (*store.Command, error) {
	t.Helper()
	var c *store.Command
	var err error
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		c, err = tx.GetCommand(ctx, id)
		return nil
	})
	return c, err
}

func getResource(t *testing.T, s store.Store, kind store.ResourceKind, id string) (*store.Resource, error) {
	t.Helper()
	var r *store.Resource
	var err error
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		r, err = tx.GetResource(ctx, kind, id)
		return nil
	})
	return r, err
}

func list(t *testing.T, s store.Store, q store.ListQuery) []*store.Resource {
	t.Helper()
	var page []*store.Resource
	view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
		page, err = tx.ListResources(ctx, q)
		return err
	})
	return page
}

// listAll pages through q with q.Limit and returns every item, checking that
// pages are full until the last one.
func listAll(t *testing.T, s store.Store, q store.ListQuery) []*store.Resource {
	t.Helper()
	return pageAll(t, q.Limit, func(after *store.Cursor) []*store.Resource {
		q.After = after
		return list(t, s, q)
	}, func(r *store.Resource) store.Cursor { return store.Cursor{CreatedAt: r.CreatedAt, ID: r.ID} })
}

// pageAll fetches pages of up to limit items, each after the cursor of the
// previous page's last item, until a page is not full, and returns them all.
func pageAll[T any](t *testing.T, limit int, fetch func(after *store.Cursor) []T, cursor func(T) store.Cursor) []T {
	t.Helper()
	var all []T
	var after *store.Cursor
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("paging does not end")
		}
		page := fetch(after)
		if len(page) > limit {
			t.Fatalf("page of %d items over the limit %d", len(page), limit)
		}
		all = append(all, page...)
		if len(page) < limit {
			return all
		}
		c := cursor(page[len(page)-1])
		after = &c
	}
}

func ids(rs []*store.Resource) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

// checkUTC fails unless every time is in UTC at microsecond precision.
func checkUTC(t *testing.T, what string, ts ...time.Time) {
	t.Helper()
	for _, tm := range ts {
		if tm.IsZero() {
			continue
		}
		if tm.Location() != time.UTC {
			t.Errorf("%s: time %v is in %v, want UTC", what, tm, tm.Location())
		}
		if tm.Nanosecond()%1000 != 0 {
			t.Errorf("%s: time %v has sub-microsecond digits", what, tm)
		}
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: error %v, want %v", what, err, want)
	}
}

func testPing(t *testing.T, s store.Store) {
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

func testCommands(t *testing.T, s store.Store) {
	c := &store.Command{
		ID:          "cmd-1",
		Method:      "kibotos.ctrl.v1.EgressService/CreateEgress",
		Fingerprint: []byte{1, 2, 3, 0, 255},
		ObjectKind:  "egress",
		ObjectID:    "eg-1",
		Kind:        3,
		Initiator:   1,
		Status:      store.CommandProcessing,
		CreatedAt:   base,
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.InsertCommand(ctx, c) })

	want := *c
	want.CreatedAt = micro(c.CreatedAt)
	got, err := getCommand(t, s, "cmd-1")
	if err != nil {
		t.Fatalf("GetCommand: %v", err)
	}
	if diff := cmp.Diff(&want, got); diff != "" {
		t.Errorf("GetCommand after insert (-want +got):\n%s", diff)
	}
	checkUTC(t, "GetCommand", got.CreatedAt)
	if !got.CompletedAt.IsZero() {
		t.Errorf("CompletedAt = %v, want zero while processing", got.CompletedAt)
	}

	// A duplicate is ErrDuplicate, changes nothing, and leaves the
	// transaction usable.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		dup := *c
		dup.Method = "other"
		wantErr(t, "InsertCommand duplicate", tx.InsertCommand(ctx, &dup), store.ErrDuplicate)
		other := *c
		other.ID = "cmd-2"
		return tx.InsertCommand(ctx, &other)
	})
	if got, err := getCommand(t, s, "cmd-1"); err != nil || got.Method != c.Method {
		t.Errorf("after duplicate insert: %+v, %v; want the original", got, err)
	}
	if _, err := getCommand(t, s, "cmd-2"); err != nil {
		t.Errorf("insert after a duplicate in the same transaction: %v", err)
	}

	// Update replaces the mutable fields only.
	upd := *c
	upd.Method = "ignored"
	upd.ObjectID = "ignored"
	upd.Status = store.CommandCompleted
	upd.Result = []byte("result")
	upd.CompletedAt = base.Add(1500 * time.Millisecond).Add(7 * time.Nanosecond)
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateCommand(ctx, &upd) })
	want.Status, want.Result, want.CompletedAt = store.CommandCompleted, []byte("result"), micro(upd.CompletedAt)
	got, err = getCommand(t, s, "cmd-1")
	if err != nil {
		t.Fatalf("GetCommand: %v", err)
	}
	if diff := cmp.Diff(&want, got); diff != "" {
		t.Errorf("GetCommand after update (-want +got):\n%s", diff)
	}
	checkUTC(t, "GetCommand", got.CreatedAt, got.CompletedAt)

	// A failure outcome.
	upd.Result = nil
	upd.ErrorCode = "failed_precondition"
	upd.ErrorDetail = []byte{9, 8, 7}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateCommand(ctx, &upd) })
	want.Result, want.ErrorCode, want.ErrorDetail = nil, "failed_precondition", []byte{9, 8, 7}
	got, _ = getCommand(t, s, "cmd-1")
	if diff := cmp.Diff(&want, got); diff != "" {
		t.Errorf("GetCommand after failure update (-want +got):\n%s", diff)
	}

	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		missing := *c
		missing.ID = "cmd-missing"
		wantErr(t, "UpdateCommand missing", tx.UpdateCommand(ctx, &missing), store.ErrNotFound)
		_, err := tx.GetCommand(ctx, "cmd-missing")
		wantErr(t, "GetCommand missing (in InTx)", err, store.ErrNotFound)
		return nil
	})
	_, err = getCommand(t, s, "cmd-missing")
	wantErr(t, "GetCommand missing", err, store.ErrNotFound)
}

func egress(id string, createdAt time.Time, labels map[string]string) *store.Resource {
	return &store.Resource{
		Kind:                store.KindEgress,
		ID:                  id,
		CreatedAt:           createdAt,
		UpdatedAt:           createdAt,
		Revision:            1,
		Spec:                []byte("spec:" + id),
		Labels:              labels,
		LabelsRevision:      1,
		Annotations:         map[string]string{},
		AnnotationsRevision: 1,
	}
}

// stored is what a store returns for r.
func stored(r *store.Resource) *store.Resource {
	w := *r
	w.CreatedAt, w.UpdatedAt = micro(r.CreatedAt), micro(r.UpdatedAt)
	w.Labels = map[string]string{}
	for k, v := range r.Labels {
		w.Labels[k] = v
	}
	w.Annotations = map[string]string{}
	for k, v := range r.Annotations {
		w.Annotations[k] = v
	}
	if len(w.Spec) == 0 {
		w.Spec = nil
	}
	return &w
}

func testResources(t *testing.T, s store.Store) {
	r := egress("eg-1", base, map[string]string{"app": "web", "tier": "front"})
	r.Annotations = map[string]string{"note": "hello", "json": `{"a":[1,2]}`}
	r.Revision, r.LabelsRevision, r.AnnotationsRevision = 3, 5, 7
	r.DrainSeconds = 600
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.InsertResource(ctx, r) })

	got, err := getResource(t, s, store.KindEgress, "eg-1")
	if err != nil {
		t.Fatalf("GetResource: %v", err)
	}
	if diff := cmp.Diff(stored(r), got); diff != "" {
		t.Errorf("GetResource (-want +got):\n%s", diff)
	}
	checkUTC(t, "GetResource", got.CreatedAt, got.UpdatedAt)

	// The same ID under another kind is another resource.
	res := egress("eg-1", base.Add(time.Second), map[string]string{"app": "dns"})
	res.Kind = store.KindResolver
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.InsertResource(ctx, res) })
	if got, err := getResource(t, s, store.KindResolver, "eg-1"); err != nil || got.Labels["app"] != "dns" {
		t.Errorf("GetResource resolver: %+v, %v", got, err)
	}

	// A duplicate is ErrDuplicate and leaves the transaction usable.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		dup := egress("eg-1", base, map[string]string{"other": "x"})
		wantErr(t, "InsertResource duplicate", tx.InsertResource(ctx, dup), store.ErrDuplicate)
		return tx.InsertResource(ctx, egress("eg-2", base, nil))
	})
	if got, _ := getResource(t, s, store.KindEgress, "eg-1"); got == nil || !cmp.Equal(got.Labels, r.Labels) {
		t.Errorf("labels after a duplicate insert: %+v", got)
	}
	if _, err := getResource(t, s, store.KindEgress, "eg-2"); err != nil {
		t.Errorf("insert after a duplicate in the same transaction: %v", err)
	}

	// Update replaces every mutable field; CreatedAt stays.
	upd := *r
	upd.CreatedAt = base.Add(time.Hour)
	upd.UpdatedAt = base.Add(2 * time.Second)
	upd.Revision, upd.LabelsRevision, upd.AnnotationsRevision = 4, 6, 8
	upd.DrainSeconds = 0
	upd.Spec = []byte("spec v2")
	upd.Labels = map[string]string{"app": "api"}
	upd.Annotations = map[string]string{"note": "changed"}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateResource(ctx, &upd) })
	want := stored(&upd)
	want.CreatedAt = micro(r.CreatedAt)
	got, err = getResource(t, s, store.KindEgress, "eg-1")
	if err != nil {
		t.Fatalf("GetResource: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GetResource after update (-want +got):\n%s", diff)
	}

	// Not found.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		missing := egress("eg-missing", base, nil)
		wantErr(t, "UpdateResource missing", tx.UpdateResource(ctx, missing), store.ErrNotFound)
		wantErr(t, "DeleteResource missing", tx.DeleteResource(ctx, store.KindEgress, "eg-missing"), store.ErrNotFound)
		_, err := tx.GetResource(ctx, store.KindEgress, "eg-missing")
		wantErr(t, "GetResource missing (in InTx)", err, store.ErrNotFound)
		return nil
	})
	_, err = getResource(t, s, store.KindEgress, "eg-missing")
	wantErr(t, "GetResource missing", err, store.ErrNotFound)
	_, err = getResource(t, s, store.ResourceKind("other"), "eg-1")
	wantErr(t, "GetResource of another kind", err, store.ErrNotFound)

	// Delete removes the resource and its labels; the other kind stays.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.DeleteResource(ctx, store.KindEgress, "eg-1") })
	_, err = getResource(t, s, store.KindEgress, "eg-1")
	wantErr(t, "GetResource after delete", err, store.ErrNotFound)
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		wantErr(t, "DeleteResource twice", tx.DeleteResource(ctx, store.KindEgress, "eg-1"), store.ErrNotFound)
		return nil
	})
	if _, err := getResource(t, s, store.KindResolver, "eg-1"); err != nil {
		t.Errorf("resolver after deleting the egress of the same ID: %v", err)
	}
	if page := list(t, s, store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"app": "api"}, Limit: 10}); len(page) != 0 {
		t.Errorf("selector after delete: %v, want nothing", ids(page))
	}
	// A new resource under the deleted ID does not inherit its labels.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		return tx.InsertResource(ctx, egress("eg-1", base, nil))
	})
	if got, err := getResource(t, s, store.KindEgress, "eg-1"); err != nil || len(got.Labels) != 0 {
		t.Errorf("re-inserted resource: %+v, %v; want no labels", got, err)
	}

	// DrainSeconds round-trips through insert, update and listings, the
	// extremes included.
	d := egress("eg-drain", base.Add(time.Minute), nil)
	d.DrainSeconds = math.MaxUint32
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.InsertResource(ctx, d) })
	if got, err := getResource(t, s, store.KindEgress, "eg-drain"); err != nil || got.DrainSeconds != math.MaxUint32 {
		t.Errorf("DrainSeconds after insert: %+v, %v; want %d", got, err, uint32(math.MaxUint32))
	}
	d.Revision, d.DrainSeconds = 2, 3600
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateResource(ctx, d) })
	for _, r := range listAll(t, s, store.ListQuery{Kind: store.KindEgress, Limit: 10}) {
		if r.ID == "eg-drain" && (r.DrainSeconds != 3600 || r.Revision != 2) {
			t.Errorf("listed after update: revision %d drain %d, want 2 and 3600", r.Revision, r.DrainSeconds)
		}
	}
}

func testEmptyMaps(t *testing.T, s store.Store) {
	nilMaps := egress("nil", base, nil)
	nilMaps.Annotations = nil
	nilMaps.Spec = nil
	emptyMaps := egress("empty", base, map[string]string{})
	emptyMaps.Annotations = map[string]string{}
	emptyMaps.Spec = []byte{}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertResource(ctx, nilMaps); err != nil {
			return err
		}
		return tx.InsertResource(ctx, emptyMaps)
	})
	check := func(what string, r *store.Resource) {
		t.Helper()
		if r.Labels == nil || len(r.Labels) != 0 {
			t.Errorf("%s: Labels = %#v, want an empty non-nil map", what, r.Labels)
		}
		if r.Annotations == nil || len(r.Annotations) != 0 {
			t.Errorf("%s: Annotations = %#v, want an empty non-nil map", what, r.Annotations)
		}
		if r.Spec != nil {
			t.Errorf("%s: Spec = %#v, want nil", what, r.Spec)
		}
	}
	for _, id := range []string{"nil", "empty"} {
		r, err := getResource(t, s, store.KindEgress, id)
		if err != nil {
			t.Fatalf("GetResource %s: %v", id, err)
		}
		check("GetResource "+id, r)
	}
	for _, r := range list(t, s, store.ListQuery{Kind: store.KindEgress, Limit: 10}) {
		check("ListResources "+r.ID, r)
	}
}

func testLabelsReplaced(t *testing.T, s store.Store) {
	r := egress("eg", base, map[string]string{"a": "1", "b": "2", "c": "3"})
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.InsertResource(ctx, r) })
	upd := *r
	upd.Labels = map[string]string{"b": "20", "d": "4"}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateResource(ctx, &upd) })
	got, err := getResource(t, s, store.KindEgress, "eg")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(upd.Labels, got.Labels); diff != "" {
		t.Errorf("labels after update (-want +got):\n%s", diff)
	}
	for _, sel := range []map[string]string{{"a": "1"}, {"b": "2"}, {"c": "3"}} {
		if page := list(t, s, store.ListQuery{Kind: store.KindEgress, Selector: sel, Limit: 10}); len(page) != 0 {
			t.Errorf("selector %v on a replaced label matched %v", sel, ids(page))
		}
	}
	for _, sel := range []map[string]string{{"b": "20"}, {"d": "4"}, {"b": "20", "d": "4"}} {
		page := list(t, s, store.ListQuery{Kind: store.KindEgress, Selector: sel, Limit: 10})
		if len(page) != 1 || !page[0].CreatedAt.Equal(micro(base)) {
			t.Errorf("selector %v on a new label: %v", sel, ids(page))
		}
	}
	// Updating to no labels removes them all.
	upd.Labels = nil
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.UpdateResource(ctx, &upd) })
	if got, _ := getResource(t, s, store.KindEgress, "eg"); got == nil || len(got.Labels) != 0 {
		t.Errorf("labels after update to none: %+v", got)
	}
}

func testTimestamps(t *testing.T, s store.Store) {
	times := []time.Time{
		time.Date(2024, 3, 1, 12, 0, 0, 999_999_999, zone),
		time.Date(1969, 7, 20, 20, 17, 40, 123_456_789, time.UTC), // before the epoch
		time.Date(2262, 1, 1, 0, 0, 0, 1_001, time.Local),
		time.Unix(0, 0),
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for i, tm := range times {
			r := egress(fmt.Sprintf("t%d", i), tm, nil)
			r.UpdatedAt = tm.Add(time.Nanosecond)
			if err := tx.InsertResource(ctx, r); err != nil {
				return err
			}
			if err := tx.InsertCommand(ctx, &store.Command{ID: fmt.Sprintf("c%d", i), CreatedAt: tm, CompletedAt: tm.Add(time.Microsecond + 1)}); err != nil {
				return err
			}
		}
		return nil
	})
	for i, tm := range times {
		r, err := getResource(t, s, store.KindEgress, fmt.Sprintf("t%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if !r.CreatedAt.Equal(micro(tm)) || !r.UpdatedAt.Equal(micro(tm.Add(time.Nanosecond))) {
			t.Errorf("resource %d: created %v updated %v, want %v", i, r.CreatedAt, r.UpdatedAt, micro(tm))
		}
		checkUTC(t, "resource", r.CreatedAt, r.UpdatedAt)
		c, err := getCommand(t, s, fmt.Sprintf("c%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if !c.CreatedAt.Equal(micro(tm)) || !c.CompletedAt.Equal(micro(tm.Add(time.Microsecond+1))) {
			t.Errorf("command %d: created %v completed %v, want %v", i, c.CreatedAt, c.CompletedAt, micro(tm))
		}
		checkUTC(t, "command", c.CreatedAt, c.CompletedAt)
	}
	// Listing orders by time, the pre-epoch one first.
	got := ids(list(t, s, store.ListQuery{Kind: store.KindEgress, Limit: 10}))
	if want := []string{"t1", "t3", "t0", "t2"}; !slices.Equal(got, want) {
		t.Errorf("list order %v, want %v", got, want)
	}
}

// key is the listing order of a resource.
type key struct {
	us int64
	id string
}

func keyOf(r *store.Resource) key { return key{r.CreatedAt.UnixMicro(), r.ID} }

func less(a, b key) bool { return a.us < b.us || a.us == b.us && a.id < b.id }

func sortResources(rs []*store.Resource) {
	sort.Slice(rs, func(i, j int) bool { return less(keyOf(rs[i]), keyOf(rs[j])) })
}

func testListPaging(t *testing.T, s store.Store) {
	const n = 250
	var want []*store.Resource
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for i := range n {
			// Three resources share each timestamp, so IDs break ties; IDs
			// are not in time order, and "eg-A" < "eg-a" bytewise.
			id := fmt.Sprintf("eg-%03d", (i*919)%1000)
			if i%50 == 0 {
				id = fmt.Sprintf("eg-%c%d", 'A'+i/50, i)
			} else if i%50 == 1 {
				id = fmt.Sprintf("eg-%c%d", 'a'+i/50, i)
			}
			r := egress(id, base.Add(time.Duration(i/3)*time.Microsecond), map[string]string{"n": fmt.Sprint(i), "all": "yes"})
			want = append(want, stored(r))
			if err := tx.InsertResource(ctx, r); err != nil {
				return err
			}
			other := egress(id, base, nil)
			other.Kind = store.KindResolver
			if err := tx.InsertResource(ctx, other); err != nil {
				return err
			}
		}
		return nil
	})
	sortResources(want)
	for _, limit := range []int{1, 7, 100, n, n + 1} {
		for _, sel := range []map[string]string{nil, {"all": "yes"}} {
			got := listAll(t, s, store.ListQuery{Kind: store.KindEgress, Selector: sel, Limit: limit})
			if diff := cmp.Diff(ids(want), ids(got)); diff != "" {
				t.Errorf("limit %d selector %v: IDs (-want +got):\n%s", limit, sel, diff)
			} else if limit == 7 {
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("limit %d selector %v: resources (-want +got):\n%s", limit, sel, diff)
				}
			}
		}
	}
	// A cursor between two items of the same timestamp.
	mid := want[100]
	got := list(t, s, store.ListQuery{Kind: store.KindEgress, After: &store.Cursor{CreatedAt: mid.CreatedAt, ID: mid.ID}, Limit: 5})
	if diff := cmp.Diff(ids(want[101:106]), ids(got)); diff != "" {
		t.Errorf("page after %v (-want +got):\n%s", mid.ID, diff)
	}
	if got := list(t, s, store.ListQuery{Kind: store.KindEgress, Limit: 0}); len(got) != 0 {
		t.Errorf("limit 0 returned %d items", len(got))
	}
}

func testListPagingWithChurn(t *testing.T, s store.Store) {
	for _, sel := range []map[string]string{nil, {"churn": "yes"}} {
		t.Run(fmt.Sprintf("selector=%v", sel), func(t *testing.T) {
			kind := store.ResourceKind(fmt.Sprintf("churn%d", len(sel)))
			mk := func(id string, at time.Time) *store.Resource {
				r := egress(id, at, map[string]string{"churn": "yes", "x": id})
				r.Kind = kind
				return r
			}
			var initial []string
			inTx(t, s, func(ctx context.Context, tx store.Tx) error {
				for i := range 100 {
					id := fmt.Sprintf("r%03d", i)
					initial = append(initial, id)
					if err := tx.InsertResource(ctx, mk(id, base.Add(time.Duration(i)*10*time.Microsecond))); err != nil {
						return err
					}
				}
				return nil
			})
			rng := rand.New(rand.NewPCG(1, uint64(len(sel))))
			deleted := map[string]bool{}
			alive := slices.Clone(initial)
			seen := map[string]int{}
			var order []key
			q := store.ListQuery{Kind: kind, Selector: sel, Limit: 7}
			for page := 0; ; page++ {
				got := list(t, s, q)
				for _, r := range got {
					seen[r.ID]++
					order = append(order, keyOf(r))
				}
				if len(got) < q.Limit {
					break
				}
				last := got[len(got)-1]
				q.After = &store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
				// Churn: two new rows (one behind the cursor, one ahead),
				// and two deletions (one behind, one ahead).
				inTx(t, s, func(ctx context.Context, tx store.Tx) error {
					behind := mk(fmt.Sprintf("new-b%d", page), base.Add(time.Duration(rng.IntN(int(last.CreatedAt.Sub(base)/time.Microsecond)+1))*time.Microsecond))
					ahead := mk(fmt.Sprintf("new-a%d", page), last.CreatedAt.Add(time.Duration(1+rng.IntN(300))*time.Microsecond))
					for _, r := range []*store.Resource{behind, ahead} {
						if err := tx.InsertResource(ctx, r); err != nil {
							return err
						}
					}
					for range 2 {
						if len(alive) == 0 {
							break
						}
						i := rng.IntN(len(alive))
						id := alive[i]
						alive = slices.Delete(alive, i, i+1)
						deleted[id] = true
						if err := tx.DeleteResource(ctx, kind, id); err != nil {
							return err
						}
					}
					return nil
				})
			}
			for id, n := range seen {
				if n > 1 {
					t.Errorf("%s listed %d times", id, n)
				}
			}
			for _, id := range initial {
				if !deleted[id] && seen[id] != 1 {
					t.Errorf("survivor %s listed %d times, want once", id, seen[id])
				}
			}
			for i := 1; i < len(order); i++ {
				if !less(order[i-1], order[i]) {
					t.Errorf("listing out of order at %d: %v then %v", i, order[i-1], order[i])
				}
			}
			if len(deleted) == 0 {
				t.Error("the churn deleted nothing")
			}
		})
	}
}

func testListSelectors(t *testing.T, s store.Store) {
	var all []*store.Resource
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for i := range 120 {
			labels := map[string]string{
				"app":  fmt.Sprintf("app-%d", i%4),
				"tier": fmt.Sprintf("tier-%d", i%3),
				"zone": fmt.Sprintf("zone-%d", i%5),
			}
			if i%2 == 0 {
				labels["even"] = ""
			}
			r := egress(fmt.Sprintf("eg-%03d", 119-i), base.Add(time.Duration(i/2)*time.Millisecond), labels)
			all = append(all, stored(r))
			if err := tx.InsertResource(ctx, r); err != nil {
				return err
			}
			// The same labels on another kind must not leak in.
			other := egress(fmt.Sprintf("res-%03d", i), base, labels)
			other.Kind = store.KindResolver
			if err := tx.InsertResource(ctx, other); err != nil {
				return err
			}
		}
		return nil
	})
	sortResources(all)
	for _, sel := range []map[string]string{
		{"app": "app-1"},
		{"even": ""},
		{"app": "app-1", "tier": "tier-2"},
		{"app": "app-1", "tier": "tier-2", "zone": "zone-0"},
		{"zone": "zone-3", "tier": "tier-0", "even": ""},
		{"app": "app-9"},
		{"app": "app-1", "tier": "none"},
		{"app": "app-1", "missing": "x"},
		{"APP": "app-1"},
	} {
		var want []*store.Resource
		for _, r := range all {
			ok := true
			for k, v := range sel {
				if got, has := r.Labels[k]; !has || got != v {
					ok = false
				}
			}
			if ok {
				want = append(want, r)
			}
		}
		for _, limit := range []int{3, 100} {
			got := listAll(t, s, store.ListQuery{Kind: store.KindEgress, Selector: sel, Limit: limit})
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("selector %v limit %d (-want +got):\n%s", sel, limit, diff)
			}
		}
	}
}

func testKindsIsolated(t *testing.T, s store.Store) {
	kinds := []store.ResourceKind{store.KindEgress, store.KindResolver, "zzz"}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for i := range 30 {
			k := kinds[i%3]
			r := egress(fmt.Sprintf("%s-%02d", k, i), base.Add(time.Duration(i)*time.Microsecond), map[string]string{"l": "v"})
			r.Kind = k
			if err := tx.InsertResource(ctx, r); err != nil {
				return err
			}
		}
		return nil
	})
	for _, k := range kinds {
		for _, sel := range []map[string]string{nil, {"l": "v"}} {
			got := listAll(t, s, store.ListQuery{Kind: k, Selector: sel, Limit: 4})
			if len(got) != 10 {
				t.Errorf("kind %s selector %v: %d items, want 10", k, sel, len(got))
			}
			for _, r := range got {
				if r.Kind != k || !strings.HasPrefix(r.ID, string(k)+"-") {
					t.Errorf("kind %s listed %s %s", k, r.Kind, r.ID)
				}
			}
		}
	}
	if got := list(t, s, store.ListQuery{Kind: "none", Limit: 10}); len(got) != 0 {
		t.Errorf("unknown kind listed %v", ids(got))
	}
}

func testReferences(t *testing.T, s store.Store) {
	count := func(kind store.RefKind, target string) int {
		t.Helper()
		var n int
		view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
			n, err = tx.CountReferences(ctx, kind, target)
			return err
		})
		return n
	}
	referencing := func(kind store.RefKind, target string) []string {
		t.Helper()
		var ids []string
		view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
			ids, err = tx.ReferencingWorkspaces(ctx, kind, target)
			return err
		})
		return ids
	}
	checkCounts := func(stage string, want map[store.Reference]int) {
		t.Helper()
		for ref, w := range want {
			if got := count(ref.Kind, ref.TargetID); got != w {
				t.Errorf("%s: CountReferences(%s, %s) = %d, want %d", stage, ref.Kind, ref.TargetID, got, w)
			}
		}
	}
	checkReferencing := func(stage string, want map[store.Reference][]string) {
		t.Helper()
		for ref, w := range want {
			if got := referencing(ref.Kind, ref.TargetID); !slices.Equal(got, w) {
				t.Errorf("%s: ReferencingWorkspaces(%s, %s) = %q, want %q", stage, ref.Kind, ref.TargetID, got, w)
			}
		}
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := tx.SetReferences(ctx, "ws-1", []store.Reference{
			{Kind: store.RefEgress, TargetID: "e1"},
			{Kind: store.RefEgressUDP, TargetID: "e1"},
			{Kind: store.RefResolver, TargetID: "r1"},
		}); err != nil {
			return err
		}
		return tx.SetReferences(ctx, "ws-2", []store.Reference{
			{Kind: store.RefEgress, TargetID: "e1"},
			{Kind: store.RefEgress, TargetID: "e1"}, // duplicates count once
			{Kind: store.RefEgress, TargetID: "e2"},
		})
	})
	checkCounts("set", map[store.Reference]int{
		{Kind: store.RefEgress, TargetID: "e1"}:    2,
		{Kind: store.RefEgressUDP, TargetID: "e1"}: 1,
		{Kind: store.RefResolver, TargetID: "r1"}:  1,
		{Kind: store.RefEgress, TargetID: "e2"}:    1,
		{Kind: store.RefResolver, TargetID: "e1"}:  0,
		{Kind: store.RefEgress, TargetID: "r1"}:    0,
	})
	checkReferencing("set", map[store.Reference][]string{
		{Kind: store.RefEgress, TargetID: "e1"}:    {"ws-1", "ws-2"},
		{Kind: store.RefEgressUDP, TargetID: "e1"}: {"ws-1"},
		{Kind: store.RefResolver, TargetID: "r1"}:  {"ws-1"},
		{Kind: store.RefEgress, TargetID: "e2"}:    {"ws-2"},
		{Kind: store.RefResolver, TargetID: "e1"}:  nil,
		{Kind: store.RefEgress, TargetID: "r1"}:    nil,
	})
	// In ID order (bytewise), whatever the order of the writes, and inside a
	// write transaction too.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for _, id := range []string{"ws-Z", "ws-0", "ws-a"} {
			if err := tx.SetReferences(ctx, id, []store.Reference{{Kind: store.RefResolver, TargetID: "r9"}}); err != nil {
				return err
			}
		}
		got, err := tx.ReferencingWorkspaces(ctx, store.RefResolver, "r9")
		if want := []string{"ws-0", "ws-Z", "ws-a"}; !slices.Equal(got, want) {
			t.Errorf("ReferencingWorkspaces in InTx = %q, %v; want %q", got, err, want)
		}
		for _, id := range []string{"ws-Z", "ws-0", "ws-a"} {
			if err := tx.SetReferences(ctx, id, nil); err != nil {
				return err
			}
		}
		return nil
	})
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		return tx.SetReferences(ctx, "ws-1", []store.Reference{{Kind: store.RefEgress, TargetID: "e2"}})
	})
	checkCounts("replaced", map[store.Reference]int{
		{Kind: store.RefEgress, TargetID: "e1"}:    1,
		{Kind: store.RefEgressUDP, TargetID: "e1"}: 0,
		{Kind: store.RefResolver, TargetID: "r1"}:  0,
		{Kind: store.RefEgress, TargetID: "e2"}:    2,
	})
	checkReferencing("replaced", map[store.Reference][]string{
		{Kind: store.RefEgress, TargetID: "e1"}:    {"ws-2"},
		{Kind: store.RefEgressUDP, TargetID: "e1"}: nil,
		{Kind: store.RefEgress, TargetID: "e2"}:    {"ws-1", "ws-2"},
	})
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := tx.SetReferences(ctx, "ws-1", nil); err != nil {
			return err
		}
		return tx.SetReferences(ctx, "ws-2", []store.Reference{})
	})
	checkCounts("cleared", map[store.Reference]int{
		{Kind: store.RefEgress, TargetID: "e1"}: 0,
		{Kind: store.RefEgress, TargetID: "e2"}: 0,
	})
	checkReferencing("cleared", map[store.Reference][]string{
		{Kind: store.RefEgress, TargetID: "e1"}: nil,
		{Kind: store.RefEgress, TargetID: "e2"}: nil,
	})
}

func testRollback(t *testing.T, s store.Store) {
	ctx := context.Background()
	seed := egress("seed", base, map[string]string{"v": "1"})
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.InsertResource(ctx, seed) })
	err := s.InTx(ctx, func(tx store.Tx) error {
		if err := tx.InsertCommand(ctx, &store.Command{ID: "cmd", CreatedAt: base}); err != nil {
			return err
		}
		if err := tx.InsertResource(ctx, egress("new", base, map[string]string{"v": "1"})); err != nil {
			return err
		}
		upd := *seed
		upd.Labels = map[string]string{"v": "2"}
		upd.Revision = 2
		if err := tx.UpdateResource(ctx, &upd); err != nil {
			return err
		}
		if err := tx.SetReferences(ctx, "ws", []store.Reference{{Kind: store.RefEgress, TargetID: "seed"}}); err != nil {
			return err
		}
		return errBoom
	})
	if err != errBoom { //nolint:errorlint // must be returned as is
		t.Fatalf("InTx = %v, want fn's error as is", err)
	}
	_, err = getCommand(t, s, "cmd")
	wantErr(t, "command of a rolled back tx", err, store.ErrNotFound)
	_, err = getResource(t, s, store.KindEgress, "new")
	wantErr(t, "resource of a rolled back tx", err, store.ErrNotFound)
	got, err := getResource(t, s, store.KindEgress, "seed")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(stored(seed), got); diff != "" {
		t.Errorf("resource updated in a rolled back tx (-want +got):\n%s", diff)
	}
	if page := list(t, s, store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"v": "2"}, Limit: 10}); len(page) != 0 {
		t.Errorf("labels of a rolled back update are listed: %v", ids(page))
	}
	view(t, s, func(ctx context.Context, tx store.Tx) error {
		if n, err := tx.CountReferences(ctx, store.RefEgress, "seed"); err != nil || n != 0 {
			t.Errorf("references of a rolled back tx: %d, %v", n, err)
		}
		return nil
	})
}

func testViewReadOnly(t *testing.T, s store.Store) {
	ctx := context.Background()
	cmd := &store.Command{ID: "cmd", CreatedAt: base, Status: store.CommandProcessing}
	seed := egress("seed", base, map[string]string{"v": "1"})
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertCommand(ctx, cmd); err != nil {
			return err
		}
		return tx.InsertResource(ctx, seed)
	})
	writes := map[string]func(tx store.Tx) error{
		"InsertCommand": func(tx store.Tx) error {
			return tx.InsertCommand(ctx, &store.Command{ID: "other", CreatedAt: base})
		},
		"UpdateCommand": func(tx store.Tx) error {
			c := *cmd
			c.Status = store.CommandCompleted
			return tx.UpdateCommand(ctx, &c)
		},
		"InsertResource": func(tx store.Tx) error { return tx.InsertResource(ctx, egress("other", base, nil)) },
		"UpdateResource": func(tx store.Tx) error {
			r := *seed
			r.Revision = 9
			return tx.UpdateResource(ctx, &r)
		},
		"DeleteResource": func(tx store.Tx) error { return tx.DeleteResource(ctx, store.KindEgress, "seed") },
		"SetReferences": func(tx store.Tx) error {
			return tx.SetReferences(ctx, "ws", []store.Reference{{Kind: store.RefEgress, TargetID: "seed"}})
		},
	}
	for name, write := range writes {
		err := s.View(ctx, func(tx store.Tx) error {
			if _, err := tx.GetResource(ctx, store.KindEgress, "seed"); err != nil {
				return err
			}
			return write(tx)
		})
		wantErr(t, name+" in View", err, store.ErrReadOnly)
	}
	if got, err := getCommand(t, s, "cmd"); err != nil || got.Status != store.CommandProcessing {
		t.Errorf("command after writes in View: %+v, %v", got, err)
	}
	if got, err := getResource(t, s, store.KindEgress, "seed"); err != nil || got.Revision != 1 {
		t.Errorf("resource after writes in View: %+v, %v", got, err)
	}
	for _, id := range []string{"other"} {
		if _, err := getResource(t, s, store.KindEgress, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("resource %s inserted in View: %v", id, err)
		}
	}
}

func testViewSnapshot(t *testing.T, s store.Store) {
	ctx := context.Background()
	inTx(t, s, func(ctx context.Context, tx store.Tx) error { return tx.InsertResource(ctx, egress("a", base, nil)) })
	err := s.View(ctx, func(tx store.Tx) error {
		before, err := tx.ListResources(ctx, store.ListQuery{Kind: store.KindEgress, Limit: 10})
		if err != nil {
			return err
		}
		// A write committed while the View is open is not seen by it.
		if err := s.InTx(ctx, func(w store.Tx) error { return w.InsertResource(ctx, egress("b", base, nil)) }); err != nil {
			return err
		}
		after, err := tx.ListResources(ctx, store.ListQuery{Kind: store.KindEgress, Limit: 10})
		if err != nil {
			return err
		}
		if !slices.Equal(ids(before), ids(after)) {
			t.Errorf("View saw a concurrent commit: %v then %v", ids(before), ids(after))
		}
		_, err = tx.GetResource(ctx, store.KindEgress, "b")
		wantErr(t, "GetResource of a concurrent commit", err, store.ErrNotFound)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := list(t, s, store.ListQuery{Kind: store.KindEgress, Limit: 10}); len(got) != 2 {
		t.Errorf("after the View: %v, want a and b", ids(got))
	}
}

func testSecret(t *testing.T, s store.Store) {
	ctx := context.Background()
	v1, err := s.Secret(ctx, "key", func() []byte { return []byte("first") })
	if err != nil || string(v1) != "first" {
		t.Fatalf("Secret = %q, %v; want first", v1, err)
	}
	called := false
	v2, err := s.Secret(ctx, "key", func() []byte { called = true; return []byte("second") })
	if err != nil || string(v2) != "first" {
		t.Errorf("second Secret = %q, %v; want first", v2, err)
	}
	if called {
		t.Error("Secret called create for an existing secret")
	}

	// Concurrent first uses converge on one value.
	const n = 16
	vals := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			vals[i], errs[i] = s.Secret(ctx, "race", func() []byte { return []byte(fmt.Sprintf("value-%d", i)) })
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Secret %d: %v", i, errs[i])
		}
		if string(vals[i]) != string(vals[0]) {
			t.Errorf("Secret %d = %q, Secret 0 = %q: replicas disagree", i, vals[i], vals[0])
		}
	}
	if v, err := s.Secret(ctx, "race", func() []byte { return []byte("late") }); err != nil || string(v) != string(vals[0]) {
		t.Errorf("Secret after the race = %q, %v; want %q", v, err, vals[0])
	}
}

func testConcurrentSameCommand(t *testing.T, s store.Store) {
	ctx := context.Background()
	const n = 64
	var inserts atomic.Int32
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			inserted := false
			errs[i] = s.InTx(ctx, func(tx store.Tx) error {
				inserted = false // fn may run more than once
				if err := tx.LockCommand(ctx, "same-id"); err != nil {
					return err
				}
				_, err := tx.GetCommand(ctx, "same-id")
				if !errors.Is(err, store.ErrNotFound) {
					return err
				}
				if err := tx.InsertCommand(ctx, &store.Command{ID: "same-id", ObjectID: fmt.Sprint(i), CreatedAt: base}); err != nil {
					return err
				}
				inserted = true
				return nil
			})
			if errs[i] == nil && inserted {
				inserts.Add(1)
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("goroutine %d: %v", i, err)
		}
	}
	if got := inserts.Load(); got != 1 {
		t.Errorf("%d committed inserts, want exactly 1", got)
	}
	if _, err := getCommand(t, s, "same-id"); err != nil {
		t.Errorf("GetCommand: %v", err)
	}
}

func testConcurrentInserts(t *testing.T, s store.Store) {
	ctx := context.Background()
	const n = 200
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			errs[i] = s.InTx(ctx, func(tx store.Tx) error {
				return tx.InsertResource(ctx, egress(fmt.Sprintf("c-%03d", i), base.Add(time.Duration(i)*time.Microsecond),
					map[string]string{"i": fmt.Sprint(i), "all": "yes"}))
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("InTx %d: %v", i, err)
		}
	}
	got := listAll(t, s, store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"all": "yes"}, Limit: 64})
	if len(got) != n {
		t.Fatalf("listed %d resources, want %d", len(got), n)
	}
	for i, r := range got {
		if want := fmt.Sprintf("c-%03d", i); r.ID != want || r.Labels["i"] != fmt.Sprint(i) {
			t.Errorf("item %d: %s %v, want %s", i, r.ID, r.Labels, want)
		}
	}
}
