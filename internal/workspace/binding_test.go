package workspace_test

import (
	"fmt"
	"strings"
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
	"github.com/kibotos/kibotos/internal/volume"
	"github.com/kibotos/kibotos/internal/workspace"
)

// newVolume plays CreateVolume and its node: an AVAILABLE Volume of 64 MiB
// on node (registered as serving Volumes on first use).
func newVolume(t *testing.T, st store.Store, node, cid string) string {
	t.Helper()
	doc, _ := proto.Marshal(&nodev1.Hello{NodeId: node, Features: []string{nodewire.FeatureVolumes},
		Capacity: &nodev1.Capacity{StorageBytes: 100 << 30, StoragePool: "default"}})
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := st.InTx(t.Context(), func(tx store.Tx) error {
		return tx.UpsertNode(t.Context(), &store.Node{ID: node, CreatedAt: now, LastSeen: now, StorageBytes: 100 << 30, Doc: doc})
	}); err != nil {
		t.Fatal(err)
	}
	vs := &volume.Service{Engine: &command.Engine{Store: st}, Store: st, Pages: paging.NewCodec([]byte("0123456789abcdef0123456789abcdef")),
		WaitBound: time.Millisecond}
	_, err := vs.Create(t.Context(), &ctrlv1.CreateVolumeRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid}, CapacityBytes: 64 << 20,
		Placement: &ctrlv1.Placement{NodeId: node}})
	if fault.KindOf(err) != fault.KindUnavailable {
		t.Fatalf("CreateVolume without a node answering = %v", err)
	}
	c, err := vs.GetCommand(t.Context(), cid)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InTx(t.Context(), func(tx store.Tx) error {
		_, done, err := volume.Report(t.Context(), tx, node, &nodev1.VolumeReport{VolumeId: c.GetVolumeId(), Generation: 1, Exists: true,
			CapacityBytes: 64 << 20}, now)
		if err == nil && !done {
			err = fmt.Errorf("the report completed nothing")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c.GetVolumeId()
}

func getVolume(t *testing.T, st store.Store, id string) *ctrlv1.Volume {
	t.Helper()
	var v *volume.Volume
	if err := st.View(t.Context(), func(tx store.Tx) error {
		var err error
		v, err = volume.Load(t.Context(), tx, id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v.Pub
}

func bound(id, path string, dww bool) *ctrlv1.VolumeBinding {
	return &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: id, MountPath: path, DeleteWithWorkspace: dww}
}

var none = &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE}

func createBound(s *workspace.Service, t *testing.T, cid string, b *ctrlv1.VolumeBinding) (*ctrlv1.Workspace, error) {
	req := createReq(cid, nil)
	req.VolumeBinding = b
	res, err := s.Create(t.Context(), req)
	return res.GetWorkspace(), err
}

func rebind(s *workspace.Service, t *testing.T, cid, ws string, exp uint64, b *ctrlv1.VolumeBinding) (*ctrlv1.Workspace, error) {
	res, err := s.UpdateVolumeBinding(t.Context(), &ctrlv1.UpdateWorkspaceVolumeBindingRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: cid}, WorkspaceId: ws, ExpectedRevision: exp, VolumeBinding: b})
	return res.GetWorkspace(), err
}

func wantBoundTo(t *testing.T, st store.Store, vol, ws string) {
	t.Helper()
	v := getVolume(t, st, vol)
	if v.GetBoundWorkspaceId() != ws || (v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE && v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_CREATING) {
		t.Errorf("volume %s: state %v bound to %q, want bound to %q", vol, v.GetState(), v.GetBoundWorkspaceId(), ws)
	}
}

// TestCreateWithBinding: NONE by default; BOUND binds an AVAILABLE unbound
// Volume (else failed_precondition with observed_volume, or not_found);
// NEW creates a Volume bound to the Workspace, without a node until
// placement, and the binding then reads BOUND to it.
func TestCreateWithBinding(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		w := create(t, s, "plain")
		if w.GetVolumeBinding().GetMode() != ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE || w.GetBindingRevision() != 1 {
			t.Errorf("default binding %v rev %d", w.GetVolumeBinding(), w.GetBindingRevision())
		}
		vol := newVolume(t, st, "node-1", "vol-a")
		w, err := createBound(s, t, "bound", bound(vol, "/data", true))
		if err != nil {
			t.Fatal(err)
		}
		if b := w.GetVolumeBinding(); !proto.Equal(b, bound(vol, "/data", true)) || w.GetBindingRevision() != 1 {
			t.Errorf("binding %v", b)
		}
		wantBoundTo(t, st, vol, w.GetWorkspaceId())
		// Bound already: refused, nothing created.
		_, err = createBound(s, t, "bound-again", bound(vol, "/data", false))
		fe, _ := fault.As(err)
		if fault.KindOf(err) != fault.KindFailedPrecondition || fe.ObservedVolume.GetBoundWorkspaceId() != w.GetWorkspaceId() || fe.Field != "volume_binding.volume_id" {
			t.Errorf("bind a bound volume = %v", err)
		}
		_, err = createBound(s, t, "unknown", bound("vol-nope", "/data", false))
		if fe, _ := fault.As(err); fault.KindOf(err) != fault.KindNotFound || fe.Field != "volume_binding.volume_id" {
			t.Errorf("bind an unknown volume = %v", err)
		}
		// NEW.
		w, err = createBound(s, t, "new", &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW,
			NewVolumeCapacityBytes: 32 << 20, MountPath: "/work"})
		if err != nil {
			t.Fatal(err)
		}
		b := w.GetVolumeBinding()
		if b.GetMode() != ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND || !strings.HasPrefix(b.GetVolumeId(), "vol-") || b.GetMountPath() != "/work" {
			t.Fatalf("NEW binding reads %v", b)
		}
		nv := getVolume(t, st, b.GetVolumeId())
		if nv.GetState() != ctrlv1.VolumeState_VOLUME_STATE_CREATING || nv.GetCapacityBytes() != 32<<20 || nv.GetBoundWorkspaceId() != w.GetWorkspaceId() ||
			nv.GetPlacement().GetNodeId() != "" {
			t.Errorf("NEW volume %v", nv)
		}
		// A CREATING Volume cannot be bound by another.
		_, err = createBound(s, t, "bind-creating", bound(b.GetVolumeId(), "/x", false))
		if fault.KindOf(err) != fault.KindFailedPrecondition {
			t.Errorf("bind a CREATING volume = %v", err)
		}
	})
}

// TestBindingInvalid: malformed bindings are invalid_argument on their
// field, recorded nowhere; NEW is refused by UpdateWorkspaceVolumeBinding.
func TestBindingInvalid(t *testing.T) {
	s, _ := newService(t)
	newB := func(c uint64, p string) *ctrlv1.VolumeBinding {
		return &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW, NewVolumeCapacityBytes: c, MountPath: p}
	}
	for i, tc := range []struct {
		b     *ctrlv1.VolumeBinding
		field string
	}{
		{newB(0, "/data"), "volume_binding.new_volume_capacity_bytes"},
		{newB(16<<20+1, "/data"), "volume_binding.new_volume_capacity_bytes"},
		{newB(64<<20, ""), "volume_binding.mount_path"},
		{newB(64<<20, "/proc/x"), "volume_binding.mount_path"},
		{newB(64<<20, "/"), "volume_binding.mount_path"},
		{newB(64<<20, "rel"), "volume_binding.mount_path"},
		{bound("", "/data", false), "volume_binding.volume_id"},
		{bound("vol-x", "/a/../b", false), "volume_binding.mount_path"},
		{&ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE, VolumeId: "vol-x"}, "volume_binding.volume_id"},
		{&ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE, MountPath: "/x"}, "volume_binding.mount_path"},
		{&ctrlv1.VolumeBinding{Mode: 9}, "volume_binding.mode"},
	} {
		_, err := createBound(s, t, fmt.Sprintf("c%d", i), tc.b)
		wantFault(t, fmt.Sprintf("CreateWorkspace binding #%d", i), err, fault.KindInvalidArgument, tc.field)
	}
	for i, tc := range []struct {
		b     *ctrlv1.VolumeBinding
		field string
	}{
		{nil, "volume_binding"},
		{&ctrlv1.VolumeBinding{}, "volume_binding.mode"},
		{newB(64<<20, "/data"), "volume_binding.mode"},
		{bound("vol-x", "/sys", false), "volume_binding.mount_path"},
	} {
		_, err := rebind(s, t, fmt.Sprintf("u%d", i), "ws-x", 1, tc.b)
		wantFault(t, fmt.Sprintf("UpdateWorkspaceVolumeBinding #%d", i), err, fault.KindInvalidArgument, tc.field)
	}
}

// TestUpdateBindingStates: same state rule as UpdateWorkspaceMemory.
func TestUpdateBindingStates(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		vol := newVolume(t, st, "node-1", "v")
		for i, st2 := range configRefused {
			ws := create(t, s, fmt.Sprintf("r%d", i)).GetWorkspaceId()
			edit(t, st, ws, st2.set)
			_, err := rebind(s, t, fmt.Sprintf("rb%d", i), ws, 1, bound(vol, "/data", false))
			wantRefusal(t, st2.name, err, fault.KindFailedPrecondition, fault.ReasonStateConflict, "")
			wantBoundTo(t, st, vol, "")
		}
		for i, st2 := range configAdmitted {
			ws := create(t, s, fmt.Sprintf("a%d", i)).GetWorkspaceId()
			edit(t, st, ws, st2.set)
			edit(t, st, ws, func(w *store.Workspace, _ *ctrlv1.Workspace) { w.NodeID = "node-1" })
			w, err := rebind(s, t, fmt.Sprintf("ab%d", i), ws, 1, bound(vol, "/data", false))
			if err != nil || w.GetBindingRevision() != 2 {
				t.Fatalf("%s: bind = %v, %v", st2.name, w, err)
			}
			if _, err := rebind(s, t, fmt.Sprintf("an%d", i), ws, 2, none); err != nil {
				t.Fatalf("%s: release = %v", st2.name, err)
			}
		}
	})
}

// TestUpdateBinding: the complete target replaces the binding; NONE
// releases, BOUND with the current Volume changes its mount path or
// delete_with_workspace, BOUND with another binds it and releases the
// current one; a released Volume is AVAILABLE again; the same binding keeps
// binding_revision; a stale revision is aborted; binding_revision is
// independent of resources_revision.
func TestUpdateBinding(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		a, b := newVolume(t, st, "node-1", "va"), newVolume(t, st, "node-1", "vb")
		ws := stoppedWS(t, s, st, "ws", true)
		w, err := rebind(s, t, "b1", ws, 1, bound(a, "/data", false))
		if err != nil || w.GetBindingRevision() != 2 || !proto.Equal(w.GetVolumeBinding(), bound(a, "/data", false)) {
			t.Fatalf("bind a = %v, %v", w, err)
		}
		wantBoundTo(t, st, a, ws)
		// The same binding: success, same revision.
		w, err = rebind(s, t, "b1-same", ws, 2, bound(a, "/data", false))
		if err != nil || w.GetBindingRevision() != 2 {
			t.Errorf("same binding = %v, %v, want revision 2", w, err)
		}
		// A stale revision: aborted, nothing changes.
		_, err = rebind(s, t, "stale", ws, 1, none)
		wantRefusal(t, "stale binding_revision", err, fault.KindAborted, fault.ReasonRevisionMismatch, "expected_revision")
		wantBoundTo(t, st, a, ws)
		// Same Volume, another mount path and delete_with_workspace.
		w, err = rebind(s, t, "b2", ws, 2, bound(a, "/other", true))
		if err != nil || w.GetBindingRevision() != 3 || !proto.Equal(w.GetVolumeBinding(), bound(a, "/other", true)) {
			t.Fatalf("change mount = %v, %v", w, err)
		}
		wantBoundTo(t, st, a, ws)
		// Another Volume: bound, the current one released.
		w, err = rebind(s, t, "b3", ws, 3, bound(b, "/data", false))
		if err != nil || w.GetBindingRevision() != 4 {
			t.Fatalf("bind b = %v, %v", w, err)
		}
		wantBoundTo(t, st, b, ws)
		wantBoundTo(t, st, a, "")
		// resources_revision did not move, and a memory change does not move
		// binding_revision.
		if w.GetResourcesRevision() != 1 {
			t.Errorf("resources_revision %d after binding changes", w.GetResourcesRevision())
		}
		mem, err := s.UpdateMemory(t.Context(), memReq("m", ws, 1, 512))
		if err != nil || mem.GetWorkspace().GetBindingRevision() != 4 || mem.GetWorkspace().GetResourcesRevision() != 2 {
			t.Errorf("memory change = %v, %v", mem, err)
		}
		// NONE releases.
		w, err = rebind(s, t, "b4", ws, 4, none)
		if err != nil || w.GetBindingRevision() != 5 || w.GetVolumeBinding().GetMode() != ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE {
			t.Fatalf("release = %v, %v", w, err)
		}
		wantBoundTo(t, st, b, "")
		if v := getVolume(t, st, b); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
			t.Errorf("released volume %v", v.GetState())
		}
		// The replay of a recorded command answers the same.
		again, err := rebind(s, t, "b3", ws, 3, bound(b, "/data", false))
		if err != nil || again.GetBindingRevision() != 4 {
			t.Errorf("replay of b3 = %v, %v", again, err)
		}
	})
}

// TestUpdateBindingTarget: the target must be AVAILABLE, unbound and on
// the node of the Workspace's placement; else failed_precondition with
// observed_volume (and observed_workspace), nothing changed.
func TestUpdateBindingTarget(t *testing.T) {
	dialects(t, func(t *testing.T, s *workspace.Service, st store.Store) {
		here, there := newVolume(t, st, "node-1", "here"), newVolume(t, st, "node-2", "there")
		ws := stoppedWS(t, s, st, "ws", true) // on node-1
		other := stoppedWS(t, s, st, "other", true)
		if _, err := rebind(s, t, "o", other, 1, bound(here, "/data", false)); err != nil {
			t.Fatal(err)
		}
		check := func(what string, err error, vol string) {
			t.Helper()
			fe, ok := fault.As(err)
			if !ok || fe.Kind != fault.KindFailedPrecondition || fe.ObservedVolume.GetVolumeId() != vol || fe.ObservedWorkspace == nil ||
				fe.Field != "volume_binding.volume_id" || !fe.Settled {
				t.Errorf("%s = %v, want failed_precondition with observed_volume %s", what, err, vol)
			}
		}
		_, err := rebind(s, t, "t1", ws, 1, bound(here, "/data", false))
		check("bind a volume bound to another workspace", err, here)
		_, err = rebind(s, t, "t2", ws, 1, bound(there, "/data", false))
		check("bind a volume of another node", err, there)
		vs := &volume.Service{Engine: &command.Engine{Store: st}, Store: st, WaitBound: time.Millisecond}
		if _, err := vs.Delete(t.Context(), &ctrlv1.DeleteVolumeRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "del"}, VolumeId: there}); fault.KindOf(err) != fault.KindUnavailable {
			t.Fatalf("delete without a node answering = %v", err)
		}
		edit(t, st, ws, func(w *store.Workspace, _ *ctrlv1.Workspace) { w.NodeID = "node-2" })
		_, err = rebind(s, t, "t3", ws, 1, bound(there, "/data", false))
		check("bind a DELETING volume", err, there)
		_, err = rebind(s, t, "t4", ws, 1, bound("vol-nope", "/data", false))
		if fe, _ := fault.As(err); fault.KindOf(err) != fault.KindNotFound || fe.Field != "volume_binding.volume_id" {
			t.Errorf("bind an unknown volume = %v", err)
		}
		if w, err := s.Get(t.Context(), ws); err != nil || w.GetBindingRevision() != 1 {
			t.Errorf("workspace after refusals: %v, %v", w, err)
		}
	})
}
