package expiration_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/expiration"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/workspace"
)

func openStore(t *testing.T, pg bool) store.Store {
	t.Helper()
	if !pg {
		st, err := sqlite.Open(context.Background(), t.TempDir()+"/ctrl.db")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	const env = "KIBOTOS_TEST_POSTGRES_URL"
	url := os.Getenv(env)
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set; CI must run the PostgreSQL tests", env)
		}
		t.Skipf("%s is not set: skipping PostgreSQL test", env)
	}
	st, cleanup, err := pgtest.Open(context.Background(), url, postgres.Open)
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	t.Cleanup(func() {
		if err := cleanup(); err != nil {
			t.Errorf("drop test schema: %v", err)
		}
	})
	return st
}

func newService(st store.Store) *workspace.Service {
	return &workspace.Service{
		Engine: &command.Engine{Store: st}, Store: st, Pages: paging.NewCodec(make([]byte, 32)),
		Templates:   func(id string) (string, bool) { return "v1", true },
		MaxCapacity: func() workspace.Capacity { return workspace.Capacity{} },
		WaitBound:   time.Millisecond,
	}
}

// createStopped creates n Workspaces and marks them STOPPED, as a node
// would: a STOP deadline on them is consumed at once (no node needed).
func createStopped(t *testing.T, s *workspace.Service, st store.Store, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		res, err := s.Create(t.Context(), &ctrlv1.CreateWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: fmt.Sprintf("%s-%d", prefix, i)},
			Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = res.GetWorkspace().GetWorkspaceId()
	}
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		for _, id := range ids {
			w, err := tx.GetWorkspace(t.Context(), id)
			if err != nil {
				return err
			}
			pub, err := workspace.Decode(w)
			if err != nil {
				return err
			}
			pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
			w.Power, w.ObservedGeneration, w.ObservedState, w.CommandID = store.PowerStopped, w.Generation, store.ExecStopped, ""
			if err := workspace.Save(w, pub, time.Now()); err != nil {
				return err
			}
			if err := tx.UpdateWorkspace(t.Context(), w); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func arm(t *testing.T, s *workspace.Service, id string, at time.Time) {
	t.Helper()
	_, err := s.UpdateExpiration(t.Context(), &ctrlv1.UpdateWorkspaceExpirationRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: "arm-" + id}, WorkspaceId: id, ExpectedRevision: 1,
		Expiration: &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP, Deadline: timestamppb.New(at)}})
	if err != nil {
		t.Fatal(err)
	}
}

// firedAt returns when the expiration command of Workspace id (armed at
// revision 2) was created, or false.
func firedAt(t *testing.T, st store.Store, id string) (time.Time, bool) {
	t.Helper()
	var rec *store.Command
	err := st.View(t.Context(), func(tx store.Tx) error {
		var err error
		rec, err = tx.GetCommand(t.Context(), workspace.ExpirationCommandID(id, 2))
		return err
	})
	if err != nil {
		return time.Time{}, false
	}
	return rec.CreatedAt, true
}

// run starts engines on s until the test ends; fires counts their firings.
func run(t *testing.T, fires *atomic.Int64, recheck time.Duration, services ...*workspace.Service) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, s := range services {
		e := &expiration.Engine{Store: s.Store, Recheck: recheck,
			Fire: func(ctx context.Context, id string) (workspace.Firing, string, error) {
				f, cid, err := s.FireExpiration(ctx, id)
				if cid != "" {
					fires.Add(1)
				}
				return f, cid, err
			}}
		wg.Add(1)
		go func() { defer wg.Done(); _ = e.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// TestEngineFires: deadlines armed before and while the engine runs fire
// once each, never early and within a second of their deadline (or of the
// engine's start, for those due before), woken by the admissions that arm them: the recheck is an
// hour, so a deadline armed after the engine went to sleep is seen only
// through the notification.
func TestEngineFires(t *testing.T) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			t.Parallel()
			st := openStore(t, pg)
			s := newService(st)
			ids := createStopped(t, s, st, "ef", 40)
			start := time.Now()
			deadlines := map[string]time.Time{}
			// Half armed before the engine starts (one already due), half
			// after, in an order unlike their deadlines.
			for i, id := range ids[:20] {
				d := start.Add(time.Duration(300+20*i) * time.Millisecond)
				deadlines[id] = d
				arm(t, s, id, d)
			}
			var fires atomic.Int64
			ready := time.Now()
			run(t, &fires, time.Hour, s)
			for i, id := range ids[20:] {
				d := time.Now().Add(time.Duration(900-30*i) * time.Millisecond)
				deadlines[id] = d
				arm(t, s, id, d)
			}
			var late []time.Duration
			limit := time.Now().Add(10 * time.Second)
			for _, id := range ids {
				for {
					at, ok := firedAt(t, st, id)
					if ok {
						if at.Before(deadlines[id].Truncate(time.Microsecond)) {
							t.Errorf("%s fired at %v, before its deadline %v", id, at, deadlines[id])
						}
						late = append(late, at.Sub(maxTime(deadlines[id], ready)))
						break
					}
					if time.Now().After(limit) {
						t.Fatalf("%s did not fire (deadline %v)", id, deadlines[id])
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
			if max := late[len(late)-1]; max > time.Second {
				t.Errorf("latest firing %v after its deadline (or the engine's start), want within a second (lateness %v)", max, late)
			}
			time.Sleep(100 * time.Millisecond)
			if n := fires.Load(); n != int64(len(ids)) {
				t.Errorf("%d firings, want %d", n, len(ids))
			}
			t.Logf("lateness p50 %v max %v", late[len(late)/2], late[len(late)-1])
		})
	}
}

// TestEngineReplicas: engines of several replicas on one store (and an
// engine started after a restart) fire each deadline once; with the
// notifications of one replica only, the others see the deadlines through
// their recheck.
func TestEngineReplicas(t *testing.T) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			t.Parallel()
			st := openStore(t, pg)
			s := newService(st)
			ids := createStopped(t, s, st, "er", 30)
			now := time.Now()
			for i, id := range ids {
				arm(t, s, id, now.Add(time.Duration(200+10*i)*time.Millisecond))
			}
			var fires atomic.Int64
			run(t, &fires, 100*time.Millisecond, s, newService(st), newService(st))
			limit := time.Now().Add(10 * time.Second)
			for _, id := range ids {
				for {
					if _, ok := firedAt(t, st, id); ok {
						break
					}
					if time.Now().After(limit) {
						t.Fatalf("%s did not fire", id)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			time.Sleep(300 * time.Millisecond)
			if n := fires.Load(); n != int64(len(ids)) {
				t.Errorf("%d firings across three engines, want %d (once each)", n, len(ids))
			}
		})
	}
}

// TestEngineWaitsForState: a due STOP deadline on a Workspace between
// states fires once the state settles, without waiting for a notification.
func TestEngineWaitsForState(t *testing.T) {
	st := openStore(t, false)
	s := newService(st)
	id := createStopped(t, s, st, "ew", 1)[0]
	arm(t, s, id, time.Now().Add(50*time.Millisecond))
	// STARTING: the deadline waits.
	if _, err := s.Start(t.Context(), &ctrlv1.StartWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "ew-start"}, WorkspaceId: id, ExpectedExpirationRevision: 2}); err != nil {
		t.Fatal(err)
	}
	var fires atomic.Int64
	run(t, &fires, 100*time.Millisecond, s)
	time.Sleep(400 * time.Millisecond)
	if _, ok := firedAt(t, st, id); ok {
		t.Fatal("fired on a STARTING Workspace")
	}
	// The node reports it AVAILABLE: the stop fires.
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(t.Context(), id)
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, true
		w.ObservedGeneration, w.ObservedState, w.CommandID = w.Generation, store.ExecRunning, ""
		if err := workspace.Save(w, pub, time.Now()); err != nil {
			return err
		}
		return tx.UpdateWorkspace(t.Context(), w)
	})
	if err != nil {
		t.Fatal(err)
	}
	settled := time.Now()
	for {
		if at, ok := firedAt(t, st, id); ok {
			if d := at.Sub(settled); d > time.Second {
				t.Errorf("fired %v after the state settled, want within a second", d)
			}
			break
		}
		if time.Since(settled) > 5*time.Second {
			t.Fatal("did not fire once AVAILABLE")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// TestEngineNotLeader: an engine without the fleet lease (Leader false)
// fires nothing; once it holds it, it fires the due deadline within
// LeaderRecheck and a little.
func TestEngineNotLeader(t *testing.T) {
	st := openStore(t, false)
	s := newService(st)
	ids := createStopped(t, s, st, "nl", 1)
	arm(t, s, ids[0], time.Now().Add(100*time.Millisecond))
	var leads atomic.Bool
	var fires atomic.Int64
	e := &expiration.Engine{Store: st, Recheck: time.Hour, Leader: leads.Load,
		Fire: func(ctx context.Context, id string) (workspace.Firing, string, error) {
			f, cid, err := s.FireExpiration(ctx, id)
			if cid != "" {
				fires.Add(1)
			}
			return f, cid, err
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	time.Sleep(600 * time.Millisecond)
	if _, ok := firedAt(t, st, ids[0]); ok || fires.Load() != 0 {
		t.Fatal("an engine without the lease fired")
	}
	leads.Store(true)
	limit := time.Now().Add(expiration.LeaderRecheck + 3*time.Second)
	for {
		if _, ok := firedAt(t, st, ids[0]); ok {
			break
		}
		if time.Now().After(limit) {
			t.Fatal("the lease's holder did not fire")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
