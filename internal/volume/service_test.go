package volume_test

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/volume"
)

// TestMethodNames pins the procedures recorded in fingerprints to the
// generated handler's.
func TestMethodNames(t *testing.T) {
	for _, p := range []string{ctrlv1connect.VolumeServiceCreateVolumeProcedure, ctrlv1connect.VolumeServiceResizeVolumeProcedure,
		ctrlv1connect.VolumeServiceDeleteVolumeProcedure, ctrlv1connect.VolumeServiceUpdateVolumeLabelsProcedure,
		ctrlv1connect.VolumeServiceUpdateVolumeAnnotationsProcedure} {
		if !strings.HasPrefix(p, "/kibotos.ctrl.v1.VolumeService/") {
			t.Errorf("procedure %s", p)
		}
	}
	if got := volume.Topic("vol-x"); got != "volume/vol-x" {
		t.Errorf("Topic = %q", got)
	}
}

// TestCreate: a create completes inside the request (the node made the
// image): AVAILABLE at its capacity on the node and pool chosen, revisions
// 1, its command COMPLETED; the same ID and input replays it, other input
// is already_exists.
func TestCreate(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 10*gib)
		e.addNode(t, "node-b", "pool-b", 20*gib)
		res, err := e.svc.Create(t.Context(), &ctrlv1.CreateVolumeRequest{Metadata: md("c1"), CapacityBytes: 64 * mib,
			Labels: map[string]string{"team": "a"}, Annotations: map[string]string{"note": "x"}})
		if err != nil {
			t.Fatal(err)
		}
		v, c := res.GetVolume(), res.GetCommand()
		if v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.GetCapacityBytes() != 64*mib ||
			!strings.HasPrefix(v.GetVolumeId(), "vol-") || v.GetLabelsRevision() != 1 || v.GetAnnotationsRevision() != 1 ||
			v.GetLabels()["team"] != "a" || v.GetAnnotations()["note"] != "x" || v.GetCreatedAt() == nil || v.GetBoundWorkspaceId() != "" {
			t.Fatalf("created %v", v)
		}
		// The server chose the node with the most room.
		if p := v.GetPlacement(); p.GetNodeId() != "node-b" || p.GetStoragePool() != "pool-b" {
			t.Errorf("placement %v, want node-b/pool-b", p)
		}
		if c.GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_COMPLETED || c.GetKind() != ctrlv1.VolumeCommandKind_VOLUME_COMMAND_KIND_CREATE ||
			c.GetVolumeId() != v.GetVolumeId() || c.GetCompletedAt() == nil || c.GetError() != nil {
			t.Errorf("command %v", c)
		}
		if diff := cmp.Diff(v, e.get(t, v.GetVolumeId()), protocmp.Transform()); diff != "" {
			t.Errorf("GetVolume differs from CreateVolume (-create +get):\n%s", diff)
		}
		got, err := e.svc.GetCommand(t.Context(), "c1")
		if err != nil || got.GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_COMPLETED {
			t.Errorf("GetVolumeCommand(c1) = %v, %v", got, err)
		}
		again, err := e.svc.Create(t.Context(), &ctrlv1.CreateVolumeRequest{Metadata: md("c1"), CapacityBytes: 64 * mib,
			Labels: map[string]string{"team": "a"}, Annotations: map[string]string{"note": "x"}})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(res, again, protocmp.Transform()); diff != "" {
			t.Errorf("replay differs (-first +replay):\n%s", diff)
		}
		_, err = e.create(t, "c1", 128*mib, nil)
		wantFault(t, "CreateVolume(c1, other input)", err, fault.KindAlreadyExists, fault.ReasonCommandIDReused)
		// The caller's placement.
		v2 := e.mustCreate(t, "c2", 16*mib, &ctrlv1.Placement{NodeId: "node-a", StoragePool: "pool-a"})
		if v2.GetPlacement().GetNodeId() != "node-a" || v2.GetPlacement().GetStoragePool() != "pool-a" {
			t.Errorf("placement %v, want node-a/pool-a", v2.GetPlacement())
		}
		// A pool named without a node: a node with that pool.
		v3 := e.mustCreate(t, "c3", 16*mib, &ctrlv1.Placement{StoragePool: "pool-a"})
		if v3.GetPlacement().GetNodeId() != "node-a" {
			t.Errorf("placement by pool %v, want node-a", v3.GetPlacement())
		}
	})
}

// TestCreateRefusals: bad capacities, labels, placements and full pools
// are refused with the documented code, and nothing is created.
func TestCreateRefusals(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 1*gib)
		e.addNode(t, "node-old", "pool-o", 10*gib, "network") // serves no Volumes
		for i, tc := range []struct {
			capacity uint64
			pl       *ctrlv1.Placement
			labels   map[string]string
			kind     fault.Kind
			reason   fault.Reason
			field    string
		}{
			{capacity: 0, kind: fault.KindInvalidArgument, field: "capacity_bytes"},
			{capacity: 64*mib + 1, kind: fault.KindInvalidArgument, field: "capacity_bytes"},
			{capacity: 8 * mib, kind: fault.KindInvalidArgument, field: "capacity_bytes"},
			{capacity: volume.MaxCapacityBytes + mib, kind: fault.KindInvalidArgument, field: "capacity_bytes"},
			{capacity: 64 * mib, labels: map[string]string{"kibotos.io/x": "y"}, kind: fault.KindInvalidArgument, field: `labels["kibotos.io/x"]`},
			{capacity: 64 * mib, pl: &ctrlv1.Placement{NodeId: "node-zz"}, kind: fault.KindInvalidArgument, field: "placement.node_id"},
			{capacity: 64 * mib, pl: &ctrlv1.Placement{NodeId: "node-a", StoragePool: "pool-o"}, kind: fault.KindInvalidArgument, field: "placement.storage_pool"},
			{capacity: 64 * mib, pl: &ctrlv1.Placement{StoragePool: "pool-zz"}, kind: fault.KindInvalidArgument, field: "placement.storage_pool"},
			{capacity: 64 * mib, pl: &ctrlv1.Placement{NodeId: "node-old"}, kind: fault.KindFailedPrecondition, reason: fault.ReasonStateConflict, field: "placement.node_id"},
			{capacity: 2 * gib, pl: &ctrlv1.Placement{NodeId: "node-a"}, kind: fault.KindResourceExhausted, reason: fault.ReasonCapacityExhausted},
			{capacity: 2 * gib, kind: fault.KindResourceExhausted, reason: fault.ReasonCapacityExhausted},
		} {
			_, err := e.svc.Create(t.Context(), &ctrlv1.CreateVolumeRequest{Metadata: md(fmt.Sprintf("bad-%d", i)), CapacityBytes: tc.capacity,
				Placement: tc.pl, Labels: tc.labels})
			fe := wantFault(t, fmt.Sprintf("CreateVolume #%d", i), err, tc.kind, tc.reason)
			if fe.Field != tc.field {
				t.Errorf("CreateVolume #%d: field %q, want %q", i, fe.Field, tc.field)
			}
		}
		list, err := e.svc.List(t.Context(), &ctrlv1.ListVolumesRequest{IncludeDeleted: true})
		if err != nil || len(list.GetVolumes()) != 0 {
			t.Errorf("volumes after refusals: %v, %v", list, err)
		}
		// No connected node serving Volumes: retryable, nothing recorded,
		// the same ID works once one is.
		e.mu.Lock()
		e.connected = nil
		e.mu.Unlock()
		_, err = e.create(t, "later", 64*mib, nil)
		if fe := wantFault(t, "CreateVolume without nodes", err, fault.KindUnavailable, fault.ReasonNodeUnreachable); !fe.Retryable || fe.Settled {
			t.Errorf("without nodes: %+v, want retryable and not settled", fe)
		}
		e.mu.Lock()
		e.connected = []string{"node-a"}
		e.mu.Unlock()
		e.mustCreate(t, "later", 64*mib, nil)
	})
}

// TestPoolAccounting: a pool holds what its Workspaces' writable layers and
// its Volumes promise; a Volume beyond what is left is resource_exhausted.
func TestPoolAccounting(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 1*gib)
		free := func() uint64 {
			t.Helper()
			var f uint64
			var known bool
			if err := e.st.View(t.Context(), func(tx store.Tx) error {
				var err error
				f, known, err = volume.PoolFree(t.Context(), tx, "node-a")
				return err
			}); err != nil || !known {
				t.Fatalf("PoolFree = %d, %v, %v", f, known, err)
			}
			return f
		}
		if f := free(); f != 1*gib {
			t.Fatalf("free of an empty pool = %d", f)
		}
		// A Workspace on the node, its layer 512 MiB; one deleted counts nothing.
		seedWorkspace(t, e.st, "ws-1", "node-a", 512*mib, false)
		seedWorkspace(t, e.st, "ws-2", "node-a", 256*mib, true)
		if f := free(); f != 512*mib {
			t.Fatalf("free with a 512 MiB layer = %d MiB", f/mib)
		}
		e.mustCreate(t, "v1", 256*mib, &ctrlv1.Placement{NodeId: "node-a"})
		if f := free(); f != 256*mib {
			t.Fatalf("free with a 256 MiB volume = %d MiB", f/mib)
		}
		_, err := e.create(t, "v2", 257*mib, &ctrlv1.Placement{NodeId: "node-a"})
		wantFault(t, "CreateVolume beyond the pool", err, fault.KindResourceExhausted, fault.ReasonCapacityExhausted)
		e.mustCreate(t, "v3", 256*mib, &ctrlv1.Placement{NodeId: "node-a"})
		if f := free(); f != 0 {
			t.Fatalf("free of a full pool = %d", f)
		}
		var known bool
		_ = e.st.View(t.Context(), func(tx store.Tx) error {
			_, known, _ = volume.PoolFree(t.Context(), tx, "node-unknown")
			return nil
		})
		if known {
			t.Error("PoolFree of an unknown node is known")
		}
	})
}

// TestCreateTimesOut: a node that does not answer within the bound makes
// the create a retryable unavailable TIMED_OUT; the command goes on
// (GetVolumeCommand), completes when the node answers, and the same ID
// then answers the Volume.
func TestCreateTimesOut(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 10*gib)
		e.setOnline("node-a", false)
		_, err := e.create(t, "slow", 64*mib, nil)
		if fe := wantFault(t, "CreateVolume to an offline node", err, fault.KindUnavailable, fault.ReasonTimedOut); !fe.Retryable || fe.Settled {
			t.Errorf("timeout %+v, want retryable, not settled", fe)
		}
		c, err := e.svc.GetCommand(t.Context(), "slow")
		if err != nil || c.GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_PROCESSING {
			t.Fatalf("GetVolumeCommand = %v, %v, want PROCESSING", c, err)
		}
		if v := e.get(t, c.GetVolumeId()); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_CREATING {
			t.Errorf("volume while the node is away: %v", v.GetState())
		}
		e.setOnline("node-a", true)
		v := e.mustCreate(t, "slow", 64*mib, nil)
		if v.GetVolumeId() != c.GetVolumeId() {
			t.Errorf("resend created %s, first %s", v.GetVolumeId(), c.GetVolumeId())
		}
		if c, _ := e.svc.GetCommand(t.Context(), "slow"); c.GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_COMPLETED {
			t.Errorf("command after the node answered: %v", c)
		}
	})
}

// TestNodeFailures: a node's failure completes the command with its
// message (cut to the bound): a failed create leaves the Volume DELETED, a
// failed resize keeps its capacity, a failed delete leaves it AVAILABLE.
func TestNodeFailures(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 10*gib)
		long := strings.Repeat("é", 3000)
		fail := func(permanent bool) func(string, *nodev1.DesiredVolume) *nodev1.VolumeReport {
			return func(_ string, d *nodev1.DesiredVolume) *nodev1.VolumeReport {
				return &nodev1.VolumeReport{VolumeId: d.GetVolumeId(), Generation: d.GetGeneration(), Exists: true, CapacityBytes: 64 * mib,
					FailureMessage: long, Permanent: permanent}
			}
		}
		e.setAnswer(fail(false))
		_, err := e.create(t, "f1", 64*mib, nil)
		fe := wantFault(t, "failed create", err, fault.KindUnavailable, fault.ReasonExecutionFailed)
		if !fe.Settled || !fe.Retryable || len(fe.Message) > nodewire.MaxFailureMessageBytes+100 || fe.ObservedVolume == nil {
			t.Errorf("failed create: settled %v retryable %v message %d bytes observed %v", fe.Settled, fe.Retryable, len(fe.Message), fe.ObservedVolume)
		}
		c, _ := e.svc.GetCommand(t.Context(), "f1")
		if v := e.get(t, c.GetVolumeId()); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETED || v.GetDeletedAt() == nil {
			t.Errorf("volume after a failed create: %v", v)
		}
		e.setAnswer(fail(true))
		_, err = e.create(t, "f2", 64*mib, nil)
		wantFault(t, "failed create, permanent", err, fault.KindResourceExhausted, fault.ReasonCapacityExhausted)

		e.setAnswer(nil)
		v := e.mustCreate(t, "ok", 64*mib, nil)
		e.setAnswer(fail(false))
		_, err = e.svc.Resize(t.Context(), &ctrlv1.ResizeVolumeRequest{Metadata: md("r1"), VolumeId: v.GetVolumeId(), CapacityBytes: 128 * mib})
		wantFault(t, "failed resize", err, fault.KindUnavailable, fault.ReasonExecutionFailed)
		if got := e.get(t, v.GetVolumeId()); got.GetCapacityBytes() != 64*mib || got.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
			t.Errorf("volume after a failed resize: %v", got)
		}
		_, err = e.svc.Delete(t.Context(), &ctrlv1.DeleteVolumeRequest{Metadata: md("d1"), VolumeId: v.GetVolumeId()})
		wantFault(t, "failed delete", err, fault.KindUnavailable, fault.ReasonExecutionFailed)
		if got := e.get(t, v.GetVolumeId()); got.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
			t.Errorf("volume after a failed delete: %v", got)
		}
		// The pool is free again for what the failed ones asked.
		e.setAnswer(nil)
		e.mustCreate(t, "after", 64*mib, nil)
	})
}

// TestReportsAreHostile: a report about a Volume of another node, of a
// stale or future generation, or of an unknown Volume changes nothing.
func TestReportsAreHostile(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 10*gib)
		e.addNode(t, "node-b", "pool-b", 1*gib)
		e.setOnline("node-a", false)
		_, err := e.create(t, "h1", 64*mib, &ctrlv1.Placement{NodeId: "node-a"})
		wantFault(t, "create on an offline node", err, fault.KindUnavailable, fault.ReasonTimedOut)
		c, _ := e.svc.GetCommand(t.Context(), "h1")
		id := c.GetVolumeId()
		for name, tc := range map[string]struct {
			node string
			rep  *nodev1.VolumeReport
		}{
			"another node":      {"node-b", &nodev1.VolumeReport{VolumeId: id, Generation: 1, Exists: true, CapacityBytes: 64 * mib}},
			"generation 0":      {"node-a", &nodev1.VolumeReport{VolumeId: id, Generation: 0, Exists: true, CapacityBytes: 64 * mib}},
			"future generation": {"node-a", &nodev1.VolumeReport{VolumeId: id, Generation: 7, Exists: true, CapacityBytes: 64 * mib}},
			"unknown volume":    {"node-a", &nodev1.VolumeReport{VolumeId: "vol-nope", Generation: 1, Exists: true}},
			"huge id":           {"node-a", &nodev1.VolumeReport{VolumeId: strings.Repeat("v", 5000), Generation: 1}},
		} {
			if v, done := e.report(t.Context(), tc.node, tc.rep); v != nil || done {
				t.Errorf("%s: report changed %v (done %v)", name, v, done)
			}
		}
		if v := e.get(t, id); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_CREATING {
			t.Errorf("volume after hostile reports: %v", v.GetState())
		}
		// The right one completes it, once.
		if _, done := e.report(t.Context(), "node-a", &nodev1.VolumeReport{VolumeId: id, Generation: 1, Exists: true, CapacityBytes: 64 * mib}); !done {
			t.Error("the node's report did not complete the create")
		}
		if v, done := e.report(t.Context(), "node-a", &nodev1.VolumeReport{VolumeId: id, Generation: 1, Exists: false}); v != nil || done {
			t.Error("a second report of the same generation changed the volume")
		}
		if v := e.get(t, id); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
			t.Errorf("volume after its report: %v", v.GetState())
		}
	})
}

// TestResize: absolute, upward, whole MiB; equal is a plain success with
// no command; smaller is invalid_argument; beyond the pool is
// resource_exhausted; the capacity changes once the node confirms; only
// AVAILABLE Volumes resize.
func TestResize(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 1*gib)
		v := e.mustCreate(t, "v", 256*mib, nil)
		id := v.GetVolumeId()
		resize := func(cid string, b uint64) (*ctrlv1.ResizeVolumeResponse, error) {
			return e.svc.Resize(t.Context(), &ctrlv1.ResizeVolumeRequest{Metadata: md(cid), VolumeId: id, CapacityBytes: b})
		}
		res, err := resize("same", 256*mib)
		if err != nil || res.GetCommand() != nil || res.GetVolume().GetCapacityBytes() != 256*mib {
			t.Fatalf("equal resize = %v, %v; want the volume and no command", res, err)
		}
		if _, err := e.svc.GetCommand(t.Context(), "same"); fault.KindOf(err) != fault.KindNotFound {
			t.Errorf("GetVolumeCommand of an equal resize = %v, want not_found", err)
		}
		_, err = resize("smaller", 128*mib)
		wantFault(t, "smaller resize", err, fault.KindInvalidArgument, "")
		_, err = resize("odd", 300*mib+1)
		wantFault(t, "resize not whole MiB", err, fault.KindInvalidArgument, "")
		_, err = resize("huge", 1*gib+mib)
		wantFault(t, "resize beyond the pool", err, fault.KindResourceExhausted, fault.ReasonCapacityExhausted)
		res, err = resize("grow", 1*gib) // the pool holds exactly this
		if err != nil {
			t.Fatal(err)
		}
		if res.GetVolume().GetCapacityBytes() != 1*gib || res.GetCommand().GetKind() != ctrlv1.VolumeCommandKind_VOLUME_COMMAND_KIND_RESIZE ||
			res.GetCommand().GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_COMPLETED {
			t.Fatalf("resize = %v", res)
		}
		// While the node is away the capacity stays until it confirms.
		e.setOnline("node-a", false)
		_, err = resize("grow-more", 2*gib)
		wantFault(t, "resize beyond the pool (full)", err, fault.KindResourceExhausted, fault.ReasonCapacityExhausted)
		_, err = e.svc.Delete(t.Context(), &ctrlv1.DeleteVolumeRequest{Metadata: md("del"), VolumeId: id})
		wantFault(t, "delete while away", err, fault.KindUnavailable, fault.ReasonTimedOut)
		_, err = resize("while-deleting", 2*gib)
		fe := wantFault(t, "resize of a DELETING volume", err, fault.KindFailedPrecondition, fault.ReasonStateConflict)
		if fe.ObservedVolume.GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETING {
			t.Errorf("observed_volume %v", fe.ObservedVolume)
		}
	})
}

// TestDelete: refused while bound (failed_precondition with
// observed_volume); otherwise the Volume is DELETED once the node removed
// it; a deleted Volume refuses another delete; a delete supersedes a
// create still waiting for the node.
func TestDelete(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 10*gib)
		v := e.mustCreate(t, "v", 64*mib, nil)
		id := v.GetVolumeId()
		bind(t, e.st, id, "ws-1")
		del := func(cid string) (*ctrlv1.DeleteVolumeResponse, error) {
			return e.svc.Delete(t.Context(), &ctrlv1.DeleteVolumeRequest{Metadata: md(cid), VolumeId: id})
		}
		_, err := del("bound")
		fe := wantFault(t, "delete while bound", err, fault.KindFailedPrecondition, fault.ReasonConflict)
		if fe.ObservedVolume.GetBoundWorkspaceId() != "ws-1" || !fe.Settled {
			t.Errorf("refusal %+v", fe)
		}
		unbind(t, e.st, id, "ws-1")
		res, err := del("d1")
		if err != nil {
			t.Fatal(err)
		}
		if res.GetVolume().GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETED || res.GetVolume().GetDeletedAt() == nil ||
			res.GetCommand().GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_COMPLETED {
			t.Fatalf("delete = %v", res)
		}
		if got := e.get(t, id); got.GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
			t.Errorf("GetVolume after delete: %v", got)
		}
		_, err = del("d2")
		wantFault(t, "delete of a deleted volume", err, fault.KindFailedPrecondition, fault.ReasonStateConflict)
		again, err := del("d1")
		if err != nil || again.GetVolume().GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
			t.Errorf("replay of d1 = %v, %v", again, err)
		}
		// A create waiting for the node is superseded by a delete.
		e.setOnline("node-a", false)
		_, err = e.create(t, "pending", 64*mib, nil)
		wantFault(t, "create while away", err, fault.KindUnavailable, fault.ReasonTimedOut)
		c, _ := e.svc.GetCommand(t.Context(), "pending")
		_, err = e.svc.Delete(t.Context(), &ctrlv1.DeleteVolumeRequest{Metadata: md("d3"), VolumeId: c.GetVolumeId()})
		wantFault(t, "delete while away", err, fault.KindUnavailable, fault.ReasonTimedOut)
		c, _ = e.svc.GetCommand(t.Context(), "pending")
		if c.GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_COMPLETED || c.GetError().GetDetail().GetStage() != "superseded" {
			t.Errorf("superseded create: %v", c)
		}
		e.setOnline("node-a", true)
		res, err = e.svc.Delete(t.Context(), &ctrlv1.DeleteVolumeRequest{Metadata: md("d3"), VolumeId: c.GetVolumeId()})
		if err != nil || res.GetVolume().GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
			t.Errorf("resent delete = %v, %v", res, err)
		}
	})
}

// TestList: creation order, pages that neither skip nor repeat, deleted
// Volumes only with include_deleted, label selectors, tokens bound to the
// filters, page size bounds.
func TestList(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 100*gib)
		var all, live []string
		for i := range 7 {
			res, err := e.svc.Create(t.Context(), &ctrlv1.CreateVolumeRequest{Metadata: md(fmt.Sprintf("l%d", i)), CapacityBytes: 16 * mib,
				Labels: map[string]string{"parity": map[bool]string{true: "even", false: "odd"}[i%2 == 0]}})
			if err != nil {
				t.Fatal(err)
			}
			id := res.GetVolume().GetVolumeId()
			all = append(all, id)
			if i%3 == 1 {
				if _, err := e.svc.Delete(t.Context(), &ctrlv1.DeleteVolumeRequest{Metadata: md(fmt.Sprintf("ld%d", i)), VolumeId: id}); err != nil {
					t.Fatal(err)
				}
				continue
			}
			live = append(live, id)
			time.Sleep(time.Millisecond) // distinct creation times, though ties are ordered by ID
		}
		page := func(req *ctrlv1.ListVolumesRequest) []string {
			t.Helper()
			var ids []string
			for {
				res, err := e.svc.List(t.Context(), req)
				if err != nil {
					t.Fatal(err)
				}
				for _, v := range res.GetVolumes() {
					ids = append(ids, v.GetVolumeId())
				}
				if res.GetNextPageToken() == "" {
					return ids
				}
				req.PageToken = res.GetNextPageToken()
			}
		}
		if got := page(&ctrlv1.ListVolumesRequest{PageSize: 2}); !equal(got, live) {
			t.Errorf("live pages = %v, want %v", got, live)
		}
		if got := page(&ctrlv1.ListVolumesRequest{PageSize: 2, IncludeDeleted: true}); !equal(got, all) {
			t.Errorf("pages with deleted = %v, want %v", got, all)
		}
		var even []string
		for i, id := range live {
			_ = i
			if v := e.get(t, id); v.GetLabels()["parity"] == "even" {
				even = append(even, id)
			}
		}
		if got := page(&ctrlv1.ListVolumesRequest{PageSize: 1, LabelSelector: map[string]string{"parity": "even"}}); !equal(got, even) {
			t.Errorf("even pages = %v, want %v", got, even)
		}
		first, err := e.svc.List(t.Context(), &ctrlv1.ListVolumesRequest{PageSize: 1, IncludeDeleted: true})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.svc.List(t.Context(), &ctrlv1.ListVolumesRequest{PageSize: 1, PageToken: first.GetNextPageToken()})
		wantFault(t, "token of include_deleted without it", err, fault.KindInvalidArgument, fault.ReasonPageTokenInvalid)
		_, err = e.svc.List(t.Context(), &ctrlv1.ListVolumesRequest{PageSize: 1001})
		wantFault(t, "page_size 1001", err, fault.KindInvalidArgument, "")
		_, err = e.svc.List(t.Context(), &ctrlv1.ListVolumesRequest{LabelSelector: map[string]string{"bad key!": "x"}})
		wantFault(t, "bad selector", err, fault.KindInvalidArgument, "")
	})
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLabelsAndAnnotations: the whole map is replaced under CAS on its own
// revision (aborted with observed_volume on a mismatch), equal content keeps
// the revision, a deleted Volume refuses (failed_precondition).
func TestLabelsAndAnnotations(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 10*gib)
		id := e.mustCreate(t, "v", 16*mib, nil).GetVolumeId()
		for _, annotations := range []bool{false, true} {
			name := map[bool]string{false: "labels", true: "annotations"}[annotations]
			rev := func(v *ctrlv1.Volume) uint64 {
				if annotations {
					return v.GetAnnotationsRevision()
				}
				return v.GetLabelsRevision()
			}
			mp := func(v *ctrlv1.Volume) map[string]string {
				if annotations {
					return v.GetAnnotations()
				}
				return v.GetLabels()
			}
			upd := func(cid string, exp uint64, m map[string]string) (*ctrlv1.Volume, error) {
				req := &ctrlv1.UpdateVolumeLabelsRequest{Metadata: md(name + cid), VolumeId: id, ExpectedRevision: exp, Labels: m}
				return e.svc.UpdateMap(t.Context(), req, id, annotations, exp, m)
			}
			v, err := upd("1", 1, map[string]string{"a": "1"})
			if err != nil || rev(v) != 2 || !maps.Equal(mp(v), map[string]string{"a": "1"}) {
				t.Fatalf("%s update = %v, %v", name, v, err)
			}
			v, err = upd("2", 2, map[string]string{"a": "1"})
			if err != nil || rev(v) != 2 {
				t.Errorf("%s equal update = %v, %v, want revision 2", name, v, err)
			}
			_, err = upd("3", 1, map[string]string{"b": "2"})
			fe := wantFault(t, name+" stale revision", err, fault.KindAborted, fault.ReasonRevisionMismatch)
			if rev(fe.ObservedVolume) != 2 {
				t.Errorf("%s mismatch observed %v", name, fe.ObservedVolume)
			}
			v, err = upd("4", 2, nil)
			if err != nil || rev(v) != 3 || len(mp(v)) != 0 {
				t.Errorf("%s replace with empty = %v, %v", name, v, err)
			}
		}
		if _, err := e.svc.Delete(t.Context(), &ctrlv1.DeleteVolumeRequest{Metadata: md("del"), VolumeId: id}); err != nil {
			t.Fatal(err)
		}
		_, err := e.svc.UpdateMap(t.Context(), &ctrlv1.UpdateVolumeLabelsRequest{Metadata: md("after")}, id, false, 3, map[string]string{"x": "y"})
		wantFault(t, "labels of a deleted volume", err, fault.KindFailedPrecondition, fault.ReasonStateConflict)
		_, err = e.svc.UpdateMap(t.Context(), &ctrlv1.UpdateVolumeLabelsRequest{Metadata: md("reserved")}, id, false, 3, map[string]string{"kibotos.io/x": "y"})
		wantFault(t, "reserved label", err, fault.KindInvalidArgument, "")
	})
}

// TestGetRefusals: unknown IDs and commands are not_found; a Workspace
// command is not a Volume command.
func TestGetRefusals(t *testing.T) {
	e := newEnv(t, false)
	for _, id := range []string{"vol-nope", "ws-nope", strings.Repeat("x", 200)} {
		if _, err := e.svc.Get(t.Context(), id); fault.KindOf(err) != fault.KindNotFound {
			t.Errorf("GetVolume(%.20s) = %v, want not_found", id, err)
		}
	}
	if _, err := e.svc.Get(t.Context(), ""); fault.KindOf(err) != fault.KindInvalidArgument {
		t.Errorf("GetVolume(\"\") = %v", err)
	}
	if err := e.st.InTx(t.Context(), func(tx store.Tx) error {
		return tx.InsertCommand(t.Context(), &store.Command{ID: "ws-cmd", Method: "m", ObjectKind: "workspace", ObjectID: "ws-1", Kind: 1,
			Status: store.CommandCompleted, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)})
	}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"ws-cmd", "nope", "expiration/ws-1/1"} {
		if _, err := e.svc.GetCommand(t.Context(), id); fault.KindOf(err) != fault.KindNotFound {
			t.Errorf("GetVolumeCommand(%s) = %v, want not_found", id, err)
		}
	}
}
