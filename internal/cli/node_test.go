package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/store"
)

// seedNodes registers nodes straight in the store, as their Hellos do.
func seedNodes(t *testing.T, st store.Store, ids ...string) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	for _, id := range ids {
		doc, err := proto.Marshal(&nodev1.Hello{NodeId: id, Capacity: &nodev1.Capacity{MemoryMib: 8192, CpuMillis: 4000,
			StorageBytes: 10 << 30, StoragePool: "default"}, Features: []string{"volumes"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.InTx(t.Context(), func(tx store.Tx) error {
			return tx.UpsertNode(t.Context(), &store.Node{ID: id, CreatedAt: now, LastSeen: now, MemoryMiB: 8192,
				CPUMillis: 4000, StorageBytes: 10 << 30, Doc: doc})
		}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNodeCommands(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	seedNodes(t, e.Store, "worker-1", "worker-2")
	c := conn(e)

	l := kibo(t, args(c, "node", "list")...).want(t, ExitOK)
	if !strings.Contains(l.stdout, "worker-1") || !strings.Contains(l.stdout, "worker-2") || !strings.Contains(l.stdout, "active") {
		t.Errorf("node list printed:\n%s", l.stdout)
	}
	g := kibo(t, args(c, "node", "get", "worker-1")...).want(t, ExitOK)
	for _, want := range []string{"Registration version:  1", "memory x1, CPU x4 (inherited)", "default: 0 MiB used of 10240 MiB", "Features:              volumes"} {
		if !strings.Contains(g.stdout, want) {
			t.Errorf("node get lacks %q:\n%s", want, g.stdout)
		}
	}
	kibo(t, args(c, "node", "get", "nope")...).want(t, 5)

	// Without --expected-registration-version kibo reads it and says so.
	d := kibo(t, args(c, "node", "drain", "worker-1", "--command-id", "drain/1")...).want(t, ExitOK)
	if !strings.Contains(d.stderr, "registration-version: 1 (read now)") || !strings.Contains(d.stdout, "draining") {
		t.Errorf("drain printed:\n%s\n%s", d.stdout, d.stderr)
	}
	// A given version is sent as it is: a mismatch is aborted (10).
	r := kibo(t, args(c, "node", "isolate", "worker-1", "--expected-registration-version", "2")...).want(t, 10)
	if strings.Contains(r.stderr, "read now") {
		t.Errorf("kibo read the version although it was given:\n%s", r.stderr)
	}
	// Same command ID, other input: already_exists (6).
	kibo(t, args(c, "node", "isolate", "worker-1", "--command-id", "drain/1", "--expected-registration-version", "1")...).want(t, 6)
	// The same write replays.
	kibo(t, args(c, "node", "drain", "worker-1", "--command-id", "drain/1", "--expected-registration-version", "1")...).want(t, ExitOK)
	kibo(t, args(c, "node", "isolate", "worker-1", "--expected-registration-version", "1")...).want(t, ExitOK)
	kibo(t, args(c, "node", "cancel-drain", "worker-1")...).want(t, ExitOK)
	// Retiring an ACTIVE node is refused (9).
	kibo(t, args(c, "node", "retire", "worker-1")...).want(t, 9)

	// Overcommit of one node: both ratios or --inherit.
	o := kibo(t, args(c, "node", "set-overcommit", "worker-1", "--memory-ratio", "1.5", "--cpu-ratio", "8")...).want(t, ExitOK)
	if !strings.Contains(o.stdout, "memory x1.5, CPU x8 (the node's own)") {
		t.Errorf("set-overcommit printed:\n%s", o.stdout)
	}
	kibo(t, args(c, "node", "set-overcommit", "worker-1", "--memory-ratio", "1.5")...).want(t, ExitUsage)
	kibo(t, args(c, "node", "set-overcommit", "worker-1", "--inherit", "--cpu-ratio", "2")...).want(t, ExitUsage)
	kibo(t, args(c, "node", "set-overcommit", "worker-1")...).want(t, ExitUsage)
	kibo(t, args(c, "node", "set-overcommit", "worker-1", "--memory-ratio", "0.5", "--cpu-ratio", "8")...).want(t, 3)
	kibo(t, args(c, "node", "set-overcommit", "worker-1", "--memory-ratio", "1", "--cpu-ratio", "100")...).want(t, 3)
	o = kibo(t, args(c, "node", "set-overcommit", "worker-1", "--inherit")...).want(t, ExitOK)
	if !strings.Contains(o.stdout, "(inherited)") {
		t.Errorf("set-overcommit --inherit printed:\n%s", o.stdout)
	}

	// Defaults.
	od := kibo(t, args(c, "overcommit", "get")...).want(t, ExitOK)
	if !strings.Contains(od.stdout, "Version:       0") {
		t.Errorf("overcommit get printed:\n%s", od.stdout)
	}
	kibo(t, args(c, "overcommit", "set", "--memory-ratio", "1", "--cpu-ratio", "8", "--expected-version", "3")...).want(t, 10)
	os := kibo(t, args(c, "overcommit", "set", "--memory-ratio", "1", "--cpu-ratio", "8")...).want(t, ExitOK)
	if !strings.Contains(os.stderr, "version: 0 (read now)") || !strings.Contains(os.stdout, "Version:       1") {
		t.Errorf("overcommit set printed:\n%s\n%s", os.stdout, os.stderr)
	}
	kibo(t, args(c, "overcommit", "set", "--memory-ratio", "1")...).want(t, ExitUsage)
	kibo(t, args(c, "overcommit", "get", "-o", "name")...).want(t, ExitUsage)

	// Storage pools.
	sp := kibo(t, args(c, "storage-pool", "list", "worker-2")...).want(t, ExitOK)
	if !strings.Contains(sp.stdout, "worker-2") || strings.Contains(sp.stdout, "worker-1") || !strings.Contains(sp.stdout, "10240 MiB") {
		t.Errorf("storage-pool list printed:\n%s", sp.stdout)
	}
	sc := kibo(t, args(c, "storage-pool", "set-capacity", "worker-2", "default", "4096", "-o", "json")...).want(t, ExitOK)
	var pool struct {
		Pool struct {
			CapacityBytes string `json:"capacityBytes"`
			Version       string `json:"version"`
		} `json:"pool"`
	}
	if err := json.Unmarshal([]byte(sc.stdout), &pool); err != nil || pool.Pool.CapacityBytes != "4294967296" || pool.Pool.Version != "1" {
		t.Errorf("set-capacity printed %s (%v)", sc.stdout, err)
	}
	kibo(t, args(c, "storage-pool", "set-capacity", "worker-2", "default", "0", "--expected-version", "0")...).want(t, 10)
	kibo(t, args(c, "storage-pool", "set-capacity", "worker-2", "other", "1024")...).want(t, 5)
	kibo(t, args(c, "storage-pool", "set-capacity", "worker-2", "default", "1.5")...).want(t, ExitUsage)
	kibo(t, args(c, "storage-pool", "set-capacity", "worker-2", "default")...).want(t, ExitUsage)

	// Retire: drained and empty.
	kibo(t, args(c, "node", "drain", "worker-2")...).want(t, ExitOK)
	rt := kibo(t, args(c, "node", "retire", "worker-2")...).want(t, ExitOK)
	if !strings.Contains(rt.stdout, "retired") {
		t.Errorf("retire printed:\n%s", rt.stdout)
	}
	kibo(t, args(c, "node", "cancel-drain", "worker-2")...).want(t, 9)
	l = kibo(t, args(c, "node", "list", "-o", "name")...).want(t, ExitOK)
	if strings.TrimSpace(l.stdout) != "worker-1" {
		t.Errorf("node list without the retired = %q", l.stdout)
	}
	l = kibo(t, args(c, "node", "list", "--include-retired", "-o", "name")...).want(t, ExitOK)
	if strings.TrimSpace(l.stdout) != "worker-1\nworker-2" {
		t.Errorf("node list --include-retired = %q", l.stdout)
	}
}

// TestNodeCommandsNeedCapability: without node.manage kibo exits 14 and
// sends nothing.
func TestNodeCommandsNeedCapability(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	for _, a := range [][]string{
		{"node", "list"}, {"node", "drain", "n1", "--expected-registration-version", "1"}, {"node", "retire", "n1"},
		{"overcommit", "get"}, {"overcommit", "set", "--memory-ratio", "1", "--cpu-ratio", "2"},
		{"storage-pool", "list"}, {"storage-pool", "set-capacity", "n1", "default", "1024"},
	} {
		r := kibo(t, args(f.conn(), a...)...).want(t, ExitUnavailable)
		if !strings.Contains(r.stderr, "node.manage") {
			t.Errorf("kibo %v: stderr %s", a, r.stderr)
		}
	}
	for _, req := range f.requests() {
		if !strings.HasSuffix(req, "GetServerInfo") {
			t.Errorf("sent %s without the capability", req)
		}
	}
}
