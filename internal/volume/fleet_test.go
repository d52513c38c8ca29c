package volume_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/volume"
)

// setPoolOverride records an operator's capacity override of a pool, as
// SetStoragePoolCapacity does.
func setPoolOverride(t *testing.T, st store.Store, node, pool string, bytes uint64) {
	t.Helper()
	b, err := json.Marshal(fleet.PoolRecord{OverrideBytes: bytes})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	err = st.InTx(t.Context(), func(tx store.Tx) error {
		r := &store.Resource{Kind: fleet.KindPool, ID: fleet.PoolKey(node, pool), CreatedAt: now, UpdatedAt: now, Revision: 1, Spec: b,
			LabelsRevision: 1, AnnotationsRevision: 1, Labels: map[string]string{}, Annotations: map[string]string{}}
		if old, err := tx.GetResource(t.Context(), r.Kind, r.ID); err == nil {
			r.Revision, r.CreatedAt = old.Revision+1, old.CreatedAt
			return tx.UpdateResource(t.Context(), r)
		}
		return tx.InsertResource(t.Context(), r)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// setNodeState records a node's fleet state.
func setNodeState(t *testing.T, st store.Store, node string, s fleet.State) {
	t.Helper()
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		r, rec, err := fleet.GetRecord(t.Context(), tx, node)
		if errors.Is(err, store.ErrNotFound) {
			r, rec, err = nil, &fleet.Record{RegistrationVersion: 1}, nil
		}
		if err != nil {
			return err
		}
		rec.State = s
		return fleet.PutRecord(t.Context(), tx, r, node, rec, time.Now().UTC().Truncate(time.Microsecond))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPoolOverride: a capacity override smaller than the reported size is
// what PoolFree, CreateVolume and ResizeVolume judge by (resource_exhausted
// when the pool cannot hold it); a larger one changes nothing.
func TestPoolOverride(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 2*gib)
		free := func() uint64 {
			t.Helper()
			var f uint64
			if err := e.st.View(t.Context(), func(tx store.Tx) error {
				var err error
				f, _, err = volume.PoolFree(t.Context(), tx, "node-a")
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return f
		}
		seedWorkspace(t, e.st, "ws-1", "node-a", 256*mib, false)
		setPoolOverride(t, e.st, "node-a", "pool-a", 4*gib) // above the reported size: no effect
		if f := free(); f != 2*gib-256*mib {
			t.Fatalf("free with an override above the size = %d MiB", f/mib)
		}
		setPoolOverride(t, e.st, "node-a", "pool-a", 1*gib)
		if f := free(); f != 768*mib {
			t.Fatalf("free with a 1 GiB override = %d MiB, want 768", f/mib)
		}
		setPoolOverride(t, e.st, "node-a", "pool-b", 1*mib) // another pool's override
		if f := free(); f != 768*mib {
			t.Fatalf("free with another pool's override = %d MiB, want 768", f/mib)
		}
		_, err := e.create(t, "v-big", 769*mib, &ctrlv1.Placement{NodeId: "node-a"})
		wantFault(t, "CreateVolume beyond the override", err, fault.KindResourceExhausted, fault.ReasonCapacityExhausted)
		_, err = e.create(t, "v-big-auto", 769*mib, nil)
		wantFault(t, "CreateVolume beyond the override, placed by ctrl", err, fault.KindResourceExhausted, fault.ReasonCapacityExhausted)
		v := e.mustCreate(t, "v", 512*mib, nil)
		_, err = e.svc.Resize(t.Context(), &ctrlv1.ResizeVolumeRequest{Metadata: md("grow"), VolumeId: v.GetVolumeId(), CapacityBytes: 769 * mib})
		wantFault(t, "ResizeVolume beyond the override", err, fault.KindResourceExhausted, fault.ReasonCapacityExhausted)
		if _, err := e.svc.Resize(t.Context(), &ctrlv1.ResizeVolumeRequest{Metadata: md("grow-fit"), VolumeId: v.GetVolumeId(), CapacityBytes: 768 * mib}); err != nil {
			t.Errorf("ResizeVolume to exactly the override = %v", err)
		}
	})
}

// TestVolumePlacementNodeState: no new Volume goes to a node that is not
// ACTIVE: named, it is failed_precondition naming the state; placed by
// ctrl, the ACTIVE nodes are chosen, and with none the refusal names the
// others' states. A Volume already on a DRAINING node still grows.
func TestVolumePlacementNodeState(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		e := newEnv(t, pg)
		e.addNode(t, "node-a", "pool-a", 4*gib)
		e.addNode(t, "node-b", "pool-a", 1*gib)
		v := e.mustCreate(t, "v-before", 256*mib, &ctrlv1.Placement{NodeId: "node-a"})
		setNodeState(t, e.st, "node-a", fleet.StateDraining)
		_, err := e.create(t, "v-named", 256*mib, &ctrlv1.Placement{NodeId: "node-a"})
		fe := wantFault(t, "CreateVolume on a draining node", err, fault.KindFailedPrecondition, fault.ReasonStateConflict)
		if !strings.Contains(fe.Message, `node "node-a" is draining`) {
			t.Errorf("message = %q", fe.Message)
		}
		// Placed by ctrl: node-b, though node-a has more room.
		if got := e.mustCreate(t, "v-auto", 256*mib, nil); got.GetPlacement().GetNodeId() != "node-b" {
			t.Errorf("placed on %q, want node-b (node-a is draining)", got.GetPlacement().GetNodeId())
		}
		setNodeState(t, e.st, "node-b", fleet.StateIsolated)
		_, err = e.create(t, "v-none", 256*mib, nil)
		fe = wantFault(t, "CreateVolume with no ACTIVE node", err, fault.KindFailedPrecondition, fault.ReasonStateConflict)
		if !strings.Contains(fe.Message, `node "node-a" is draining, node "node-b" is isolated`) {
			t.Errorf("message = %q", fe.Message)
		}
		if _, err := e.svc.Resize(t.Context(), &ctrlv1.ResizeVolumeRequest{Metadata: md("grow"), VolumeId: v.GetVolumeId(), CapacityBytes: 512 * mib}); err != nil {
			t.Errorf("ResizeVolume on a draining node = %v", err)
		}
	})
}
