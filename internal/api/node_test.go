package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/volume"
)

// nodeSeed is a node written straight into the store, as a node's Hello
// registers it.
type nodeSeed struct {
	id      string
	key     []byte // CertKeyHash; nil: a certificate issued by hand
	ratio   float64
	pool    string
	storage uint64
	// heard is how long ago the node was last heard from (0: an hour ago,
	// not connected to any replica; a node heard within the node grace
	// counts as connected to some replica).
	heard time.Duration
}

func seedNode(t *testing.T, st store.Store, n nodeSeed) {
	t.Helper()
	if n.pool == "" {
		n.pool = "default"
	}
	if n.storage == 0 {
		n.storage = 10 << 30
	}
	doc, err := proto.Marshal(&nodev1.Hello{NodeId: n.id,
		Capacity: &nodev1.Capacity{MemoryMib: 8192, CpuMillis: 4000, StorageBytes: n.storage, StoragePool: n.pool, MemoryOvercommitRatio: n.ratio},
		Templates: []*nodev1.TemplateInfo{{TemplateId: "default", Version: "builtin-1"},
			{TemplateId: "debian", Version: "v3", Digest: "sha256:" + strings.Repeat("a", 64)}},
		Platforms: []*nodev1.TemplateInfo{{TemplateId: "sandbox", Version: "p1", Digest: "sha256:" + strings.Repeat("b", 64)}},
		Features:  []string{"network", "volumes"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n.heard == 0 {
		n.heard = time.Hour
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := st.InTx(t.Context(), func(tx store.Tx) error {
		return tx.UpsertNode(t.Context(), &store.Node{ID: n.id, CreatedAt: now, LastSeen: now.Add(-n.heard), MemoryMiB: 8192,
			CPUMillis: 4000, StorageBytes: n.storage, Doc: doc, CertKeyHash: n.key})
	}); err != nil {
		t.Fatal(err)
	}
}

// keyOf is a distinct certificate key hash for each name.
func keyOf(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

// seedWorkspace places a Workspace (running, 512 MiB, a 1 GiB layer) on
// node.
func seedWorkspace(t *testing.T, st store.Store, id, node string) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	doc, _ := proto.Marshal(&ctrlv1.Workspace{WorkspaceId: id, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE})
	if err := st.InTx(t.Context(), func(tx store.Tx) error {
		return tx.InsertWorkspace(t.Context(), &store.Workspace{ID: id, CreatedAt: now, UpdatedAt: now, Doc: doc,
			Labels: map[string]string{}, State: int32(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE), NodeID: node,
			Power: store.PowerRunning, Generation: 1, MemoryMiB: 512, CPUMillis: 1000, LayerBytes: 1 << 30})
	}); err != nil {
		t.Fatal(err)
	}
}

// seedVolume puts a 64 MiB Volume in node's pool.
func seedVolume(t *testing.T, st store.Store, id, node string) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	pub, _ := proto.Marshal(&ctrlv1.Volume{VolumeId: id, CapacityBytes: 64 << 20, State: ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE})
	spec := fmt.Sprintf(`{"volume":%q,"node":%q,"capacity":%d}`, base64.StdEncoding.EncodeToString(pub), node, 64<<20)
	if err := st.InTx(t.Context(), func(tx store.Tx) error {
		return tx.InsertResource(t.Context(), &store.Resource{Kind: volume.KindVolume, ID: id, CreatedAt: now, UpdatedAt: now,
			Revision: 1, Spec: []byte(spec), LabelsRevision: 1, AnnotationsRevision: 1,
			Labels: map[string]string{}, Annotations: map[string]string{}})
	}); err != nil {
		t.Fatal(err)
	}
}

func getNode(t *testing.T, c ctrlv1connect.NodeServiceClient, id string) *ctrlv1.Node {
	t.Helper()
	res, err := c.GetNode(t.Context(), connect.NewRequest(&ctrlv1.GetNodeRequest{NodeId: id}))
	if err != nil {
		t.Fatalf("GetNode(%s) = %v", id, err)
	}
	return res.Msg.GetNode()
}

// nodeOp is one NodeService write on a node, by name.
func nodeOp(c ctrlv1connect.NodeServiceClient, op, cmdID, node string, version uint64) (*ctrlv1.Node, error) {
	ctx := context.Background()
	switch op {
	case "drain", "drain-stop":
		return nodeOf(c.DrainNode(ctx, connect.NewRequest(&ctrlv1.DrainNodeRequest{CommandId: cmdID, NodeId: node, ExpectedRegistrationVersion: version, StopWorkspaces: op == "drain-stop"})))
	case "cancel":
		return nodeOf(c.CancelNodeDrain(ctx, connect.NewRequest(&ctrlv1.CancelNodeDrainRequest{CommandId: cmdID, NodeId: node, ExpectedRegistrationVersion: version})))
	case "isolate":
		return nodeOf(c.IsolateNode(ctx, connect.NewRequest(&ctrlv1.IsolateNodeRequest{CommandId: cmdID, NodeId: node, ExpectedRegistrationVersion: version})))
	case "retire":
		return nodeOf(c.RetireNode(ctx, connect.NewRequest(&ctrlv1.RetireNodeRequest{CommandId: cmdID, NodeId: node, ExpectedRegistrationVersion: version})))
	case "overcommit":
		return nodeOf(c.SetNodeOvercommit(ctx, connect.NewRequest(&ctrlv1.SetNodeOvercommitRequest{CommandId: cmdID, NodeId: node, ExpectedRegistrationVersion: version,
			Overcommit: &ctrlv1.Overcommit{MemoryRatio: 2, CpuRatio: 8}})))
	}
	panic("unknown op " + op)
}

// nodeOf is the node of a write's answer (nil with an error).
func nodeOf[T any, P interface {
	*T
	GetNode() *ctrlv1.Node
}](r *connect.Response[T], err error) (*ctrlv1.Node, error) {
	if err != nil {
		return nil, err
	}
	return P(r.Msg).GetNode(), nil
}

// TestNodeService runs every rule of NodeService on both stores.
func TestNodeService(t *testing.T) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			testNodeService(t, pg)
		})
	}
}

func testNodeService(t *testing.T, pg bool) {
	e := ctrltest.New(t, ctrltest.Options{Postgres: pg})
	c := ctrlv1connect.NewNodeServiceClient(e.HTTP, e.URL)
	ctx := t.Context()
	seq := 0
	cmd := func() string { seq++; return fmt.Sprintf("node-cmd-%d", seq) }
	fresh := func(t *testing.T) string {
		seq++
		id := fmt.Sprintf("n%03d", seq)
		seedNode(t, e.Store, nodeSeed{id: id, key: keyOf(id)})
		return id
	}

	t.Run("get shows a node without a record", func(t *testing.T) {
		// Heard just now (its Workspace is not judged silent meanwhile).
		seedNode(t, e.Store, nodeSeed{id: "legacy", key: keyOf("l"), ratio: 1.5, heard: time.Millisecond})
		seedWorkspace(t, e.Store, "ws-legacy", "legacy")
		seedVolume(t, e.Store, "vol-legacy", "legacy")
		n := getNode(t, c, "legacy")
		if n.GetRegistrationVersion() != 1 || n.GetState() != ctrlv1.NodeState_NODE_STATE_ACTIVE {
			t.Errorf("node = %v, want registration version 1, ACTIVE", n)
		}
		if n.GetCapacity().GetMemoryMib() != 8192 || n.GetCapacity().GetCpuMillis() != 4000 ||
			n.GetAllocated().GetMemoryMib() != 512 || n.GetAllocated().GetCpuMillis() != 1000 {
			t.Errorf("capacity %v allocated %v", n.GetCapacity(), n.GetAllocated())
		}
		if !n.GetOvercommitInherited() || n.GetOvercommit().GetMemoryRatio() != 1.5 || n.GetOvercommit().GetCpuRatio() != 4 {
			t.Errorf("overcommit = %v inherited %v, want the agent's memory 1.5, default CPU 4", n.GetOvercommit(), n.GetOvercommitInherited())
		}
		if len(n.GetStoragePools()) != 1 {
			t.Fatalf("pools = %v", n.GetStoragePools())
		}
		p := n.GetStoragePools()[0]
		if p.GetPoolId() != "default" || p.GetReportedBytes() != 10<<30 || p.GetCapacityBytes() != 10<<30 ||
			p.GetUsedBytes() != 1<<30+64<<20 || p.GetVersion() != 0 || p.GetOverrideBytes() != 0 {
			t.Errorf("pool = %v", p)
		}
		if n.GetWorkspaces() != 1 || n.GetVolumes() != 1 {
			t.Errorf("workspaces %d volumes %d, want 1 and 1", n.GetWorkspaces(), n.GetVolumes())
		}
		if len(n.GetTemplates()) != 1 || n.GetTemplates()[0].GetArtifactId() != "debian" || n.GetTemplates()[0].GetVersion() != "v3" {
			t.Errorf("templates = %v, want only the published debian v3", n.GetTemplates())
		}
		if len(n.GetPlatforms()) != 1 || n.GetPlatforms()[0].GetArtifactId() != "sandbox" {
			t.Errorf("platforms = %v", n.GetPlatforms())
		}
		// (Connected follows the replica's reload of the node records:
		// heard just now, it turns true within a second; TestConnectedFleetWide.)
		if strings.Join(n.GetFeatures(), ",") != "network,volumes" || n.GetLastSeenAt() == nil {
			t.Errorf("features %v last seen %v", n.GetFeatures(), n.GetLastSeenAt())
		}
	})

	t.Run("bad input", func(t *testing.T) {
		id := fresh(t)
		for _, tc := range []struct {
			name   string
			call   func() error
			code   connect.Code
			reason ctrlv1.FailureReason
			field  string
		}{
			{"get unknown", func() error {
				_, err := c.GetNode(ctx, connect.NewRequest(&ctrlv1.GetNodeRequest{NodeId: "nope"}))
				return err
			}, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, "node_id"},
			{"get empty", func() error {
				_, err := c.GetNode(ctx, connect.NewRequest(&ctrlv1.GetNodeRequest{}))
				return err
			}, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, "node_id"},
			{"get oversized", func() error {
				_, err := c.GetNode(ctx, connect.NewRequest(&ctrlv1.GetNodeRequest{NodeId: strings.Repeat("x", 300)}))
				return err
			}, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, "node_id"},
			{"drain unknown", func() error { _, err := nodeOp(c, "drain", cmd(), "nope", 1); return err },
				connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, "node_id"},
			{"retire unknown", func() error { _, err := nodeOp(c, "retire", cmd(), "nope", 1); return err },
				connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, "node_id"},
			{"overcommit unknown", func() error { _, err := nodeOp(c, "overcommit", cmd(), "nope", 1); return err },
				connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, "node_id"},
			{"command ID malformed", func() error { _, err := nodeOp(c, "drain", "-bad", id, 1); return err },
				connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID, "command_id"},
			{"command ID empty", func() error { _, err := nodeOp(c, "isolate", "", id, 1); return err },
				connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID, "command_id"},
			{"command ID reserved", func() error { _, err := nodeOp(c, "cancel", "expiration/x", id, 1); return err },
				connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_RESERVED_COMMAND_ID, "command_id"},
			{"list page size", func() error {
				_, err := c.ListNodes(ctx, connect.NewRequest(&ctrlv1.ListNodesRequest{PageSize: 1001}))
				return err
			}, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, "page_size"},
			{"list page token", func() error {
				_, err := c.ListNodes(ctx, connect.NewRequest(&ctrlv1.ListNodesRequest{PageToken: "garbage"}))
				return err
			}, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_PAGE_TOKEN_INVALID, "page_token"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				d := wantErr(t, tc.call(), tc.code, tc.reason, tc.code == connect.CodeNotFound && !strings.HasPrefix(tc.name, "get"))
				if d.GetField() != tc.field {
					t.Errorf("field = %q, want %q", d.GetField(), tc.field)
				}
			})
		}
		if n := getNode(t, c, id); n.GetState() != ctrlv1.NodeState_NODE_STATE_ACTIVE {
			t.Errorf("state = %v after refusals, want ACTIVE", n.GetState())
		}
	})

	t.Run("transitions", func(t *testing.T) {
		A, D, I, R := ctrlv1.NodeState_NODE_STATE_ACTIVE, ctrlv1.NodeState_NODE_STATE_DRAINING, ctrlv1.NodeState_NODE_STATE_ISOLATED, ctrlv1.NodeState_NODE_STATE_RETIRED
		// setup brings a fresh node to a state through the API.
		setup := map[ctrlv1.NodeState][]string{A: nil, D: {"drain"}, I: {"isolate"}, R: {"drain", "retire"}}
		for _, tc := range []struct {
			from ctrlv1.NodeState
			op   string
			want ctrlv1.NodeState // UNSPECIFIED: refused with failed_precondition
		}{
			{A, "drain", D}, {D, "drain", D}, {I, "drain", 0}, {R, "drain", 0},
			{A, "cancel", A}, {D, "cancel", A}, {I, "cancel", A}, {R, "cancel", 0},
			{A, "isolate", I}, {D, "isolate", I}, {I, "isolate", I}, {R, "isolate", 0},
			{A, "retire", 0}, {D, "retire", R}, {I, "retire", R}, {R, "retire", 0},
			{A, "overcommit", A}, {D, "overcommit", D}, {I, "overcommit", I}, {R, "overcommit", 0},
		} {
			t.Run(fmt.Sprintf("%s %s", tc.op, tc.from), func(t *testing.T) {
				id := fresh(t)
				for _, op := range setup[tc.from] {
					if _, err := nodeOp(c, op, cmd(), id, 1); err != nil {
						t.Fatalf("setup %s: %v", op, err)
					}
				}
				before := getNode(t, c, id)
				n, err := nodeOp(c, tc.op, cmd(), id, 1)
				if tc.want == 0 {
					d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
					if !strings.Contains(d.GetMessage(), id) {
						t.Errorf("message %q does not name the node", d.GetMessage())
					}
					if after := getNode(t, c, id); !proto.Equal(before, after) {
						t.Errorf("refused %s changed the node:\n%v\n%v", tc.op, before, after)
					}
					return
				}
				if err != nil {
					t.Fatalf("%s = %v", tc.op, err)
				}
				if n.GetState() != tc.want || n.GetRegistrationVersion() != 1 {
					t.Errorf("%s from %s = %v (version %d), want %v, version 1", tc.op, tc.from, n.GetState(), n.GetRegistrationVersion(), tc.want)
				}
				if tc.from == tc.want && !n.GetStateChangedAt().AsTime().Equal(before.GetStateChangedAt().AsTime()) {
					t.Errorf("state_changed_at moved without a change: %v -> %v", before.GetStateChangedAt(), n.GetStateChangedAt())
				}
			})
		}
	})

	t.Run("CAS on the registration version", func(t *testing.T) {
		for _, op := range []string{"drain", "cancel", "isolate", "retire", "overcommit"} {
			t.Run(op, func(t *testing.T) {
				id := fresh(t)
				if op == "retire" || op == "cancel" {
					if _, err := nodeOp(c, "drain", cmd(), id, 1); err != nil {
						t.Fatal(err)
					}
				}
				before := getNode(t, c, id)
				for _, v := range []uint64{0, 2} {
					_, err := nodeOp(c, op, cmd(), id, v)
					d := wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
					if d.GetField() != "expected_registration_version" {
						t.Errorf("field = %q", d.GetField())
					}
				}
				if after := getNode(t, c, id); !proto.Equal(before, after) {
					t.Errorf("aborted %s changed the node", op)
				}
				// A re-enrollment moves the version: the old one aborts.
				if err := e.Store.InTx(ctx, func(tx store.Tx) error {
					if _, err := fleet.Register(ctx, tx, id, keyOf(id), false, time.Now().UTC()); err != nil {
						return err
					}
					_, err := fleet.Register(ctx, tx, id, keyOf("z"+id), true, time.Now().UTC())
					return err
				}); err != nil {
					t.Fatal(err)
				}
				_, err := nodeOp(c, op, cmd(), id, 1)
				wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
				if _, err := nodeOp(c, op, cmd(), id, 2); err != nil {
					t.Errorf("%s at version 2 = %v", op, err)
				}
			})
		}
	})

	t.Run("retire", func(t *testing.T) {
		id := fresh(t)
		key := keyOf(id)
		seedWorkspace(t, e.Store, "ws-"+id, id)
		seedVolume(t, e.Store, "vol-"+id, id)
		if _, err := nodeOp(c, "drain", cmd(), id, 1); err != nil {
			t.Fatal(err)
		}
		_, err := nodeOp(c, "retire", cmd(), id, 1)
		d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
		if !strings.Contains(d.GetMessage(), "1 Workspace") || !strings.Contains(d.GetMessage(), "1 Volume") {
			t.Errorf("message %q does not say how many", d.GetMessage())
		}
		// Gone: the Workspace's deletion completed, the Volume deleted.
		if err := e.Store.InTx(ctx, func(tx store.Tx) error {
			w, err := tx.GetWorkspace(ctx, "ws-"+id)
			if err != nil {
				return err
			}
			w.DeletedAt, w.State, w.Power = time.Now().UTC(), int32(ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED), store.PowerDeleted
			if err := tx.UpdateWorkspace(ctx, w); err != nil {
				return err
			}
			_, err = tx.GetDeniedNodeKey(ctx, key)
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("key denied before the retirement: %v", err)
			}
			return tx.DeleteResource(ctx, volume.KindVolume, "vol-"+id)
		}); err != nil {
			t.Fatal(err)
		}
		n, err := nodeOp(c, "retire", "retire-"+id, id, 1)
		if err != nil || n.GetState() != ctrlv1.NodeState_NODE_STATE_RETIRED {
			t.Fatalf("retire = %v, %v", n, err)
		}
		if err := e.Store.View(ctx, func(tx store.Tx) error {
			k, err := tx.GetDeniedNodeKey(ctx, key)
			if err == nil && k.NodeID != id {
				t.Errorf("denied key names %q", k.NodeID)
			}
			return err
		}); err != nil {
			t.Errorf("the retired node's key is not denied: %v", err)
		}
		// The tombstone refuses every write, reads still show it.
		for _, op := range []string{"drain", "cancel", "isolate", "retire", "overcommit"} {
			_, err := nodeOp(c, op, cmd(), id, 1)
			wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
		}
		_, err = c.SetStoragePoolCapacity(ctx, connect.NewRequest(&ctrlv1.SetStoragePoolCapacityRequest{CommandId: cmd(), NodeId: id, PoolId: "default", CapacityBytes: 1 << 30}))
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
		if getNode(t, c, id).GetState() != ctrlv1.NodeState_NODE_STATE_RETIRED {
			t.Error("GetNode does not show the tombstone")
		}
		// The replay of the retirement is its first answer.
		again, err := nodeOp(c, "retire", "retire-"+id, id, 1)
		if err != nil || again.GetState() != ctrlv1.NodeState_NODE_STATE_RETIRED {
			t.Errorf("replayed retire = %v, %v", again, err)
		}
		// A re-registration of the ID is refused.
		if err := e.Store.InTx(ctx, func(tx store.Tx) error {
			_, err := fleet.Register(ctx, tx, id, keyOf("q"), true, time.Now().UTC())
			return err
		}); err == nil {
			t.Error("a retired node ID registered again")
		}
	})

	t.Run("drain stops workspaces", func(t *testing.T) {
		id := fresh(t)
		seedWorkspace(t, e.Store, "ws-stop-"+id, id)
		n, err := nodeOp(c, "drain", "plain-"+id, id, 1)
		if err != nil || n.GetDrainStopsWorkspaces() {
			t.Fatalf("drain = %v, %v", n, err)
		}
		n, err = nodeOp(c, "drain-stop", "stop-"+id, id, 1)
		if err != nil || !n.GetDrainStopsWorkspaces() || n.GetState() != ctrlv1.NodeState_NODE_STATE_DRAINING {
			t.Fatalf("drain --stop-workspaces = %v, %v", n, err)
		}
		if err := e.Store.View(ctx, func(tx store.Tx) error {
			w, err := tx.GetWorkspace(ctx, "ws-stop-"+id)
			if err != nil {
				return err
			}
			if w.Power != store.PowerStopped {
				t.Errorf("workspace power = %v after the drain, want stopped", w.Power)
			}
			cmd, err := tx.GetCommand(ctx, "stop-"+id+"#stop/ws-stop-"+id)
			if err == nil && cmd.Initiator != int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_NODE_DRAIN) {
				t.Errorf("stop initiator = %d", cmd.Initiator)
			}
			return err
		}); err != nil {
			t.Fatalf("the drain's stop: %v", err)
		}
	})

	t.Run("retire without a known key", func(t *testing.T) {
		seq++
		id := fmt.Sprintf("n%03d", seq)
		seedNode(t, e.Store, nodeSeed{id: id})
		if _, err := nodeOp(c, "isolate", cmd(), id, 1); err != nil {
			t.Fatal(err)
		}
		retireID := cmd()
		n, err := nodeOp(c, "retire", retireID, id, 1)
		if err != nil || n.GetState() != ctrlv1.NodeState_NODE_STATE_RETIRED {
			t.Fatalf("retire = %v, %v", n, err)
		}
		if err := e.Store.View(ctx, func(tx store.Tx) error {
			rec, err := tx.GetCommand(ctx, retireID)
			if err == nil && !strings.Contains(rec.Message, "nothing was denied") {
				t.Errorf("command message = %q, want it to say nothing was denied", rec.Message)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("list", func(t *testing.T) {
		all := map[bool][]string{}
		for _, retired := range []bool{false, true} {
			token := ""
			for {
				res, err := c.ListNodes(ctx, connect.NewRequest(&ctrlv1.ListNodesRequest{PageSize: 3, PageToken: token, IncludeRetired: retired}))
				if err != nil {
					t.Fatal(err)
				}
				for _, n := range res.Msg.GetNodes() {
					if !retired && n.GetState() == ctrlv1.NodeState_NODE_STATE_RETIRED {
						t.Errorf("retired node %s listed without include_retired", n.GetNodeId())
					}
					all[retired] = append(all[retired], n.GetNodeId())
				}
				if token = res.Msg.GetNextPageToken(); token == "" {
					break
				}
				if retired {
					_, err := c.ListNodes(ctx, connect.NewRequest(&ctrlv1.ListNodesRequest{PageToken: token}))
					wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_PAGE_TOKEN_INVALID, false)
				}
			}
		}
		for _, ids := range all {
			for i := 1; i < len(ids); i++ {
				if ids[i-1] >= ids[i] {
					t.Errorf("not in ID order: %v", ids)
				}
			}
		}
		if len(all[true]) <= len(all[false]) || len(all[false]) < 5 {
			t.Errorf("listed %d without and %d with the retired", len(all[false]), len(all[true]))
		}
	})

	t.Run("command ID replay", func(t *testing.T) {
		id := fresh(t)
		first, err := nodeOp(c, "drain", "replay-"+id, id, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nodeOp(c, "cancel", cmd(), id, 1); err != nil {
			t.Fatal(err)
		}
		again, err := nodeOp(c, "drain", "replay-"+id, id, 1)
		if err != nil || !proto.Equal(first, again) {
			t.Errorf("replay = %v, %v; want the first answer %v", again, err, first)
		}
		if got := getNode(t, c, id).GetState(); got != ctrlv1.NodeState_NODE_STATE_ACTIVE {
			t.Errorf("the replay drained the node again: %v", got)
		}
		_, err = nodeOp(c, "drain", "replay-"+id, id, 2)
		wantErr(t, err, connect.CodeAlreadyExists, ctrlv1.FailureReason_FAILURE_REASON_COMMAND_ID_REUSED, false)
		_, err = nodeOp(c, "isolate", "replay-"+id, id, 1)
		wantErr(t, err, connect.CodeAlreadyExists, ctrlv1.FailureReason_FAILURE_REASON_COMMAND_ID_REUSED, false)
		// A recorded refusal replays too, even once it would succeed.
		_, err = nodeOp(c, "isolate", "refused-"+id, id, 7)
		wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
		_, err = nodeOp(c, "isolate", "refused-"+id, id, 7)
		wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
	})

	t.Run("node overcommit", func(t *testing.T) {
		id := fresh(t)
		set := func(cmdID string, o *ctrlv1.Overcommit) (*ctrlv1.Node, error) {
			return nodeOf(c.SetNodeOvercommit(ctx, connect.NewRequest(&ctrlv1.SetNodeOvercommitRequest{CommandId: cmdID, NodeId: id, ExpectedRegistrationVersion: 1, Overcommit: o})))
		}
		for _, tc := range []struct {
			name  string
			o     *ctrlv1.Overcommit
			field string
		}{
			{"memory below 1", &ctrlv1.Overcommit{MemoryRatio: 0.5, CpuRatio: 2}, "overcommit.memory_ratio"},
			{"memory zero", &ctrlv1.Overcommit{CpuRatio: 2}, "overcommit.memory_ratio"},
			{"memory absurd", &ctrlv1.Overcommit{MemoryRatio: 4.5, CpuRatio: 2}, "overcommit.memory_ratio"},
			{"memory NaN", &ctrlv1.Overcommit{MemoryRatio: math.NaN(), CpuRatio: 2}, "overcommit.memory_ratio"},
			{"memory Inf", &ctrlv1.Overcommit{MemoryRatio: math.Inf(1), CpuRatio: 2}, "overcommit.memory_ratio"},
			{"cpu below 1", &ctrlv1.Overcommit{MemoryRatio: 1, CpuRatio: 0.99}, "overcommit.cpu_ratio"},
			{"cpu absurd", &ctrlv1.Overcommit{MemoryRatio: 1, CpuRatio: 65}, "overcommit.cpu_ratio"},
			{"cpu NaN", &ctrlv1.Overcommit{MemoryRatio: 1, CpuRatio: math.NaN()}, "overcommit.cpu_ratio"},
			{"cpu -Inf", &ctrlv1.Overcommit{MemoryRatio: 1, CpuRatio: math.Inf(-1)}, "overcommit.cpu_ratio"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := set(cmd(), tc.o)
				d := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
				if d.GetField() != tc.field {
					t.Errorf("field = %q, want %q", d.GetField(), tc.field)
				}
			})
		}
		n, err := set(cmd(), &ctrlv1.Overcommit{MemoryRatio: 4, CpuRatio: 64})
		if err != nil || n.GetOvercommitInherited() || n.GetOvercommit().GetMemoryRatio() != 4 || n.GetOvercommit().GetCpuRatio() != 64 {
			t.Fatalf("set = %v, %v", n, err)
		}
		n, err = set(cmd(), nil)
		if err != nil || !n.GetOvercommitInherited() || n.GetOvercommit().GetMemoryRatio() != 1 || n.GetOvercommit().GetCpuRatio() != 4 {
			t.Errorf("inherit = %v, %v; want the defaults", n, err)
		}
	})

	t.Run("overcommit defaults", func(t *testing.T) {
		get := func() *ctrlv1.OvercommitDefaults {
			r, err := c.GetOvercommitDefaults(ctx, connect.NewRequest(&ctrlv1.GetOvercommitDefaultsRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			return r.Msg.GetDefaults()
		}
		set := func(cmdID string, o *ctrlv1.Overcommit, v uint64) (*ctrlv1.OvercommitDefaults, error) {
			r, err := c.SetOvercommitDefaults(ctx, connect.NewRequest(&ctrlv1.SetOvercommitDefaultsRequest{CommandId: cmdID, Overcommit: o, ExpectedVersion: v}))
			if err != nil {
				return nil, err
			}
			return r.Msg.GetDefaults(), nil
		}
		d := get()
		if d.GetVersion() != 0 || d.GetOvercommit().GetMemoryRatio() != 1 || d.GetOvercommit().GetCpuRatio() != 4 || d.GetUpdatedAt() != nil {
			t.Fatalf("built-in defaults = %v", d)
		}
		_, err := set(cmd(), nil, 0)
		if fe := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false); fe.GetField() != "overcommit" {
			t.Errorf("field = %q", fe.GetField())
		}
		_, err = set(cmd(), &ctrlv1.Overcommit{MemoryRatio: 5, CpuRatio: 4}, 0)
		wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
		_, err = set(cmd(), &ctrlv1.Overcommit{MemoryRatio: 2, CpuRatio: 8}, 1)
		if fe := wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true); fe.GetField() != "expected_version" {
			t.Errorf("field = %q", fe.GetField())
		}
		if got := get(); got.GetVersion() != 0 {
			t.Errorf("an aborted set changed the defaults: %v", got)
		}
		d, err = set("defaults-1", &ctrlv1.Overcommit{MemoryRatio: 2, CpuRatio: 8}, 0)
		if err != nil || d.GetVersion() != 1 || d.GetOvercommit().GetMemoryRatio() != 2 || d.GetUpdatedAt() == nil {
			t.Fatalf("set = %v, %v", d, err)
		}
		if again, err := set("defaults-1", &ctrlv1.Overcommit{MemoryRatio: 2, CpuRatio: 8}, 0); err != nil || !proto.Equal(again, d) {
			t.Errorf("replay = %v, %v", again, err)
		}
		if same, err := set(cmd(), &ctrlv1.Overcommit{MemoryRatio: 2, CpuRatio: 8}, 1); err != nil || same.GetVersion() != 1 {
			t.Errorf("same ratios = %v, %v; want version 1 kept", same, err)
		}
		_, err = set(cmd(), &ctrlv1.Overcommit{MemoryRatio: 1, CpuRatio: 8}, 0)
		wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
		if d, err = set(cmd(), &ctrlv1.Overcommit{MemoryRatio: 1, CpuRatio: 16}, 1); err != nil || d.GetVersion() != 2 {
			t.Errorf("second set = %v, %v", d, err)
		}
		// A node that inherits shows the new defaults.
		id := fresh(t)
		if n := getNode(t, c, id); n.GetOvercommit().GetCpuRatio() != 16 || !n.GetOvercommitInherited() {
			t.Errorf("inherited overcommit = %v", n.GetOvercommit())
		}
	})

	t.Run("storage pool capacity", func(t *testing.T) {
		id := fresh(t)
		set := func(cmdID, node, pool string, b, v uint64) (*ctrlv1.StoragePool, error) {
			r, err := c.SetStoragePoolCapacity(ctx, connect.NewRequest(&ctrlv1.SetStoragePoolCapacityRequest{CommandId: cmdID, NodeId: node, PoolId: pool, CapacityBytes: b, ExpectedVersion: v}))
			if err != nil {
				return nil, err
			}
			return r.Msg.GetPool(), nil
		}
		for _, tc := range []struct {
			name       string
			node, pool string
			bytes, ver uint64
			code       connect.Code
			reason     ctrlv1.FailureReason
			field      string
		}{
			{"unknown node", "nope", "default", 1 << 30, 0, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, "node_id"},
			{"unknown pool", id, "other", 1 << 30, 0, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, "pool_id"},
			{"no pool", id, "", 1 << 30, 0, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, "pool_id"},
			{"not MiB", id, "default", 1<<30 + 1, 0, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, "capacity_bytes"},
			{"half a MiB", id, "default", 512 << 10, 0, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, "capacity_bytes"},
			{"version ahead", id, "default", 1 << 30, 1, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, "expected_version"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := set(cmd(), tc.node, tc.pool, tc.bytes, tc.ver)
				settled := tc.code != connect.CodeInvalidArgument
				if d := wantErr(t, err, tc.code, tc.reason, settled); d.GetField() != tc.field {
					t.Errorf("field = %q, want %q", d.GetField(), tc.field)
				}
			})
		}
		if p := getNode(t, c, id).GetStoragePools()[0]; p.GetVersion() != 0 || p.GetOverrideBytes() != 0 {
			t.Fatalf("refusals changed the pool: %v", p)
		}
		p, err := set(cmd(), id, "default", 1<<30, 0)
		if err != nil || p.GetVersion() != 1 || p.GetOverrideBytes() != 1<<30 || p.GetCapacityBytes() != 1<<30 || p.GetReportedBytes() != 10<<30 {
			t.Fatalf("set = %v, %v", p, err)
		}
		// An override above what the node reports accounts the reported size.
		if p, err = set(cmd(), id, "default", 20<<30, 1); err != nil || p.GetVersion() != 2 || p.GetCapacityBytes() != 10<<30 {
			t.Errorf("larger override = %v, %v", p, err)
		}
		if p, err = set(cmd(), id, "default", 20<<30, 2); err != nil || p.GetVersion() != 2 {
			t.Errorf("same capacity = %v, %v; want version 2 kept", p, err)
		}
		_, err = set(cmd(), id, "default", 0, 1)
		wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
		if p, err = set(cmd(), id, "default", 0, 2); err != nil || p.GetVersion() != 3 || p.GetOverrideBytes() != 0 || p.GetCapacityBytes() != 10<<30 {
			t.Errorf("clear = %v, %v", p, err)
		}
		if got := getNode(t, c, id).GetStoragePools()[0]; got.GetVersion() != 3 {
			t.Errorf("GetNode pool = %v", got)
		}
	})
}

// TestNodeServiceLiveNodes drives NodeService against real node agents:
// a drain with stop_workspaces stops the node's Workspace through the
// reconciler, new Workspaces go to the other node, and a retirement ends
// the retired node's stream (its key is denied).
func TestNodeServiceLiveNodes(t *testing.T) {
	t.Parallel()
	rt := agenttest.New()
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt})
	c := e.Clients(e.HTTP)
	nc := ctrlv1connect.NewNodeServiceClient(e.HTTP, e.URL)
	ctx := t.Context()
	w, _ := createWS(t, c, "live-create")
	waitCommand(t, c, "live-create")
	if n := getNode(t, nc, "node-1"); !n.GetConnected() || n.GetWorkspaces() != 1 || n.GetAllocated().GetMemoryMib() != 256 {
		t.Fatalf("node-1 = %v", n)
	}
	e.StartNode(t, "node-2", ctrltest.Options{Runtime: rt})
	deadline := time.Now().Add(20 * time.Second)
	connected := func(id string) bool {
		r, err := nc.GetNode(ctx, connect.NewRequest(&ctrlv1.GetNodeRequest{NodeId: id}))
		return err == nil && r.Msg.GetNode().GetConnected()
	}
	for !connected("node-2") {
		if time.Now().After(deadline) {
			t.Fatal("node-2 never connected")
		}
		time.Sleep(50 * time.Millisecond)
	}
	version := getNode(t, nc, "node-1").GetRegistrationVersion()
	if _, err := nodeOp(nc, "drain-stop", "live-drain", "node-1", version); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	// A start on the node draining with stop_workspaces is refused.
	_, err := c.Workspace.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("live-start"),
		WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
	w2, _ := createWS(t, c, "live-create-2")
	waitCommand(t, c, "live-create-2")
	got, err := c.Workspace.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: w2.GetWorkspaceId()}))
	if err != nil || got.Msg.GetWorkspace().GetPlacement().GetNodeId() != "node-2" {
		t.Fatalf("a Workspace created during the drain went to %v (%v), want node-2", got.Msg.GetWorkspace().GetPlacement(), err)
	}
	// Retire node-1 once its Workspace is deleted.
	_, err = nodeOp(nc, "retire", "live-retire-0", "node-1", version)
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
	if _, err := c.Workspace.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("live-delete"),
		WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1})); err != nil {
		t.Fatal(err)
	}
	waitCommand(t, c, "live-delete")
	if _, err := nodeOp(nc, "retire", "live-retire", "node-1", version); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for connected("node-1") {
		if time.Now().After(deadline) {
			t.Fatal("the retired node-1 is still connected")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := getNode(t, nc, "node-2"); !n.GetConnected() || n.GetState() != ctrlv1.NodeState_NODE_STATE_ACTIVE {
		t.Errorf("node-2 = %v", n)
	}
}
