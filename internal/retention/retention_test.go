package retention

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{
		{0, false}, {time.Hour, false}, {MinRetention - time.Second, false},
		{MinRetention, true}, {DefaultRetention, true}, {365 * 24 * time.Hour, true},
	} {
		err := Check("command-retention", tc.d)
		if (err == nil) != tc.ok {
			t.Errorf("Check(%v) = %v, want ok %v", tc.d, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--command-retention") {
			t.Errorf("Check(%v) = %q, which does not name the flag", tc.d, err)
		}
	}
	if err := (&Pruner{}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	if err := (&Pruner{Deleted: time.Hour}).Validate(); err == nil || !strings.Contains(err.Error(), "--deleted-retention") {
		t.Errorf("Deleted 1h: %v", err)
	}
}

// TestPass: a pass prunes, in batches, the completed commands older than
// the command retention (never a PROCESSING one, nor a kept method's) and
// the Workspaces and deleted Volumes older than the deleted retention;
// a second pass finds nothing.
func TestPass(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(10 * 24 * time.Hour)
	err = st.InTx(ctx, func(tx store.Tx) error {
		for i := range 7 {
			at := t0 // older than 7 days
			if i == 6 {
				at = now.Add(-time.Hour)
			}
			if err := tx.InsertCommand(ctx, &store.Command{ID: fmt.Sprintf("c-%d", i), Method: "m", ObjectKind: "workspace",
				Status: store.CommandCompleted, CreatedAt: at, CompletedAt: at}); err != nil {
				return err
			}
		}
		if err := tx.InsertCommand(ctx, &store.Command{ID: "processing", Method: "m", Status: store.CommandProcessing, CreatedAt: t0}); err != nil {
			return err
		}
		if err := tx.InsertCommand(ctx, &store.Command{ID: "kept", Method: "ctrl/keep", Status: store.CommandCompleted, CreatedAt: t0, CompletedAt: t0}); err != nil {
			return err
		}
		for i, deleted := range []time.Time{t0, now.Add(-time.Hour), {}} {
			w := &store.Workspace{ID: fmt.Sprintf("ws-%d", i), CreatedAt: t0, UpdatedAt: t0, Doc: []byte("d"), State: 3, Power: store.PowerRunning}
			if !deleted.IsZero() {
				w.State, w.DeletedAt, w.Power = store.WorkspaceStateDeleted, deleted, store.PowerDeleted
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
		}
		for i, updated := range []time.Time{t0, now.Add(-time.Hour)} {
			if err := tx.InsertResource(ctx, &store.Resource{Kind: "volume-deleted", ID: fmt.Sprintf("vol-%d", i), CreatedAt: t0, UpdatedAt: updated,
				Revision: 1, Spec: []byte("{}"), Annotations: map[string]string{}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &Pruner{Store: st, Now: func() time.Time { return now }, Batch: 2, KeepMethods: []string{"ctrl/keep"},
		DeletedKinds: []store.ResourceKind{"volume-deleted"}}
	c, err := p.Pass(ctx)
	if want := (Counts{Commands: 6, Workspaces: 1, Resources: 1}); err != nil || c != want {
		t.Fatalf("Pass = %+v, %v; want %+v", c, err, want)
	}
	if c, err := p.Pass(ctx); err != nil || c != (Counts{}) {
		t.Errorf("second Pass = %+v, %v; want nothing", c, err)
	}
	err = st.View(ctx, func(tx store.Tx) error {
		for _, id := range []string{"c-6", "processing", "kept"} {
			if _, err := tx.GetCommand(ctx, id); err != nil {
				return fmt.Errorf("command %s: %w", id, err)
			}
		}
		if _, err := tx.GetCommand(ctx, "c-0"); !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("command c-0: %v, want not found", err)
		}
		for _, id := range []string{"ws-1", "ws-2"} {
			if _, err := tx.GetWorkspace(ctx, id); err != nil {
				return fmt.Errorf("workspace %s: %w", id, err)
			}
		}
		if _, err := tx.GetWorkspace(ctx, "ws-0"); !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("workspace ws-0: %v, want not found", err)
		}
		if _, err := tx.GetResource(ctx, "volume-deleted", "vol-1"); err != nil {
			return fmt.Errorf("vol-1: %w", err)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}

	// Run passes until its context ends.
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- (&Pruner{Store: st, Interval: time.Millisecond}).Run(ctx) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
}

// TestPassNotLeader: a replica without the fleet lease (Leader false)
// prunes nothing; with it, the same pass prunes.
func TestPassNotLeader(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := st.InTx(ctx, func(tx store.Tx) error {
		return tx.InsertCommand(ctx, &store.Command{ID: "c-old", Method: "m", ObjectKind: "workspace",
			Status: store.CommandCompleted, CreatedAt: t0, CompletedAt: t0})
	}); err != nil {
		t.Fatal(err)
	}
	leads := false
	p := &Pruner{Store: st, Now: func() time.Time { return t0.Add(30 * 24 * time.Hour) }, Leader: func() bool { return leads }}
	if c, err := p.Pass(ctx); err != nil || c != (Counts{}) {
		t.Fatalf("non-holder Pass = %+v, %v; want nothing pruned", c, err)
	}
	leads = true
	if c, err := p.Pass(ctx); err != nil || c.Commands != 1 {
		t.Fatalf("holder Pass = %+v, %v; want 1 command pruned", c, err)
	}
}
