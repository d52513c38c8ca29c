package volume_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/volume"
)

const (
	mib = volume.MiB
	gib = 1024 * mib
)

// openStore opens a fresh SQLite or PostgreSQL store (the PostgreSQL one is
// skipped without KIBOTOS_TEST_POSTGRES_URL, and fails in CI).
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
	return st
}

// forDialects runs f on SQLite and on PostgreSQL, in parallel.
func forDialects(t *testing.T, f func(t *testing.T, pg bool)) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			t.Parallel()
			f(t, pg)
		})
	}
}

// env is a Service on a store, with nodes the test plays: a node answers
// the Volumes pushed to it (every pending generation) as answer says, while
// it is "online".
type env struct {
	svc *volume.Service
	st  store.Store

	mu        sync.Mutex
	online    map[string]bool
	connected []string
	// answer builds a node's report of a pending Volume; nil answers with
	// success (the image at the desired capacity, or gone).
	answer func(node string, d *nodev1.DesiredVolume) *nodev1.VolumeReport
}

func newEnv(t *testing.T, pg bool) *env {
	t.Helper()
	st := openStore(t, pg)
	e := &env{st: st, online: map[string]bool{}}
	e.svc = &volume.Service{
		Engine: &command.Engine{Store: st}, Store: st, Pages: paging.NewCodec([]byte("0123456789abcdef0123456789abcdef")),
		Connected: func() []string {
			e.mu.Lock()
			defer e.mu.Unlock()
			return append([]string(nil), e.connected...)
		},
		WaitBound: 300 * time.Millisecond,
		Recheck:   20 * time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// addNode registers a node with a storage pool of size bytes named pool,
// connected and answering; features default to "volumes".
func (e *env) addNode(t *testing.T, id, pool string, size uint64, features ...string) {
	t.Helper()
	if features == nil {
		features = []string{nodewire.FeatureVolumes}
	}
	doc, err := proto.Marshal(&nodev1.Hello{NodeId: id, Features: features,
		Capacity: &nodev1.Capacity{MemoryMib: 8192, CpuMillis: 4000, StorageBytes: size, StoragePool: pool}})
	if err != nil {
		t.Fatal(err)
	}
	err = e.st.InTx(t.Context(), func(tx store.Tx) error {
		return tx.UpsertNode(t.Context(), &store.Node{ID: id, CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
			LastSeen: time.Now().UTC().Truncate(time.Microsecond), StorageBytes: size, MemoryMiB: 8192, CPUMillis: 4000, Doc: doc})
	})
	if err != nil {
		t.Fatal(err)
	}
	e.setOnline(id, true)
	e.mu.Lock()
	e.connected = append(e.connected, id)
	e.mu.Unlock()
}

func (e *env) setOnline(id string, on bool) {
	e.mu.Lock()
	e.online[id] = on
	e.mu.Unlock()
}

func (e *env) setAnswer(f func(node string, d *nodev1.DesiredVolume) *nodev1.VolumeReport) {
	e.mu.Lock()
	e.answer = f
	e.mu.Unlock()
}

// run plays the nodes: every few milliseconds, each pending Volume of an
// online node is answered through volume.Report, as the reconciler folds
// a VolumeReport in, and its waiters are woken after the commit.
func (e *env) run(ctx context.Context) {
	for ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
		var pending []*volume.Volume
		if e.st.View(ctx, func(tx store.Tx) error {
			all, err := volume.All(ctx, tx)
			pending = nil
			for _, v := range all {
				if v.Pending() {
					pending = append(pending, v)
				}
			}
			return err
		}) != nil {
			continue
		}
		for _, v := range pending {
			e.mu.Lock()
			on, answer := e.online[v.Node], e.answer
			e.mu.Unlock()
			if !on {
				continue
			}
			d := v.Desired()
			rep := &nodev1.VolumeReport{VolumeId: d.GetVolumeId(), Generation: d.GetGeneration(), Exists: !d.GetDeleted(), CapacityBytes: d.GetCapacityBytes()}
			if d.GetDeleted() {
				rep.CapacityBytes = 0
			}
			if answer != nil {
				if rep = answer(v.Node, d); rep == nil {
					continue
				}
			}
			e.report(ctx, v.Node, rep)
		}
	}
}

// report folds rep of node in as the reconciler does and wakes waiters.
func (e *env) report(ctx context.Context, node string, rep *nodev1.VolumeReport) (*volume.Volume, bool) {
	var (
		v    *volume.Volume
		done bool
	)
	err := e.st.InTx(ctx, func(tx store.Tx) error {
		var err error
		v, done, err = volume.Report(ctx, tx, node, rep, time.Now().UTC().Truncate(time.Microsecond))
		return err
	})
	if err != nil {
		return nil, false
	}
	if done {
		e.st.Notify(volume.Topic(v.Res.ID))
	}
	return v, done
}

func md(id string) *ctrlv1.CommandMetadata { return &ctrlv1.CommandMetadata{CommandId: id} }

func (e *env) create(t *testing.T, cid string, capacity uint64, pl *ctrlv1.Placement) (*ctrlv1.CreateVolumeResponse, error) {
	t.Helper()
	return e.svc.Create(t.Context(), &ctrlv1.CreateVolumeRequest{Metadata: md(cid), CapacityBytes: capacity, Placement: pl})
}

// mustCreate creates an AVAILABLE Volume.
func (e *env) mustCreate(t *testing.T, cid string, capacity uint64, pl *ctrlv1.Placement) *ctrlv1.Volume {
	t.Helper()
	res, err := e.create(t, cid, capacity, pl)
	if err != nil {
		t.Fatalf("CreateVolume(%s) = %v", cid, err)
	}
	if res.GetVolume().GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
		t.Fatalf("CreateVolume(%s) = %v, want AVAILABLE", cid, res.GetVolume())
	}
	return res.GetVolume()
}

func (e *env) get(t *testing.T, id string) *ctrlv1.Volume {
	t.Helper()
	v, err := e.svc.Get(t.Context(), id)
	if err != nil {
		t.Fatalf("GetVolume(%s) = %v", id, err)
	}
	return v
}

// wantFault checks err is a fault of kind and reason on field ("" for any
// field when anyField).
func wantFault(t *testing.T, what string, err error, kind fault.Kind, reason fault.Reason) *fault.Error {
	t.Helper()
	fe, ok := fault.As(err)
	if !ok || fe.Kind != kind || (reason != "" && fe.Reason != reason) {
		t.Fatalf("%s = %v, want a %v fault (%s)", what, err, kind, reason)
	}
	return fe
}

// seedWorkspace stores a Workspace placed on node whose writable layer is
// layer bytes (its deletion completed when deleted).
func seedWorkspace(t *testing.T, st store.Store, id, node string, layer uint64, deleted bool) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	pub := &ctrlv1.Workspace{WorkspaceId: id, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED,
		WritableLayer: &ctrlv1.WritableLayer{CapacityBytes: layer}}
	w := &store.Workspace{ID: id, CreatedAt: now, UpdatedAt: now, NodeID: node, Power: store.PowerStopped, Generation: 1,
		LayerBytes: layer} // the query column workspace.Save keeps equal to the document
	if deleted {
		pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
		w.DeletedAt, w.Power = now, store.PowerDeleted
	}
	w.State = int32(pub.GetState())
	doc, err := proto.Marshal(pub)
	if err != nil {
		t.Fatal(err)
	}
	w.Doc = doc
	if err := st.InTx(t.Context(), func(tx store.Tx) error { return tx.InsertWorkspace(t.Context(), w) }); err != nil {
		t.Fatal(err)
	}
}

// bind binds Volume id to Workspace ws as a binding does.
func bind(t *testing.T, st store.Store, id, ws string) {
	t.Helper()
	if err := st.InTx(t.Context(), func(tx store.Tx) error {
		return volume.Bind(t.Context(), tx, "volume_id", id, ws, "", time.Now().UTC().Truncate(time.Microsecond))
	}); err != nil {
		t.Fatalf("Bind(%s, %s) = %v", id, ws, err)
	}
}

// unbind releases Volume id from Workspace ws.
func unbind(t *testing.T, st store.Store, id, ws string) {
	t.Helper()
	if err := st.InTx(t.Context(), func(tx store.Tx) error {
		return volume.Release(t.Context(), tx, id, ws, time.Now().UTC().Truncate(time.Microsecond))
	}); err != nil {
		t.Fatalf("Release(%s, %s) = %v", id, ws, err)
	}
}
