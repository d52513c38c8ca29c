package reconciler

import (
	"strings"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/volume"
	"github.com/kibotos/kibotos/internal/workspace"
)

const mib = 1 << 20

// volumeHello is a node serving Volumes with a pool of storage bytes.
func volumeHello(id string, memMiB, storage uint64) *nodev1.Hello {
	h := hello(id, memMiB, 4000, "pool-"+id, workspace.DefaultTemplate)
	h.Capacity.StorageBytes = storage
	h.Features = []string{nodewire.FeatureVolumes}
	return h
}

// services are the admission services on the reconciler's store, with no
// wait for the node (tests drive the reconciler's steps themselves).
func services(r *Reconciler, st store.Store) (*volume.Service, *workspace.Service) {
	pages := paging.NewCodec([]byte("0123456789abcdef0123456789abcdef"))
	return &volume.Service{Engine: &command.Engine{Store: st}, Store: st, Pages: pages, Connected: r.VolumeNodes, WaitBound: time.Millisecond},
		&workspace.Service{Engine: &command.Engine{Store: st}, Store: st, Pages: pages,
			Templates:   func(id string) (string, bool) { return "v1", id == workspace.DefaultTemplate },
			MaxCapacity: r.MaxCapacity, WaitBound: time.Millisecond}
}

// drain returns the messages queued on nc.
func drain(nc *nodeConn) []*nodev1.DesiredState {
	var out []*nodev1.DesiredState
	for {
		select {
		case m := <-nc.send:
			out = append(out, m.GetDesired())
		default:
			return out
		}
	}
}

func volumesIn(msgs []*nodev1.DesiredState) []*nodev1.DesiredVolume {
	var out []*nodev1.DesiredVolume
	for _, m := range msgs {
		out = append(out, m.GetVolumes()...)
	}
	return out
}

// newAvailable creates a Volume through VolumeService on node and plays
// the node's report through the reconciler: it returns it AVAILABLE.
func newAvailable(t *testing.T, r *Reconciler, vs *volume.Service, st store.Store, nc *nodeConn, cid string, capacity uint64) string {
	t.Helper()
	_, err := vs.Create(t.Context(), &ctrlv1.CreateVolumeRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid}, CapacityBytes: capacity,
		Placement: &ctrlv1.Placement{NodeId: nc.id}})
	if fault.KindOf(err) != fault.KindUnavailable {
		t.Fatalf("CreateVolume(%s) = %v, want a timeout", cid, err)
	}
	c, err := vs.GetCommand(t.Context(), cid)
	if err != nil {
		t.Fatal(err)
	}
	r.volumeReport(t.Context(), nc.id, &nodev1.VolumeReport{VolumeId: c.GetVolumeId(), Generation: 1, Exists: true, CapacityBytes: capacity})
	if v, _ := vs.Get(t.Context(), c.GetVolumeId()); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
		t.Fatalf("volume %s after its report: %v", cid, v)
	}
	return c.GetVolumeId()
}

// TestVolumePushAndReport: a Volume command's generation is pushed once to
// its node's stream, alone; the node's report completes the command and
// wakes its waiters; the full state of a (re)connecting node lists all of
// its Volumes and none of another node's.
func TestVolumePushAndReport(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	na := connectNode(t, r, volumeHello("na", 4096, 10<<30))
	nb := connectNode(t, r, volumeHello("nb", 4096, 1<<30))
	vs, _ := services(r, st)
	_, err := vs.Create(t.Context(), &ctrlv1.CreateVolumeRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "c1"}, CapacityBytes: 64 * mib})
	if fault.KindOf(err) != fault.KindUnavailable {
		t.Fatalf("CreateVolume = %v, want a timeout", err)
	}
	c, _ := vs.GetCommand(t.Context(), "c1")
	id := c.GetVolumeId()
	for range 2 {
		if err := r.pass(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	got := volumesIn(drain(na))
	if len(got) != 1 || got[0].GetVolumeId() != id || got[0].GetGeneration() != 1 || got[0].GetCapacityBytes() != 64*mib || got[0].GetDeleted() {
		t.Fatalf("pushed to na: %v", got)
	}
	if got := drain(nb); len(got) != 0 {
		t.Errorf("pushed to nb: %v", got)
	}
	// A report from another node, or a stale one, is ignored.
	r.volumeReport(t.Context(), "nb", &nodev1.VolumeReport{VolumeId: id, Generation: 1, Exists: true, CapacityBytes: 64 * mib})
	if c, _ := vs.GetCommand(t.Context(), "c1"); c.GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_PROCESSING {
		t.Fatalf("a report of another node completed the command")
	}
	changed, release := st.Subscribe(volume.Topic(id))
	defer release()
	r.volumeReport(t.Context(), "na", &nodev1.VolumeReport{VolumeId: id, Generation: 1, Exists: true, CapacityBytes: 64 * mib,
		FailureMessage: ""})
	select {
	case <-changed:
	default:
		t.Error("the completing report woke no waiter")
	}
	if c, _ := vs.GetCommand(t.Context(), "c1"); c.GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_COMPLETED || c.GetError() != nil {
		t.Errorf("command after the report: %v", c)
	}
	// A reconnecting node gets its Volumes in its full state.
	full, err := r.fullState(t.Context(), na)
	if err != nil {
		t.Fatal(err)
	}
	if v := full.GetDesired().GetVolumes(); len(v) != 1 || v[0].GetVolumeId() != id || !full.GetDesired().GetFull() {
		t.Errorf("full state of na: %v", v)
	}
	if full, _ := r.fullState(t.Context(), nb); len(full.GetDesired().GetVolumes()) != 0 {
		t.Errorf("full state of nb: %v", full.GetDesired().GetVolumes())
	}
	// A delete is pushed as deleted, and its report makes it DELETED.
	if _, err := vs.Delete(t.Context(), &ctrlv1.DeleteVolumeRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "d1"}, VolumeId: id}); fault.KindOf(err) != fault.KindUnavailable {
		t.Fatalf("DeleteVolume = %v, want a timeout", err)
	}
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := volumesIn(drain(na)); len(got) != 1 || !got[0].GetDeleted() || got[0].GetGeneration() != 2 {
		t.Fatalf("pushed delete: %v", got)
	}
	r.volumeReport(t.Context(), "na", &nodev1.VolumeReport{VolumeId: id, Generation: 2})
	if v, _ := vs.Get(t.Context(), id); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
		t.Errorf("after the delete's report: %v", v.GetState())
	}
	if full, _ := r.fullState(t.Context(), na); len(full.GetDesired().GetVolumes()) != 0 {
		t.Errorf("full state lists a deleted volume: %v", full.GetDesired().GetVolumes())
	}
}

// TestVolumeCapabilities: volume.create and workspace.volume_binding follow
// connected nodes that serve Volumes.
func TestVolumeCapabilities(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	plain := connectNode(t, r, hello("n0", 4096, 4000, "", workspace.DefaultTemplate))
	if r.ServesVolumes() {
		t.Error("ServesVolumes with a node without the feature")
	}
	nc := connectNode(t, r, volumeHello("n1", 4096, 1<<30))
	if !r.ServesVolumes() || strings.Join(r.VolumeNodes(), ",") != "n1" {
		t.Errorf("VolumeNodes = %v", r.VolumeNodes())
	}
	r.detach(nc)
	r.detach(plain)
	if r.ServesVolumes() {
		t.Error("ServesVolumes with no node connected")
	}
}

// TestPlacementFollowsVolume: a Workspace bound to a Volume is placed only
// on the node holding it (and waits while that node is away); its desired
// state mounts it and carries the Volume's own desired state.
func TestPlacementFollowsVolume(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	connectNode(t, r, volumeHello("big", 16384, 100<<30))
	small := connectNode(t, r, volumeHello("small", 2048, 10<<30))
	vs, ws := services(r, st)
	vol := newAvailable(t, r, vs, st, small, "v", 64*mib)
	res, err := ws.Create(t.Context(), &ctrlv1.CreateWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "w"},
		Resources:     &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500},
		VolumeBinding: &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: vol, MountPath: "/data"}})
	if err != nil {
		t.Fatal(err)
	}
	id := res.GetWorkspace().GetWorkspaceId()
	drain(small)
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if w, _ := load(t, st, id); w.NodeID != "small" {
		t.Fatalf("placed on %q, want small (which holds its volume)", w.NodeID)
	}
	msgs := drain(small)
	if len(msgs) != 1 {
		t.Fatalf("%d messages to small", len(msgs))
	}
	d := msgs[0]
	if len(d.GetWorkspaces()) != 1 || d.GetWorkspaces()[0].GetVolume().GetVolumeId() != vol || d.GetWorkspaces()[0].GetVolume().GetMountPath() != "/data" {
		t.Errorf("desired workspace %v", d.GetWorkspaces())
	}
	if len(d.GetVolumes()) != 1 || d.GetVolumes()[0].GetVolumeId() != vol {
		t.Errorf("the volume did not travel with its workspace: %v", d.GetVolumes())
	}
	// With the node holding the Volume away, another is never chosen.
	vol2 := newAvailable(t, r, vs, st, small, "v2", 64*mib)
	r.detach(small)
	res, err = ws.Create(t.Context(), &ctrlv1.CreateWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "w2"},
		Resources:     &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500},
		VolumeBinding: &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: vol2, MountPath: "/data"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if w, _ := load(t, st, res.GetWorkspace().GetWorkspaceId()); w.NodeID != "" {
		t.Errorf("placed on %q while the volume's node is away", w.NodeID)
	}
}

// TestPlacementStorage: a node whose pool cannot hold a new Workspace's
// writable layer (and the Volume of its NEW binding) is not chosen.
func TestPlacementStorage(t *testing.T) {
	r, st, clock := newTest(t, Config{PlacementTimeout: time.Minute})
	connectNode(t, r, volumeHello("roomy", 2048, 4<<30))
	tight := connectNode(t, r, volumeHello("tight", 16384, 3<<30))
	vs, ws := services(r, st)
	newAvailable(t, r, vs, st, tight, "filler", 2<<30) // 1 GiB of tight's pool is left
	create := func(cid string, layer uint64, b *ctrlv1.VolumeBinding) string {
		t.Helper()
		res, err := ws.Create(t.Context(), &ctrlv1.CreateWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid},
			Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500}, WritableLayerCapacityBytes: layer, VolumeBinding: b})
		if err != nil {
			t.Fatal(err)
		}
		return res.GetWorkspace().GetWorkspaceId()
	}
	// tight has the most memory, but 1 GiB of pool left for a 2 GiB layer.
	a := create("a", 2<<30, nil)
	// 512 MiB of layer fits tight, plus a NEW Volume of 1 GiB does not.
	b := create("b", 512*mib, &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW, NewVolumeCapacityBytes: 1 << 30, MountPath: "/v"})
	// Nothing holds 3 GiB any more.
	c := create("c", 3<<30, nil)
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{a: "roomy", b: "roomy", c: ""} {
		if w, _ := load(t, st, id); w.NodeID != want {
			t.Errorf("%s placed on %q, want %q", id, w.NodeID, want)
		}
	}
	// The NEW Volume went with its Workspace, at generation 1, and the
	// pushed desired state of b carries it.
	_, pub := load(t, st, b)
	var v *volume.Volume
	_ = st.View(t.Context(), func(tx store.Tx) error {
		var err error
		v, err = volume.Load(t.Context(), tx, pub.GetVolumeBinding().GetVolumeId())
		return err
	})
	if v == nil || v.Node != "roomy" || v.Generation != 1 || v.Pub.GetPlacement().GetStoragePool() != "pool-roomy" {
		t.Fatalf("NEW volume after placement: %+v", v)
	}
	if got := drain(tight); len(got) != 0 && len(got[0].GetWorkspaces()) != 0 {
		t.Errorf("pushed to tight: %v", got)
	}
	clock.Set(time.Now().Add(2 * time.Minute)) // the admission dated the Workspace by the real clock
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if w, pub := load(t, st, c); w.NodeID != "" || pub.GetFailure().GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED ||
		!strings.Contains(pub.GetFailure().GetMessage(), "storage pool") {
		t.Errorf("c after the placement timeout: %v", pub.GetFailure())
	}
}

// TestWorkspaceDeletionAndVolume: when a Workspace's deletion completes its
// Volume is released to AVAILABLE, or deleted with delete_with_workspace
// (pushed deleted, DELETED on the node's report).
func TestWorkspaceDeletionAndVolume(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	nc := connectNode(t, r, volumeHello("n1", 8192, 10<<30))
	vs, ws := services(r, st)
	keep, gone := newAvailable(t, r, vs, st, nc, "keep", 64*mib), newAvailable(t, r, vs, st, nc, "gone", 64*mib)
	ids := map[string]string{}
	for vol, dww := range map[string]bool{keep: false, gone: true} {
		res, err := ws.Create(t.Context(), &ctrlv1.CreateWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: vol},
			Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500},
			VolumeBinding: &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: vol, MountPath: "/data",
				DeleteWithWorkspace: dww}})
		if err != nil {
			t.Fatal(err)
		}
		ids[vol] = res.GetWorkspace().GetWorkspaceId()
	}
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	drain(nc)
	for vol, id := range ids {
		r.report(t.Context(), nc, &nodev1.ExecutionReport{WorkspaceId: id, Generation: 1, State: nodev1.ExecState_EXEC_STATE_RUNNING, HoldsExecution: true})
		if _, err := ws.Delete(t.Context(), &ctrlv1.DeleteWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "del-" + vol},
			WorkspaceId: id, ExpectedExpirationRevision: 1}); fault.KindOf(err) != fault.KindUnavailable {
			t.Fatalf("DeleteWorkspace = %v, want a timeout", err)
		}
		if v, _ := vs.Get(t.Context(), vol); v.GetBoundWorkspaceId() != id {
			t.Errorf("volume released before the deletion completed: %v", v)
		}
		r.report(t.Context(), nc, &nodev1.ExecutionReport{WorkspaceId: id, Generation: 2, State: nodev1.ExecState_EXEC_STATE_DELETED})
	}
	if v, _ := vs.Get(t.Context(), keep); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.GetBoundWorkspaceId() != "" {
		t.Errorf("kept volume: %v", v)
	}
	if v, _ := vs.Get(t.Context(), gone); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETING || v.GetBoundWorkspaceId() != "" {
		t.Errorf("volume deleted with its workspace: %v", v)
	}
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := volumesIn(drain(nc))
	if len(got) != 1 || got[0].GetVolumeId() != gone || !got[0].GetDeleted() {
		t.Fatalf("pushed: %v", got)
	}
	r.volumeReport(t.Context(), "n1", &nodev1.VolumeReport{VolumeId: gone, Generation: got[0].GetGeneration()})
	if v, _ := vs.Get(t.Context(), gone); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
		t.Errorf("after the node's report: %v", v)
	}
}
