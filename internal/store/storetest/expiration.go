package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/kibotos/kibotos/internal/store"
)

func dueExpirations(t *testing.T, s store.Store, before time.Time, after *store.ArmedExpiration, limit int) []store.ArmedExpiration {
	t.Helper()
	var out []store.ArmedExpiration
	view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
		out, err = tx.DueExpirations(ctx, before, after, limit)
		return err
	})
	return out
}

func nextExpiration(t *testing.T, s store.Store, after time.Time) (time.Time, bool) {
	t.Helper()
	var (
		d  time.Time
		ok bool
	)
	view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
		d, ok, err = tx.NextExpiration(ctx, after)
		return err
	})
	return d, ok
}

// testExpirations: the armed deadlines of Workspaces (the column
// ExpirationDeadline) are read in (deadline, ID) order up to an inclusive
// bound, paged by cursor, and the next one after a time; Workspaces without
// one never appear; updates arm, move and disarm.
func testExpirations(t *testing.T, s store.Store) {
	at := func(d time.Duration) time.Time { return base.Add(d) }
	mk := func(id string, deadline time.Time) *store.Workspace {
		w := newWorkspace(id, base, nil)
		w.ExpirationDeadline = deadline
		return w
	}
	ws := []*store.Workspace{
		mk("ws-b", at(time.Second)),
		mk("ws-a", at(time.Second)), // same deadline: ID order
		mk("ws-c", at(3*time.Second)),
		mk("ws-none", time.Time{}),
		mk("ws-early", at(-time.Hour)),
		mk("ws-late", at(24*time.Hour)),
	}
	insertWorkspaces(t, s, ws...)
	ax := func(id string, d time.Time) store.ArmedExpiration {
		return store.ArmedExpiration{WorkspaceID: id, Deadline: micro(d)}
	}
	// The bound is inclusive, at microsecond precision.
	want := []store.ArmedExpiration{ax("ws-early", at(-time.Hour)), ax("ws-a", at(time.Second)), ax("ws-b", at(time.Second))}
	if got := dueExpirations(t, s, micro(at(time.Second)), nil, 10); !gocmp.Equal(got, want) {
		t.Errorf("DueExpirations(deadline of ws-a) = %v, want %v", got, want)
	}
	if got := dueExpirations(t, s, micro(at(time.Second)).Add(-time.Microsecond), nil, 10); !gocmp.Equal(got, want[:1]) {
		t.Errorf("DueExpirations(1µs before ws-a) = %v, want %v", got, want[:1])
	}
	for _, d := range []time.Time{time.Time{}, at(-2 * time.Hour)} {
		if got := dueExpirations(t, s, d, nil, 10); len(got) != 0 {
			t.Errorf("DueExpirations(%v) = %v, want none", d, got)
		}
	}
	if got := dueExpirations(t, s, at(time.Second), nil, 0); len(got) != 0 {
		t.Errorf("DueExpirations(limit 0) = %v, want none", got)
	}
	for _, got := range dueExpirations(t, s, at(time.Hour), nil, 10) {
		checkUTC(t, "DueExpirations", got.Deadline)
	}
	// Paging by cursor, one at a time, sees each once in order.
	all := []store.ArmedExpiration{ax("ws-early", at(-time.Hour)), ax("ws-a", at(time.Second)), ax("ws-b", at(time.Second)), ax("ws-c", at(3*time.Second))}
	var paged []store.ArmedExpiration
	var after *store.ArmedExpiration
	for range 10 {
		page := dueExpirations(t, s, at(time.Hour), after, 1)
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		after = &page[len(page)-1]
	}
	if !gocmp.Equal(paged, all) {
		t.Errorf("DueExpirations paged one by one = %v, want %v", paged, all)
	}

	// NextExpiration is strictly after its argument.
	for _, tc := range []struct {
		after time.Time
		want  time.Time
		ok    bool
	}{
		{time.Time{}, at(-time.Hour), true},
		{at(-time.Hour), at(time.Second), true},
		{micro(at(time.Second)).Add(-time.Microsecond), at(time.Second), true},
		{at(time.Second), at(3 * time.Second), true},
		{at(3 * time.Second), at(24 * time.Hour), true},
		{at(24 * time.Hour), time.Time{}, false},
	} {
		got, ok := nextExpiration(t, s, tc.after)
		want := tc.want
		if tc.ok {
			want = micro(want)
		}
		if ok != tc.ok || !got.Equal(want) {
			t.Errorf("NextExpiration(%v) = %v, %v; want %v, %v", tc.after, got, ok, want, tc.ok)
		}
	}

	// Updates move, disarm and arm.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for id, d := range map[string]time.Time{"ws-a": at(5 * time.Second), "ws-early": {}, "ws-none": at(2 * time.Second)} {
			w, err := tx.GetWorkspace(ctx, id)
			if err != nil {
				return err
			}
			w.ExpirationDeadline = d
			if err := tx.UpdateWorkspace(ctx, w); err != nil {
				return fmt.Errorf("update %s: %w", id, err)
			}
		}
		return nil
	})
	want = []store.ArmedExpiration{ax("ws-b", at(time.Second)), ax("ws-none", at(2*time.Second)), ax("ws-c", at(3*time.Second)), ax("ws-a", at(5*time.Second))}
	if got := dueExpirations(t, s, at(time.Hour), nil, 10); !gocmp.Equal(got, want) {
		t.Errorf("DueExpirations after updates = %v, want %v", got, want)
	}
	if w, err := getWorkspace(t, s, "ws-early"); err != nil || !w.ExpirationDeadline.IsZero() {
		t.Errorf("ws-early after disarming: %v, %v; want no deadline", w, err)
	}
	if got, ok := nextExpiration(t, s, time.Time{}); !ok || !got.Equal(micro(at(time.Second))) {
		t.Errorf("NextExpiration after updates = %v, %v; want %v", got, ok, micro(at(time.Second)))
	}
}
