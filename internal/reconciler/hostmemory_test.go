package reconciler

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/workspace"
)

const (
	lvNone     = nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_NONE
	lvModerate = nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_MODERATE
	lvCritical = nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_CRITICAL
)

func TestChooseVictim(t *testing.T) {
	now := t0.Add(time.Hour)
	const age = 30 * time.Second
	old := time.Time{}
	for _, tc := range []struct {
		name  string
		cands []memCandidate
		want  string // "" for none
	}{
		{"none listed", nil, ""},
		{"largest first", []memCandidate{
			{id: "ws-a", usedMiB: 100, available: true},
			{id: "ws-b", usedMiB: 300, available: true},
			{id: "ws-c", usedMiB: 200, available: true},
		}, "ws-b"},
		{"ties go to the smallest ID", []memCandidate{
			{id: "ws-z", usedMiB: 300, available: true},
			{id: "ws-m", usedMiB: 300, available: true},
			{id: "ws-a", usedMiB: 100, available: true},
		}, "ws-m"},
		{"only AVAILABLE", []memCandidate{
			{id: "ws-big", usedMiB: 900},
			{id: "ws-small", usedMiB: 10, available: true},
		}, "ws-small"},
		{"not twice in an episode", []memCandidate{
			{id: "ws-big", usedMiB: 900, available: true, stopped: true},
			{id: "ws-small", usedMiB: 10, available: true},
		}, "ws-small"},
		{"a recent start is spared", []memCandidate{
			{id: "ws-new", usedMiB: 900, available: true, listedAt: now.Add(-age + time.Second)},
			{id: "ws-old", usedMiB: 10, available: true, listedAt: old},
		}, "ws-old"},
		{"listed exactly the minimum age ago", []memCandidate{
			{id: "ws-new", usedMiB: 900, available: true, listedAt: now.Add(-age)},
			{id: "ws-old", usedMiB: 10, available: true},
		}, "ws-new"},
		{"nothing eligible", []memCandidate{
			{id: "ws-new", usedMiB: 900, available: true, listedAt: now},
			{id: "ws-stopping", usedMiB: 500},
			{id: "ws-done", usedMiB: 400, available: true, stopped: true},
		}, ""},
	} {
		got, ok := chooseVictim(tc.cands, now, age)
		if ok != (tc.want != "") || got.id != tc.want {
			t.Errorf("%s: chooseVictim = %q, %v; want %q", tc.name, got.id, ok, tc.want)
		}
	}
}

func TestVictimProgress(t *testing.T) {
	now := t0.Add(time.Hour)
	const bound = 30 * time.Second
	ended := now.Add(-time.Second)
	processing := func(age time.Duration) *store.Command {
		return &store.Command{Status: store.CommandProcessing, CreatedAt: now.Add(-age)}
	}
	completed := func(code string) *store.Command {
		return &store.Command{Status: store.CommandCompleted, CreatedAt: now.Add(-time.Minute), CompletedAt: ended, ErrorCode: code}
	}
	failedHolding := &store.Workspace{NodeID: "n1", Power: store.PowerStopped}
	holding := &ctrlv1.Workspace{State: ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, HoldsExecution: true}
	for _, tc := range []struct {
		name        string
		stop, force *store.Command
		w           *store.Workspace
		pub         *ctrlv1.Workspace
		want        victimStep
		at          time.Time
	}{
		{"normal stop under way", processing(bound - time.Second), nil, nil, nil, victimWait, time.Time{}},
		{"normal stop past the bound", processing(bound), nil, nil, nil, victimForce, time.Time{}},
		{"normal stop done", completed(""), nil, nil, nil, victimDone, ended},
		{"normal stop failed, execution held", completed("failed_precondition"), nil, failedHolding, holding, victimForce, time.Time{}},
		{"normal stop failed, execution gone", completed("failed_precondition"), nil, failedHolding,
			&ctrlv1.Workspace{State: ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED}, victimDone, ended},
		{"superseded by a caller's command in flight", completed("failed_precondition"), nil,
			&store.Workspace{NodeID: "n1", Power: store.PowerDeleted, CommandID: "caller-delete"}, holding, victimDone, ended},
		{"failed on another node", completed("failed_precondition"), nil, &store.Workspace{NodeID: "n2", Power: store.PowerStopped}, holding, victimDone, ended},
		{"forced stop under way", completed("failed_precondition"), processing(bound - time.Second), nil, nil, victimWait, time.Time{}},
		{"forced stop hangs past the bound", processing(2 * bound), processing(bound), nil, nil, victimDone, now},
		{"forced stop done", completed("failed_precondition"), &store.Command{Status: store.CommandCompleted, CompletedAt: ended}, nil, nil, victimDone, ended},
		{"no record", nil, nil, nil, nil, victimDone, now},
	} {
		step, at := victimProgress(tc.stop, tc.force, tc.w, tc.pub, "n1", now, bound)
		if step != tc.want || !at.Equal(tc.at) {
			t.Errorf("%s: victimProgress = %v, %v; want %v, %v", tc.name, step, at, tc.want, tc.at)
		}
	}
}

func TestBoundedCondition(t *testing.T) {
	c := &nodev1.MemoryCondition{Level: 42, UsedMib: 5, LimitMib: 6, PsiSomeAvg10: 7}
	for i := range 300 {
		c.Workspaces = append(c.Workspaces, &nodev1.WorkspaceMemory{WorkspaceId: fmt.Sprintf("ws-%d", i), UsedMib: 1})
	}
	c.Workspaces[0].WorkspaceId = "../etc"
	c.Workspaces[1].WorkspaceId = strings.Repeat("w", 65)
	c.Workspaces[2].WorkspaceId = ""
	got := boundedCondition(c)
	if got.GetLevel() != nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_UNSPECIFIED {
		t.Errorf("level %d kept as %v, want UNSPECIFIED", c.GetLevel(), got.GetLevel())
	}
	if len(got.GetWorkspaces()) != 256 || got.GetWorkspaces()[0].GetWorkspaceId() != "ws-3" {
		t.Errorf("workspaces = %d from %s, want 256 from ws-3 (the bad IDs dropped)", len(got.GetWorkspaces()), got.GetWorkspaces()[0].GetWorkspaceId())
	}
	if got.GetUsedMib() != 5 || got.GetLimitMib() != 6 || got.GetPsiSomeAvg10() != 7 {
		t.Errorf("figures changed: %v", got)
	}
}

// memEnv is a Reconciler with node n1 and a fake clock, on one dialect.
type memEnv struct {
	t     *testing.T
	r     *Reconciler
	st    store.Store
	clock *fakeClock
}

// memDialects runs f on SQLite and on PostgreSQL (skipped without
// KIBOTOS_TEST_POSTGRES_URL, failed in CI).
func memDialects(t *testing.T, f func(e *memEnv)) {
	t.Run("sqlite", func(t *testing.T) {
		r, st, clock := newTest(t, Config{})
		connectNode(t, r, hello("n1", 4096, 4000, ""))
		f(&memEnv{t: t, r: r, st: st, clock: clock})
	})
	t.Run("postgres", func(t *testing.T) {
		url := os.Getenv("KIBOTOS_TEST_POSTGRES_URL")
		if url == "" {
			if os.Getenv("CI") == "true" {
				t.Fatal("KIBOTOS_TEST_POSTGRES_URL is not set; CI must run the PostgreSQL tests")
			}
			t.Skip("KIBOTOS_TEST_POSTGRES_URL is not set: skipping PostgreSQL test")
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
		clock := &fakeClock{now: t0}
		r := New(Config{Store: st, Now: clock.Now})
		connectNode(t, r, hello("n1", 4096, 4000, ""))
		f(&memEnv{t: t, r: r, st: st, clock: clock})
	})
}

// available seeds running Workspaces on n1.
func (e *memEnv) available(ids ...string) {
	for _, id := range ids {
		seed(e.t, e.st, e.clock.Now(), row{id: id, node: "n1", power: store.PowerRunning, generation: 1, observed: 1,
			exec: store.ExecRunning, state: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE})
		// An AVAILABLE Workspace holds its execution.
		if err := e.st.InTx(e.t.Context(), func(tx store.Tx) error {
			w, err := tx.GetWorkspace(e.t.Context(), id)
			if err != nil {
				return err
			}
			pub, _ := workspace.Decode(w)
			pub.HoldsExecution = true
			if err := workspace.Save(w, pub, e.clock.Now()); err != nil {
				return err
			}
			return tx.UpdateWorkspace(e.t.Context(), w)
		}); err != nil {
			e.t.Fatal(err)
		}
	}
}

// cond is a condition of level lv listing used MiB per workspace
// ("ws-a", 300, ...).
func cond(lv nodev1.MemoryPressureLevel, pairs ...any) *nodev1.MemoryCondition {
	c := &nodev1.MemoryCondition{Level: lv, UsedMib: 990, LimitMib: 1000, PsiSomeAvg10: 12}
	for i := 0; i < len(pairs); i += 2 {
		c.Workspaces = append(c.Workspaces, &nodev1.WorkspaceMemory{WorkspaceId: pairs[i].(string), UsedMib: uint64(pairs[i+1].(int))})
	}
	return c
}

// beat hands c to the policy as a heartbeat of n1 would and evaluates it
// at once (the worker's job), at the clock's time.
func (e *memEnv) beat(c *nodev1.MemoryCondition) {
	e.t.Helper()
	h := &e.r.mem
	h.mu.Lock()
	n := h.node("n1")
	listed := map[string]time.Time{}
	for _, w := range c.GetWorkspaces() {
		at, ok := n.listed[w.GetWorkspaceId()]
		if !ok && n.baseline {
			at = e.r.now()
		}
		listed[w.GetWorkspaceId()] = at
	}
	n.listed, n.baseline = listed, true
	h.mu.Unlock()
	if err := e.r.evaluateMemory(e.t.Context(), "n1", boundedCondition(c), e.r.now()); err != nil {
		e.t.Fatalf("evaluateMemory: %v", err)
	}
}

// command reads a command; nil when absent.
func (e *memEnv) command(id string) *store.Command {
	e.t.Helper()
	var c *store.Command
	if err := e.st.View(e.t.Context(), func(tx store.Tx) error {
		var err error
		c, err = optCommand(e.t.Context(), tx, id)
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// victims lists the workspaces episode n stopped, from its record.
func (e *memEnv) victims(n uint64) []string {
	e.t.Helper()
	rec := e.command(episodeID("n1", n))
	if rec == nil {
		e.t.Fatalf("episode %d is not recorded", n)
	}
	ep := &nodev1.MemoryCondition{}
	if err := proto.Unmarshal(rec.Result, ep); err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, w := range ep.GetWorkspaces() {
		out = append(out, w.GetWorkspaceId())
	}
	return out
}

// report applies n1's report that ws is now state, at its current
// generation.
func (e *memEnv) report(ws string, state nodev1.ExecState, holds bool) {
	e.t.Helper()
	w, _ := load(e.t, e.st, ws)
	if _, err := e.r.applyReport(e.t.Context(), "n1", 0, &nodev1.ExecutionReport{WorkspaceId: ws, Generation: w.Generation, State: state,
		HoldsExecution: holds, LayerExists: true}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *memEnv) advance(d time.Duration) { e.clock.Set(e.clock.Now().Add(d)) }

// TestHostMemoryEpisode: a CRITICAL node gets an episode that stops the
// largest AVAILABLE workspace through a recorded host-memory/ STOP, waits
// for its stop and for a condition measured after it before the next one,
// and ends on a level below CRITICAL; the next CRITICAL opens episode 2,
// and a restarted ctrl finds it.
func TestHostMemoryEpisode(t *testing.T) {
	memDialects(t, func(e *memEnv) {
		e.available("ws-a", "ws-b", "ws-c")
		e.beat(cond(lvNone, "ws-a", 300, "ws-b", 500, "ws-c", 100))
		e.beat(cond(lvModerate, "ws-a", 300, "ws-b", 500, "ws-c", 100))
		if rec := e.command(episodeID("n1", 1)); rec != nil {
			t.Fatalf("an episode opened below CRITICAL: %+v", rec)
		}

		e.advance(time.Second)
		e.beat(cond(lvCritical, "ws-a", 300, "ws-b", 500, "ws-c", 100))
		ep := e.command(episodeID("n1", 1))
		if ep == nil || ep.Status != store.CommandProcessing || ep.ObjectKind != "node" || ep.ObjectID != "n1" ||
			ctrlv1.CommandInitiator(ep.Initiator) != ctrlv1.CommandInitiator_COMMAND_INITIATOR_HOST_MEMORY {
			t.Fatalf("episode 1 = %+v, want PROCESSING, node n1, HOST_MEMORY", ep)
		}
		stopB := victimID("n1", 1, "ws-b")
		// GetWorkspaceCommand shows it.
		svc := &workspace.Service{Store: e.st}
		got, err := svc.GetCommand(t.Context(), &ctrlv1.GetWorkspaceCommandRequest{CommandId: stopB})
		if err != nil {
			t.Fatalf("GetWorkspaceCommand(%s) = %v", stopB, err)
		}
		want := &ctrlv1.WorkspaceCommand{CommandId: "host-memory/n1/1/ws-b", WorkspaceId: "ws-b",
			Kind:      ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP,
			Initiator: ctrlv1.CommandInitiator_COMMAND_INITIATOR_HOST_MEMORY,
			Status:    ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING,
			// It says why (workspace.CommandMessage copies the record's).
			Message: "host memory: node n1 used 990 MiB of its 1000 MiB budget (CRITICAL); stopped as the largest user (500 MiB) " +
				"among AVAILABLE workspaces listed 30 s or more; stop 1 of at most 8 in episode host-memory/n1/1"}
		if d := cmp.Diff(want, got, protocmp.Transform(), protocmp.IgnoreFields(&ctrlv1.WorkspaceCommand{}, "created_at")); d != "" {
			t.Errorf("GetWorkspaceCommand (-want +got):\n%s", d)
		}
		w, pub := load(t, e.st, "ws-b")
		if w.Power != store.PowerStopped || w.ForceStop || w.CommandID != stopB || w.Generation != 2 ||
			pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING {
			t.Errorf("ws-b = power %v force %v command %q generation %d state %v; want a normal stop in flight",
				w.Power, w.ForceStop, w.CommandID, w.Generation, pub.GetState())
		}

		// One at a time: nothing more while ws-b stops.
		e.advance(5 * time.Second)
		e.beat(cond(lvCritical, "ws-a", 300, "ws-b", 500, "ws-c", 100))
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-b"}) {
			t.Fatalf("victims while ws-b stops = %v, want [ws-b]", v)
		}
		// The stop completes; a condition measured before that changes
		// nothing, one received after it chooses the next.
		e.advance(time.Second)
		measured := e.r.now()
		e.advance(time.Second)
		e.report("ws-b", nodev1.ExecState_EXEC_STATE_STOPPED, false)
		if c := e.command(stopB); c.Status != store.CommandCompleted || c.ErrorCode != "" {
			t.Fatalf("%s after the node's report = %+v, want COMPLETED", stopB, c)
		}
		if err := e.r.evaluateMemory(t.Context(), "n1", cond(lvCritical, "ws-a", 300, "ws-c", 100), measured); err != nil {
			t.Fatal(err)
		}
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-b"}) {
			t.Fatalf("victims after a condition from before the stop ended = %v, want [ws-b]", v)
		}
		e.beat(cond(lvCritical, "ws-a", 300, "ws-c", 100))
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-b", "ws-a"}) {
			t.Fatalf("victims = %v, want [ws-b ws-a]", v)
		}
		if m := workspace.CommandMessage(e.command(victimID("n1", 1, "ws-a"))).GetMessage(); !strings.Contains(m, "the largest user (300 MiB)") ||
			!strings.HasSuffix(m, "; stop 2 of at most 8 in episode host-memory/n1/1") {
			t.Errorf("message of the second stop = %q", m)
		}
		// The completed stop still says why.
		if m := workspace.CommandMessage(e.command(stopB)).GetMessage(); m != want.GetMessage() {
			t.Errorf("message of %s once completed = %q, want %q", stopB, m, want.GetMessage())
		}
		e.report("ws-a", nodev1.ExecState_EXEC_STATE_STOPPED, false)

		// Below CRITICAL: the episode ends, ws-c keeps running.
		e.advance(time.Second)
		e.beat(cond(lvModerate, "ws-c", 100))
		if ep := e.command(episodeID("n1", 1)); ep.Status != store.CommandCompleted || !ep.CompletedAt.Equal(e.r.now()) {
			t.Fatalf("episode 1 after MODERATE = %+v, want COMPLETED now", ep)
		}
		if _, pub := load(t, e.st, "ws-c"); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			t.Errorf("ws-c = %v, want AVAILABLE", pub.GetState())
		}
		if c := e.command(victimID("n1", 1, "ws-c")); c != nil {
			t.Errorf("ws-c was stopped: %+v", c)
		}
		// The record says why: the condition at the opening, the victims
		// with their use.
		rec := &nodev1.MemoryCondition{}
		if err := proto.Unmarshal(e.command(episodeID("n1", 1)).Result, rec); err != nil {
			t.Fatal(err)
		}
		wantRec := &nodev1.MemoryCondition{Level: lvCritical, UsedMib: 990, LimitMib: 1000, PsiSomeAvg10: 12,
			Workspaces: []*nodev1.WorkspaceMemory{{WorkspaceId: "ws-b", UsedMib: 500}, {WorkspaceId: "ws-a", UsedMib: 300}}}
		if d := cmp.Diff(wantRec, rec, protocmp.Transform()); d != "" {
			t.Errorf("episode record (-want +got):\n%s", d)
		}

		// CRITICAL again: episode 2.
		e.advance(time.Minute)
		e.beat(cond(lvCritical, "ws-c", 100))
		if v := e.victims(2); !cmp.Equal(v, []string{"ws-c"}) {
			t.Fatalf("episode 2 victims = %v, want [ws-c]", v)
		}
		// A restarted ctrl finds episode 2 open, and the next episode after
		// it is 3.
		r2 := New(Config{Store: e.st, Now: e.clock.Now})
		if n, open, err := r2.episodeOf(t.Context(), "n1"); n != 2 || !open || err != nil {
			t.Fatalf("episodeOf after a restart = %d, %v, %v; want 2, open", n, open, err)
		}
		e.r = r2
		e.report("ws-c", nodev1.ExecState_EXEC_STATE_STOPPED, false)
		e.beat(cond(lvNone))
		e.beat(cond(lvCritical))
		if e.command(episodeID("n1", 3)) == nil || e.command(episodeID("n1", 2)).Status != store.CommandCompleted {
			t.Errorf("after a restart, NONE then CRITICAL: episode 2 not completed or episode 3 not opened")
		}
		if v := e.victims(3); len(v) != 0 {
			t.Errorf("episode 3 stopped %v with nothing running", v)
		}
	})
}

// TestHostMemoryRecentStart: a workspace that a condition listed less
// than HostMemoryMinAge ago is spared; the smaller, older one goes, and
// the recent one once it is old enough.
func TestHostMemoryRecentStart(t *testing.T) {
	memDialects(t, func(e *memEnv) {
		e.available("ws-old", "ws-new")
		e.beat(cond(lvNone, "ws-old", 100))
		e.advance(5 * time.Second)
		e.beat(cond(lvModerate, "ws-old", 100, "ws-new", 800))
		e.advance(HostMemoryMinAge - time.Second)
		e.beat(cond(lvCritical, "ws-old", 100, "ws-new", 800))
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-old"}) {
			t.Fatalf("victims = %v, want [ws-old] (ws-new started %v ago)", v, HostMemoryMinAge-time.Second)
		}
		e.report("ws-old", nodev1.ExecState_EXEC_STATE_STOPPED, false)
		e.advance(time.Second)
		e.beat(cond(lvCritical, "ws-new", 800))
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-old", "ws-new"}) {
			t.Fatalf("victims = %v, want [ws-old ws-new] once ws-new is %v old", v, HostMemoryMinAge)
		}
	})
}

// TestHostMemoryRecentStartBaseline: a workspace the first condition
// this ctrl receives lists already counts from its latest report.
func TestHostMemoryRecentStartBaseline(t *testing.T) {
	memDialects(t, func(e *memEnv) {
		e.available("ws-old", "ws-new")
		e.report("ws-new", nodev1.ExecState_EXEC_STATE_RUNNING, true) // observed now
		e.advance(HostMemoryMinAge - time.Second)
		e.beat(cond(lvCritical, "ws-old", 100, "ws-new", 800))
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-old"}) {
			t.Fatalf("victims = %v, want [ws-old] (ws-new reported %v ago)", v, HostMemoryMinAge-time.Second)
		}
		e.report("ws-old", nodev1.ExecState_EXEC_STATE_STOPPED, false)
		e.advance(time.Second)
		e.beat(cond(lvCritical, "ws-new", 800))
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-old", "ws-new"}) {
			t.Fatalf("victims = %v, want [ws-old ws-new]", v)
		}
	})
}

// TestHostMemoryForce: a normal stop still running after
// HostMemoryForceAfter is forced under .../force (superseding it); a
// normal stop that failed with the execution held is forced at once;
// a forced stop that hangs past the bound lets the next victim go.
func TestHostMemoryForce(t *testing.T) {
	memDialects(t, func(e *memEnv) {
		e.available("ws-a", "ws-b", "ws-c")
		e.beat(cond(lvCritical, "ws-a", 300, "ws-b", 200, "ws-c", 100))
		stopA := victimID("n1", 1, "ws-a")
		e.advance(HostMemoryForceAfter - time.Second)
		e.beat(cond(lvCritical, "ws-a", 300, "ws-b", 200, "ws-c", 100))
		if c := e.command(stopA + "/force"); c != nil {
			t.Fatalf("forced before the bound: %+v", c)
		}
		e.advance(time.Second)
		e.beat(cond(lvCritical, "ws-a", 300, "ws-b", 200, "ws-c", 100))
		force := e.command(stopA + "/force")
		if force == nil || force.Status != store.CommandProcessing || ctrlv1.CommandInitiator(force.Initiator) != ctrlv1.CommandInitiator_COMMAND_INITIATOR_HOST_MEMORY {
			t.Fatalf("%s/force = %+v, want PROCESSING by HOST_MEMORY", stopA, force)
		}
		if c := e.command(stopA); c.Status != store.CommandCompleted || c.ErrorCode == "" {
			t.Errorf("%s after the force = %+v, want superseded", stopA, c)
		}
		if m, want := workspace.CommandMessage(force).GetMessage(), "host memory: node n1 still used 990 MiB of its 1000 MiB budget (CRITICAL); "+
			"forced because the normal stop host-memory/n1/1/ws-a did not complete within 30 s"; m != want {
			t.Errorf("message of %s/force = %q, want %q", stopA, m, want)
		}
		if w, _ := load(t, e.st, "ws-a"); !w.ForceStop || w.CommandID != stopA+"/force" {
			t.Errorf("ws-a = force %v command %q, want the forced stop in flight", w.ForceStop, w.CommandID)
		}
		e.report("ws-a", nodev1.ExecState_EXEC_STATE_STOPPED, false)

		// ws-b: the guest cannot write back; FAILED holding its execution.
		e.advance(time.Second)
		e.beat(cond(lvCritical, "ws-b", 200, "ws-c", 100))
		stopB := victimID("n1", 1, "ws-b")
		if e.command(stopB) == nil {
			t.Fatalf("ws-b was not chosen after ws-a; victims %v", e.victims(1))
		}
		e.report("ws-b", nodev1.ExecState_EXEC_STATE_FAILED, true)
		if _, pub := load(t, e.st, "ws-b"); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED || !pub.GetHoldsExecution() {
			t.Fatalf("ws-b after a failed writeback = %v holds %v", pub.GetState(), pub.GetHoldsExecution())
		}
		e.advance(time.Second)
		e.beat(cond(lvCritical, "ws-b", 200, "ws-c", 100))
		if c := e.command(stopB + "/force"); c == nil {
			t.Fatalf("a failed normal stop holding its execution was not forced")
		} else if m, want := workspace.CommandMessage(c).GetMessage(), "host memory: node n1 still used 990 MiB of its 1000 MiB budget (CRITICAL); "+
			"forced because the normal stop host-memory/n1/1/ws-b failed (failed_precondition, GUEST_WRITEBACK_FAILED) and the workspace still holds its execution"; m != want {
			t.Errorf("message of %s/force = %q, want %q", stopB, m, want)
		}
		// The forced stop hangs: past the bound the next victim follows.
		e.advance(HostMemoryForceAfter - time.Second)
		e.beat(cond(lvCritical, "ws-b", 200, "ws-c", 100))
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-a", "ws-b"}) {
			t.Fatalf("victims = %v, want [ws-a ws-b] while the forced stop of ws-b is under way", v)
		}
		e.advance(time.Second)
		e.beat(cond(lvCritical, "ws-b", 200, "ws-c", 100))
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-a", "ws-b", "ws-c"}) {
			t.Fatalf("victims = %v, want [ws-a ws-b ws-c] once the forced stop hung %v", v, HostMemoryForceAfter)
		}
	})
}

// TestHostMemoryBound: an episode stops at most maxStops workspaces, and
// never one that is not AVAILABLE on the node.
func TestHostMemoryBound(t *testing.T) {
	memDialects(t, func(e *memEnv) {
		e.r.mem.maxStops = 2
		e.available("ws-a", "ws-b", "ws-c")
		seed(t, e.st, e.clock.Now(), row{id: "ws-stopped", node: "n1", power: store.PowerStopped, generation: 2, observed: 2,
			exec: store.ExecStopped, state: ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED})
		seed(t, e.st, e.clock.Now(), row{id: "ws-elsewhere", node: "n2", power: store.PowerRunning, generation: 1, observed: 1,
			exec: store.ExecRunning, state: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE})
		all := []any{"ws-stopped", 900, "ws-elsewhere", 800, "ws-unknown", 700, "ws-a", 300, "ws-b", 200, "ws-c", 100}
		for range 4 {
			e.beat(cond(lvCritical, all...))
			for _, id := range e.victims(1) {
				if c := e.command(victimID("n1", 1, id)); c.Status == store.CommandProcessing {
					e.report(id, nodev1.ExecState_EXEC_STATE_STOPPED, false)
				}
			}
			e.advance(time.Second)
		}
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-a", "ws-b"}) {
			t.Fatalf("victims = %v, want [ws-a ws-b] (bound 2, only AVAILABLE workspaces of n1)", v)
		}
		if _, pub := load(t, e.st, "ws-c"); pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			t.Errorf("ws-c = %v, want AVAILABLE", pub.GetState())
		}
	})
}

// TestHostMemoryExactlyOnce: conditions evaluated together, by one ctrl or
// by two (two Reconcilers on one store), record one episode and one victim.
func TestHostMemoryExactlyOnce(t *testing.T) {
	memDialects(t, func(e *memEnv) {
		e.available("ws-a", "ws-b")
		other := New(Config{Store: e.st, Now: e.clock.Now})
		c := cond(lvCritical, "ws-a", 300, "ws-b", 200)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			r := e.r
			if i%2 == 1 {
				r = other
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := r.evaluateMemory(t.Context(), "n1", c, r.now()); err != nil && !strings.Contains(err.Error(), "recorded meanwhile") {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("evaluateMemory: %v", err)
		}
		// The losers of the race learn the episode from the store.
		e.beat(c)
		if e.command(episodeID("n1", 2)) != nil {
			t.Fatalf("two episodes opened")
		}
		if v := e.victims(1); !cmp.Equal(v, []string{"ws-a"}) {
			t.Fatalf("victims = %v, want [ws-a] exactly once", v)
		}
		if c := e.command(victimID("n1", 1, "ws-b")); c != nil {
			t.Errorf("ws-b stopped too: %+v", c)
		}
		if w, _ := load(t, e.st, "ws-a"); w.Generation != 2 {
			t.Errorf("ws-a generation = %d, want 2 (one stop)", w.Generation)
		}
	})
}

// TestHostMemoryHeartbeat: conditions arriving through the heartbeat hook
// are evaluated by the node's worker, without blocking the stream: the
// CRITICAL one stops the largest workspace.
func TestHostMemoryHeartbeat(t *testing.T) {
	r, st, clock := newTest(t, Config{})
	connectNode(t, r, hello("n1", 4096, 4000, ""))
	e := &memEnv{t: t, r: r, st: st, clock: clock}
	e.available("ws-a", "ws-b")
	r.memoryCondition(t.Context(), "n1", nil) // not measured: nothing
	r.memoryCondition(t.Context(), "n1", cond(lvNone, "ws-a", 10, "ws-b", 20))
	r.memoryCondition(t.Context(), "n1", cond(lvCritical, "ws-a", 10, "ws-b", 20))
	deadline := time.Now().Add(10 * time.Second)
	for e.command(victimID("n1", 1, "ws-b")) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the CRITICAL heartbeat stopped nothing within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A node ID that no command ID can hold is left alone.
	long := strings.Repeat("n", 120)
	r.memoryCondition(t.Context(), long, cond(lvCritical, "ws-a", 10))
	r.mem.mu.Lock()
	_, tracked := r.mem.nodes[long]
	r.mem.mu.Unlock()
	if tracked {
		t.Errorf("a node whose ID cannot make a command ID is tracked")
	}
}
