package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/workspace"
)

// TestPickFleet: placement honours the fleet's records: only ACTIVE nodes
// take new Workspaces (the reason names the states when only others
// could), memory and CPU are admitted up to capacity times the ratios, one
// Workspace never gets more CPU than the node has, and a published
// template version goes to any node that fetches artifacts.
func TestPickFleet(t *testing.T) {
	node := func(id string, state fleet.State, memMiB, cpuMillis, usedMiB, usedCPU uint64, ratios fleet.Ratios) candidate {
		return candidate{id: id, state: state, ratios: ratios, usedMiB: usedMiB, usedCPU: usedCPU,
			capacity:  workspace.Capacity{MemoryMiB: memMiB, CPUMillis: cpuMillis},
			templates: map[string]string{workspace.DefaultTemplate: "default-v1"}}
	}
	one := fleet.Ratios{Memory: 1, CPU: 1}
	active := func(id string, memMiB, cpuMillis, usedMiB, usedCPU uint64, r fleet.Ratios) candidate {
		return node(id, fleet.StateActive, memMiB, cpuMillis, usedMiB, usedCPU, r)
	}
	ask := func(memMiB, cpuMillis uint64) demand {
		return demand{template: workspace.DefaultTemplate, memoryMiB: memMiB, cpuMillis: cpuMillis}
	}
	artifacts := func(c candidate) candidate { c.artifacts = true; return c }
	published := demand{template: "debian", version: "3", published: true, memoryMiB: 256, cpuMillis: 500}
	const noFit = "no connected node has the memory and CPU this workspace requests"
	for _, tc := range []struct {
		name   string
		nodes  []candidate
		demand demand
		want   string
		reason string
	}{
		// State.
		{"active", []candidate{active("a", 1024, 1000, 0, 0, one)}, ask(256, 500), "a", ""},
		{"no record yet counts as active", []candidate{node("a", "", 1024, 1000, 0, 0, one)}, ask(256, 500), "a", ""},
		{"draining skipped for the active one", []candidate{node("a", fleet.StateDraining, 8192, 4000, 0, 0, one),
			active("b", 1024, 1000, 0, 0, one)}, ask(256, 500), "b", ""},
		{"isolated skipped", []candidate{node("a", fleet.StateIsolated, 8192, 4000, 0, 0, one),
			active("b", 1024, 1000, 0, 0, one)}, ask(256, 500), "b", ""},
		{"only a draining node could", []candidate{node("a", fleet.StateDraining, 8192, 4000, 0, 0, one),
			active("b", 128, 1000, 0, 0, one)}, ask(256, 500), "",
			`only nodes that are not ACTIVE could hold this workspace, and no new workspace is placed on them: node "a" is draining`},
		{"no node active", []candidate{node("a", fleet.StateDraining, 128, 4000, 0, 0, one),
			node("b", fleet.StateIsolated, 128, 4000, 0, 0, one)}, ask(256, 500), "",
			`no connected node is ACTIVE: node "a" is draining, node "b" is isolated`},
		{"volume node draining", []candidate{node("a", fleet.StateDraining, 8192, 4000, 0, 0, one), active("b", 8192, 4000, 0, 0, one)},
			demand{template: workspace.DefaultTemplate, memoryMiB: 256, cpuMillis: 500, node: "a"}, "",
			`only nodes that are not ACTIVE could hold this workspace, and no new workspace is placed on them: node "a" is draining`},
		// Memory ratio.
		{"memory without overcommit", []candidate{active("a", 1024, 4000, 1000, 0, one)}, ask(256, 500), "", noFit},
		{"memory overcommitted 2x", []candidate{active("a", 1024, 4000, 1000, 0, fleet.Ratios{Memory: 2, CPU: 1})},
			ask(1048, 500), "a", ""},
		{"memory overcommitted 2x, one MiB over", []candidate{active("a", 1024, 4000, 1000, 0, fleet.Ratios{Memory: 2, CPU: 1})},
			ask(1049, 500), "", noFit},
		{"a ratio below 1 counts as 1", []candidate{active("a", 1024, 4000, 1000, 0, fleet.Ratios{Memory: 0.5, CPU: 0})},
			ask(24, 500), "a", ""},
		{"most free memory after the ratio", []candidate{active("a", 2048, 4000, 0, 0, one),
			active("b", 1024, 4000, 0, 0, fleet.Ratios{Memory: 3, CPU: 1})}, ask(256, 500), "b", ""},
		// CPU ratio.
		{"cpu summed without overcommit", []candidate{active("a", 4096, 1000, 0, 600, one)}, ask(256, 500), "", noFit},
		{"cpu overcommitted 4x", []candidate{active("a", 4096, 1000, 0, 3500, fleet.Ratios{Memory: 1, CPU: 4})},
			ask(256, 500), "a", ""},
		{"cpu overcommitted 4x, one over", []candidate{active("a", 4096, 1000, 0, 3501, fleet.Ratios{Memory: 1, CPU: 4})},
			ask(256, 500), "", noFit},
		{"one workspace never more than the real cpu", []candidate{active("a", 4096, 1000, 0, 0, fleet.Ratios{Memory: 1, CPU: 8})},
			ask(256, 1001), "", noFit},
		// Published templates.
		{"published on a node fetching artifacts", []candidate{active("a", 1024, 4000, 0, 0, one),
			artifacts(active("b", 1024, 4000, 0, 0, one))}, published, "b", ""},
		{"published held without the feature", []candidate{func() candidate {
			c := active("a", 1024, 4000, 0, 0, one)
			c.templates["debian"] = "3"
			return c
		}()}, published, "a", ""},
		{"published: another version held is not it", []candidate{func() candidate {
			c := active("a", 1024, 4000, 0, 0, one)
			c.templates["debian"] = "2"
			return c
		}()}, published, "",
			`no connected ACTIVE node fetches published templates (feature artifacts) or holds template "debian" version "3"`},
		{"the default still needs a holder", []candidate{func() candidate {
			c := artifacts(active("a", 1024, 4000, 0, 0, one))
			c.templates = map[string]string{}
			return c
		}()}, ask(256, 500), "", `no connected node holds template "default"`},
		{"published on a draining artifacts node", []candidate{artifacts(node("a", fleet.StateDraining, 1024, 4000, 0, 0, one)),
			active("b", 1024, 4000, 0, 0, one)}, published, "",
			`only nodes that are not ACTIVE could hold this workspace, and no new workspace is placed on them: node "a" is draining`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := pick(tc.nodes, tc.demand)
			id := ""
			if got != nil {
				id = got.id
			}
			if id != tc.want || reason != tc.reason {
				t.Errorf("pick = %q, %q; want %q, %q", id, reason, tc.want, tc.reason)
			}
		})
	}
}

// setRecord edits node's fleet record (creating it ACTIVE when absent).
func setRecord(t *testing.T, st store.Store, node string, edit func(*fleet.Record)) {
	t.Helper()
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		r, rec, err := fleet.GetRecord(t.Context(), tx, node)
		if errors.Is(err, store.ErrNotFound) {
			r, rec, err = nil, &fleet.Record{RegistrationVersion: 1, State: fleet.StateActive}, nil
		}
		if err != nil {
			return err
		}
		edit(rec)
		return fleet.PutRecord(t.Context(), tx, r, node, rec, t0)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// putJSON writes a fleet row of kind whose spec is v.
func putJSON(t *testing.T, st store.Store, kind store.ResourceKind, id string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	err = st.InTx(t.Context(), func(tx store.Tx) error {
		r := &store.Resource{Kind: kind, ID: id, CreatedAt: t0, UpdatedAt: t0, Revision: 1, Spec: b,
			LabelsRevision: 1, AnnotationsRevision: 1, Labels: map[string]string{}, Annotations: map[string]string{}}
		if old, err := tx.GetResource(t.Context(), kind, id); err == nil {
			r.Revision = old.Revision + 1
			return tx.UpdateResource(t.Context(), r)
		}
		return tx.InsertResource(t.Context(), r)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestChooseRatios: the ratios choose applies come from the fleet's
// records: the node's own, else its agent's memory ratio, else the
// defaults; and a pool override bounds the pool.
func TestChooseRatios(t *testing.T) {
	for _, tc := range []struct {
		name     string
		agent    float64       // Hello memory_overcommit_ratio
		override *fleet.Ratios // the node's own
		defaults *fleet.Ratios
		memMiB   uint32 // asked; 1000 MiB of the node's 1024 are used
		cpu      uint32 // asked; 1000 of the node's 1000 millicores are used
		want     bool
	}{
		{name: "built-in defaults: memory 1", memMiB: 24, cpu: 100, want: true},
		{name: "built-in defaults: memory 1, over", memMiB: 25, cpu: 100},
		{name: "built-in defaults: cpu 4", memMiB: 24, cpu: 1000, want: true},
		{name: "agent memory ratio", agent: 2, memMiB: 1048, cpu: 100, want: true},
		{name: "agent memory ratio, over", agent: 2, memMiB: 1049, cpu: 100},
		{name: "absurd agent ratio ignored", agent: 100, memMiB: 25, cpu: 100},
		{name: "defaults", defaults: &fleet.Ratios{Memory: 3, CPU: 1}, memMiB: 2072, cpu: 0, want: true},
		{name: "defaults: cpu 1", defaults: &fleet.Ratios{Memory: 3, CPU: 1}, memMiB: 24, cpu: 1},
		{name: "agent ratio over the defaults' memory", agent: 2, defaults: &fleet.Ratios{Memory: 3, CPU: 1}, memMiB: 1049, cpu: 0},
		{name: "node override over the agent", agent: 2, override: &fleet.Ratios{Memory: 1, CPU: 2}, memMiB: 25, cpu: 100},
		{name: "node override over the defaults", defaults: &fleet.Ratios{Memory: 1, CPU: 1},
			override: &fleet.Ratios{Memory: 4, CPU: 2}, memMiB: 3096, cpu: 1000, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, st, _ := newTest(t, Config{})
			h := hello("n1", 1024, 1000, "", workspace.DefaultTemplate)
			h.Capacity.MemoryOvercommitRatio = tc.agent
			connectNode(t, r, h)
			seed(t, st, t0, row{id: "ws-run", node: "n1", power: running, generation: 1, state: wsAvail, memMiB: 1000})
			if tc.override != nil {
				setRecord(t, st, "n1", func(rec *fleet.Record) { rec.Overcommit = tc.override })
			}
			if tc.defaults != nil {
				putJSON(t, st, fleet.KindDefaults, fleet.DefaultsID, tc.defaults)
			}
			// 1000 millicores used: two running Workspaces of 500.
			seed(t, st, t0, row{id: "ws-cpu", node: "n1", power: running, generation: 1, state: wsAvail, memMiB: 1})
			editMemory(t, st, "ws-cpu", 0)
			if err := r.loadFleet(t.Context()); err != nil {
				t.Fatal(err)
			}
			got := chooseFor(t, r, st, &ctrlv1.Workspace{Template: &ctrlv1.TemplateRef{TemplateId: workspace.DefaultTemplate},
				Resources: &ctrlv1.Resources{MemoryMib: tc.memMiB, CpuMillis: tc.cpu}})
			if (got == "n1") != tc.want {
				t.Errorf("choose = %q, want placed %v", got, tc.want)
			}
		})
	}
}

// editMemory sets a seeded Workspace's memory.
func editMemory(t *testing.T, st store.Store, id string, mib uint32) {
	t.Helper()
	editRow(t, st, id, func(_ *store.Workspace, pub *ctrlv1.Workspace) { pub.Resources.MemoryMib = mib })
}

func editRow(t *testing.T, st store.Store, id string, edit func(*store.Workspace, *ctrlv1.Workspace)) {
	t.Helper()
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(t.Context(), id)
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		edit(w, pub)
		if err := workspace.Save(w, pub, t0); err != nil {
			return err
		}
		return tx.UpdateWorkspace(t.Context(), w)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// chooseFor runs choose for pub and returns the node's ID ("" for none).
func chooseFor(t *testing.T, r *Reconciler, st store.Store, pub *ctrlv1.Workspace) string {
	t.Helper()
	id, _ := chooseWhy(t, r, st, pub)
	return id
}

func chooseWhy(t *testing.T, r *Reconciler, st store.Store, pub *ctrlv1.Workspace) (string, string) {
	t.Helper()
	var got *candidate
	var reason string
	err := st.View(t.Context(), func(tx store.Tx) error {
		var err error
		got, reason, err = r.choose(t.Context(), tx, pub)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got == nil {
		return "", reason
	}
	return got.id, ""
}

// TestChoosePoolOverride: a pool's capacity override smaller than the
// reported size bounds what placement promises from it; a larger one does
// not raise it.
func TestChoosePoolOverride(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name     string
		override uint64
		want     string
	}{
		{"no override", 0, "n1"},
		{"override leaves room", 2 * gib, "n1"},
		{"override too small", 2*gib - 1, ""},
		{"override above the reported size", 8 * gib, "n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, st, _ := newTest(t, Config{})
			h := hello("n1", 8192, 4000, "pool-a", workspace.DefaultTemplate)
			h.Capacity.StorageBytes = 4 * gib
			connectNode(t, r, h)
			// One GiB promised to a Workspace on the node.
			seed(t, st, t0, row{id: "ws-1", node: "n1", power: stopped, generation: 1, state: wsStoped})
			if tc.override > 0 {
				putJSON(t, st, fleet.KindPool, fleet.PoolKey("n1", "pool-a"), fleet.PoolRecord{OverrideBytes: tc.override})
			}
			if err := r.loadFleet(t.Context()); err != nil {
				t.Fatal(err)
			}
			got, reason := chooseWhy(t, r, st, &ctrlv1.Workspace{Template: &ctrlv1.TemplateRef{TemplateId: workspace.DefaultTemplate},
				Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 100}, WritableLayer: &ctrlv1.WritableLayer{CapacityBytes: gib}})
			if got != tc.want {
				t.Errorf("choose = %q (%s), want %q", got, reason, tc.want)
			}
		})
	}
}

// TestPlaceRechecksState: the cached view may be a second old; the node a
// decision picks must still be ACTIVE by its record, or the Workspace
// waits for the next pass, which sees the new view.
func TestPlaceRechecksState(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	connectNode(t, r, hello("n1", 1024, 4000, "", workspace.DefaultTemplate))
	connectNode(t, r, hello("n2", 512, 4000, "", workspace.DefaultTemplate))
	if err := r.loadFleet(t.Context()); err != nil {
		t.Fatal(err)
	}
	setRecord(t, st, "n1", func(rec *fleet.Record) { rec.State = fleet.StateDraining }) // the cache does not know
	seed(t, st, t0, row{id: "ws-1", power: running, generation: 1, state: wsCreate, command: "c-1"})
	placed, _, err := r.place(t.Context(), nil, "ws-1")
	if err != nil || placed != nil {
		t.Fatalf("place with a stale view = %v, %v; want not placed", placed, err)
	}
	if err := r.refreshFleet(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	placed, _, err = r.place(t.Context(), nil, "ws-1")
	if err != nil || placed == nil || placed.NodeID != "n2" {
		t.Fatalf("place after the reload = %v, %v; want n2", placed, err)
	}
}

// TestPlaceKeepsPublishedVersion: a published template version stays the
// one the Workspace was created from; the default runs at the node's.
func TestPlaceKeepsPublishedVersion(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	h := hello("n1", 1024, 4000, "", workspace.DefaultTemplate, "debian")
	h.Features = []string{nodewire.FeatureArtifacts}
	connectNode(t, r, h)
	seed(t, st, t0, row{id: "ws-1", power: running, generation: 1, state: wsCreate, command: "c-1"})
	editRow(t, st, "ws-1", func(_ *store.Workspace, pub *ctrlv1.Workspace) {
		pub.Template = &ctrlv1.TemplateRef{TemplateId: "debian", Version: "7"}
	})
	if placed, _, err := r.place(t.Context(), nil, "ws-1"); err != nil || placed == nil {
		t.Fatalf("place = %v, %v", placed, err)
	}
	if _, pub := load(t, st, "ws-1"); pub.GetTemplate().GetVersion() != "7" {
		t.Errorf("template version = %q, want 7 (the published one)", pub.GetTemplate().GetVersion())
	}
}

// TestRegisterFleetRecord: a Hello gives the node a fleet record (ACTIVE,
// registration version 1) with the key it spoke with; a later Hello with
// another key records it without a new version; a RETIRED node is
// refused and nothing of its Hello is written.
func TestRegisterFleetRecord(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	key1, key2 := []byte(strings.Repeat("a", 32)), []byte(strings.Repeat("b", 32))
	h := hello("n1", 1024, 4000, "", workspace.DefaultTemplate)
	if err := r.registerKey(t.Context(), h, key1, admitAll); err != nil {
		t.Fatal(err)
	}
	rec := record(t, st, "n1")
	if rec.RegistrationVersion != 1 || rec.State != fleet.StateActive || string(rec.KeyHash) != string(key1) {
		t.Errorf("record = %+v; want version 1, ACTIVE, key1", rec)
	}
	if err := r.registerKey(t.Context(), h, key2, admitAll); err != nil {
		t.Fatal(err)
	}
	if rec := record(t, st, "n1"); rec.RegistrationVersion != 1 || string(rec.KeyHash) != string(key2) {
		t.Errorf("record after a new key = %+v; want version 1, key2", rec)
	}
	setRecord(t, st, "n1", func(rec *fleet.Record) { rec.State = fleet.StateRetired })
	h.Capacity.MemoryMib = 4096
	err := r.registerKey(t.Context(), h, key2, admitAll)
	if fe, ok := fault.As(err); !ok || fe.Kind != fault.KindFailedPrecondition || !strings.Contains(fe.Message, "retired") {
		t.Fatalf("register of a retired node = %v, want failed_precondition", err)
	}
	_ = st.View(t.Context(), func(tx store.Tx) error {
		n, err := tx.GetNode(t.Context(), "n1")
		if err != nil || n.MemoryMiB != 1024 {
			t.Errorf("node after the refusal = %+v, %v; want its old capacity", n, err)
		}
		return nil
	})
}

func record(t *testing.T, st store.Store, node string) *fleet.Record {
	t.Helper()
	var rec *fleet.Record
	if err := st.View(t.Context(), func(tx store.Tx) error {
		var err error
		_, rec, err = fleet.GetRecord(t.Context(), tx, node)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestEndKeyAndDataPlane: EndKey ends the streams of a key denied
// elsewhere and calls OnDenyNodeKey; EndDataPlane calls OnEndDataPlane.
func TestEndKeyAndDataPlane(t *testing.T) {
	var mu sync.Mutex
	var denied [][]byte
	var ended []string
	r, _, _ := newTest(t, Config{
		OnDenyNodeKey:  func(k []byte) { mu.Lock(); denied = append(denied, k); mu.Unlock() },
		OnEndDataPlane: func(n string) { mu.Lock(); ended = append(ended, n); mu.Unlock() },
	})
	key := []byte(strings.Repeat("k", 32))
	nc1 := r.attach(hello("n1", 1024, 4000, ""), key)
	nc2 := r.attach(hello("n2", 1024, 4000, ""), []byte(strings.Repeat("o", 32)))
	r.EndKey(key)
	select {
	case <-nc1.replaced:
		if fe, ok := fault.As(nc1.endErr); !ok || fe.Kind != fault.KindPermissionDenied {
			t.Errorf("end error = %v, want permission_denied", nc1.endErr)
		}
	default:
		t.Error("the stream of the denied key did not end")
	}
	select {
	case <-nc2.replaced:
		t.Error("another key's stream ended")
	default:
	}
	r.EndDataPlane("n2")
	mu.Lock()
	defer mu.Unlock()
	if len(denied) != 1 || string(denied[0]) != string(key) || len(ended) != 1 || ended[0] != "n2" {
		t.Errorf("hooks: denied %q, ended %q", denied, ended)
	}
}

// TestMaxCapacityFleet: the largest capacity counts memory times its ratio
// and skips RETIRED nodes.
func TestMaxCapacityFleet(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	connectNode(t, r, hello("n1", 1024, 1000, ""))
	connectNode(t, r, &nodev1.Hello{NodeId: "n2", Capacity: &nodev1.Capacity{MemoryMib: 1500, CpuMillis: 2000}})
	setRecord(t, st, "n1", func(rec *fleet.Record) { rec.Overcommit = &fleet.Ratios{Memory: 2, CPU: 1} })
	if err := r.loadFleet(t.Context()); err != nil {
		t.Fatal(err)
	}
	if c := r.MaxCapacity(); c.MemoryMiB != 2048 || c.CPUMillis != 1000 {
		t.Errorf("MaxCapacity = %+v, want n1's 2048 MiB, 1000 millicores", c)
	}
	setRecord(t, st, "n1", func(rec *fleet.Record) { rec.State = fleet.StateRetired })
	r.FleetChanged()
	if c := r.MaxCapacity(); c.MemoryMiB != 1500 {
		t.Errorf("MaxCapacity with n1 retired = %+v, want n2's", c)
	}
}

// BenchmarkPlacement1000Nodes is one placement decision (choose, in its
// own store view, and the picked node's state re-read) with 1,000
// registered nodes: hollow store.Node rows,
// their fleet records (a tenth DRAINING, a tenth with their own
// overcommit), all connected, on SQLite, each with two Workspaces.
func BenchmarkPlacement1000Nodes(b *testing.B) {
	st, err := sqlite.Open(context.Background(), b.TempDir()+"/ctrl.db")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	r := New(Config{Store: st, Now: func() time.Time { return t0 }})
	ctx := context.Background()
	const nodes = 1000
	err = st.InTx(ctx, func(tx store.Tx) error {
		for i := range nodes {
			id := fmt.Sprintf("node-%04d", i)
			h := hello(id, 65536, 32000, "pool-a", workspace.DefaultTemplate)
			h.Capacity.StorageBytes = 1 << 40
			doc, err := proto.Marshal(h)
			if err != nil {
				return err
			}
			if err := tx.UpsertNode(ctx, &store.Node{ID: id, CreatedAt: t0, LastSeen: t0, MemoryMiB: 65536, CPUMillis: 32000,
				StorageBytes: 1 << 40, Doc: doc}); err != nil {
				return err
			}
			rec := &fleet.Record{RegistrationVersion: 1, State: fleet.StateActive, StateChangedAt: t0}
			switch i % 10 {
			case 1:
				rec.State = fleet.StateDraining
			case 2:
				rec.Overcommit = &fleet.Ratios{Memory: 2, CPU: 8}
			}
			if err := fleet.PutRecord(ctx, tx, nil, id, rec, t0); err != nil {
				return err
			}
			for j := range 2 {
				pub := &ctrlv1.Workspace{WorkspaceId: fmt.Sprintf("ws-%04d-%d", i, j), State: wsAvail,
					Template:      &ctrlv1.TemplateRef{TemplateId: workspace.DefaultTemplate},
					Resources:     &ctrlv1.Resources{MemoryMib: 1024, CpuMillis: 1000},
					WritableLayer: &ctrlv1.WritableLayer{CapacityBytes: 1 << 30},
					Placement:     &ctrlv1.Placement{NodeId: id}}
				w := &store.Workspace{ID: pub.WorkspaceId, CreatedAt: t0, NodeID: id, Power: running, Generation: 1, ObservedGeneration: 1}
				if err := workspace.Save(w, pub, t0); err != nil {
					return err
				}
				if err := tx.InsertWorkspace(ctx, w); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.loadNodes(ctx); err != nil {
		b.Fatal(err)
	}
	if err := r.loadFleet(ctx); err != nil {
		b.Fatal(err)
	}
	for i := range nodes {
		r.attach(hello(fmt.Sprintf("node-%04d", i), 65536, 32000, "pool-a", workspace.DefaultTemplate), nil)
	}
	// cached: as placement runs, the nodes weighed by sums read at most
	// once a second, the node picked read again. every-node: the sums of
	// every node read for each decision (the cache expired each time: what
	// one decision a second costs, and a decision that finds no node).
	for _, mode := range []string{"cached", "every-node"} {
		b.Run(mode, func(b *testing.B) { benchChoose(b, r, st, mode == "every-node") })
	}
}

func benchChoose(b *testing.B, r *Reconciler, st store.Store, expire bool) {
	ctx := context.Background()
	pub := &ctrlv1.Workspace{Template: &ctrlv1.TemplateRef{TemplateId: workspace.DefaultTemplate},
		Resources: &ctrlv1.Resources{MemoryMib: 2048, CpuMillis: 1000}, WritableLayer: &ctrlv1.WritableLayer{CapacityBytes: 1 << 30}}
	cpu0 := cpuTime()
	n := 0
	for b.Loop() {
		n++
		if expire {
			r.mu.Lock()
			r.usage = usageCache{}
			r.mu.Unlock()
		}
		var got *candidate
		if err := st.View(ctx, func(tx store.Tx) error {
			d, err := r.newDecider(ctx, tx, r.connected())
			if err != nil {
				return err
			}
			got, _, _, err = d.decide(ctx, tx, pub)
			if !expire {
				// What placement's commit does: the cache holds what the
				// decider read, every node's use once a second.
				d.learn()
			}
			if err == nil && got != nil {
				_, err = r.placeable(ctx, tx, got.id)
			}
			return err
		}); err != nil {
			b.Fatal(err)
		}
		if got == nil {
			b.Fatal("not placed")
		}
	}
	// CPU time as well as wall time: on a loaded machine the wall time
	// counts other processes' turns.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(n), "cpu-ns/op")
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestStartOnDrainingNode: placement applies to unplaced Workspaces only:
// a Workspace placed on a DRAINING or ISOLATED node (its writable layer is
// there) is started there, and one whose memory fits only thanks to the
// node's overcommit ratio is not refused as beyond the node.
func TestStartOnDrainingNode(t *testing.T) {
	for _, state := range []fleet.State{fleet.StateDraining, fleet.StateIsolated} {
		t.Run(string(state), func(t *testing.T) {
			r, st, _ := newTest(t, Config{})
			h := hello("n1", 1024, 4000, "", workspace.DefaultTemplate)
			h.Capacity.MemoryOvercommitRatio = 2
			nc := connectNode(t, r, h)
			setRecord(t, st, "n1", func(rec *fleet.Record) { rec.State = state })
			if err := r.loadFleet(t.Context()); err != nil {
				t.Fatal(err)
			}
			// A start of a stopped Workspace: generation ahead, on n1.
			seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 3, observed: 2, state: wsStoped,
				memMiB: 1500, command: "c-start", kind: ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_START})
			if err := r.pass(t.Context()); err != nil {
				t.Fatalf("pass = %v", err)
			}
			if len(nc.send) != 1 {
				t.Fatalf("%d messages sent, want the start", len(nc.send))
			}
			d := (<-nc.send).GetDesired().GetWorkspaces()
			if len(d) != 1 || d[0].GetWorkspaceId() != "ws-1" || d[0].GetGeneration() != 3 {
				t.Errorf("desired = %v, want ws-1 at generation 3", d)
			}
			if c := loadCommand(t, st, "c-start"); c.Status != store.CommandProcessing {
				t.Errorf("start command %v, want still PROCESSING (not refused)", c.Status)
			}
		})
	}
}

// TestChooseUsageCache: placement weighs nodes by sums read at most once a
// second, but never decides on them: a node that filled up since is not
// chosen (its own sums are read again), and a node that the cache thinks
// full is found when the store says it has room.
func TestChooseUsageCache(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	connectNode(t, r, hello("n2", 2048, 4000, "", workspace.DefaultTemplate))
	ask := func(mib uint32) *ctrlv1.Workspace {
		return &ctrlv1.Workspace{Template: &ctrlv1.TemplateRef{TemplateId: workspace.DefaultTemplate},
			Resources: &ctrlv1.Resources{MemoryMib: mib, CpuMillis: 100}}
	}
	if got := chooseFor(t, r, st, ask(512)); got != "n1" { // loads the cache: both empty
		t.Fatalf("choose = %q, want n1 (most free)", got)
	}
	// n1 fills up behind the cache's back (another replica's placements).
	seed(t, st, t0, row{id: "ws-full", node: "n1", power: running, generation: 1, state: wsAvail, memMiB: 4000})
	if got := chooseFor(t, r, st, ask(512)); got != "n2" {
		t.Errorf("choose after n1 filled = %q, want n2 (n1's own sums read again)", got)
	}
	// n2 fills up too, as the cache now knows n1 did; then n1 empties
	// without the cache knowing: the store is asked before refusing.
	seed(t, st, t0, row{id: "ws-full-2", node: "n2", power: running, generation: 1, state: wsAvail, memMiB: 2000})
	if got, reason := chooseWhy(t, r, st, ask(512)); got != "" {
		t.Fatalf("choose with both full = %q, want none", got)
	} else if reason != "no connected node has the memory and CPU this workspace requests" {
		t.Errorf("reason = %q", reason)
	}
	editRow(t, st, "ws-full", func(w *store.Workspace, _ *ctrlv1.Workspace) { w.Power = store.PowerStopped })
	r.mu.Lock()
	r.usage.loaded = time.Now() // the cache is fresh and wrong: n1 full
	r.mu.Unlock()
	if got := chooseFor(t, r, st, ask(512)); got != "n1" {
		t.Errorf("choose after n1 emptied = %q, want n1", got)
	}
}

// TestPlaceCountsItsOwn: the placements of one pass count in the next
// decisions at once: Workspaces spread over equal nodes.
func TestPlaceCountsItsOwn(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	connectNode(t, r, hello("n2", 4096, 4000, "", workspace.DefaultTemplate))
	var got []string
	for i := range 4 {
		id := fmt.Sprintf("ws-%d", i)
		seed(t, st, t0, row{id: id, power: running, generation: 1, state: wsCreate, command: "c-" + id, memMiB: 1024})
		placed, _, err := r.place(t.Context(), nil, id)
		if err != nil || placed == nil {
			t.Fatalf("place(%s) = %v, %v", id, placed, err)
		}
		got = append(got, placed.NodeID)
	}
	if want := []string{"n1", "n2", "n1", "n2"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("placements = %v, want %v", got, want)
	}
}
