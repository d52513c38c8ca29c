package api_test

import (
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// volumeEnv is a server with a node serving Volumes (the fake runtime,
// its pool pool bytes), on SQLite or PostgreSQL.
func volumeEnv(t *testing.T, pg bool, pool uint64) (*ctrltest.Env, ctrltest.Clients, *agenttest.Runtime) {
	rt := agenttest.New()
	rt.StorageBytes = pool
	e := ctrltest.New(t, ctrltest.Options{Postgres: pg, Runtime: rt, WaitBound: 2 * time.Second, NodeStorageBytes: pool,
		NodeFeatures: []string{nodewire.FeatureVolumes}})
	c := e.Clients(e.HTTP)
	waitNode(t, c)
	return e, c, rt
}

func createVolume(t *testing.T, c ctrltest.Clients, cid string, capacity uint64) *ctrlv1.Volume {
	t.Helper()
	r, err := c.Volume.CreateVolume(t.Context(), connect.NewRequest(&ctrlv1.CreateVolumeRequest{Metadata: md(cid), CapacityBytes: capacity}))
	if err != nil {
		t.Fatalf("CreateVolume(%s) = %v", cid, err)
	}
	return r.Msg.GetVolume()
}

func getVolume(t *testing.T, c ctrltest.Clients, id string) *ctrlv1.Volume {
	t.Helper()
	r, err := c.Volume.GetVolume(t.Context(), connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: id}))
	if err != nil {
		t.Fatalf("GetVolume(%s) = %v", id, err)
	}
	return r.Msg.GetVolume()
}

func waitVolume(t *testing.T, c ctrltest.Clients, id string, want ctrlv1.VolumeState) *ctrlv1.Volume {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var v *ctrlv1.Volume
	for time.Now().Before(deadline) {
		if v = getVolume(t, c, id); v.GetState() == want {
			return v
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("volume %s is %v, want %v", id, v.GetState(), want)
	return nil
}

func createBoundWS(t *testing.T, c ctrltest.Clients, cid string, b *ctrlv1.VolumeBinding) *ctrlv1.Workspace {
	t.Helper()
	r, err := c.Workspace.CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md(cid), Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500}, VolumeBinding: b}))
	if err != nil {
		t.Fatalf("CreateWorkspace(%s) = %v", cid, err)
	}
	if cmd := waitCommand(t, c, cid); cmd.GetError() != nil {
		t.Fatalf("create %s: %v", cid, cmd.GetError())
	}
	return waitState(t, c, r.Msg.GetWorkspace().GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
}

func stopped(t *testing.T, c ctrltest.Clients, cid string, w *ctrlv1.Workspace) {
	t.Helper()
	if _, err := stopWS(c, t, cid, w, false); err != nil {
		t.Fatalf("StopWorkspace(%s) = %v", w.GetWorkspaceId(), err)
	}
}

// TestVolumesNotServed: without a node that serves Volumes, VolumeService
// and the binding fields are unimplemented (CAPABILITY_UNAVAILABLE) and
// the capabilities are not listed.
func TestVolumesNotServed(t *testing.T) {
	t.Parallel()
	_, c, _ := wsEnv(t, ctrltest.Options{})
	waitNode(t, c)
	info, err := c.ServerInfo.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{capability.VolumeCreate, capability.WorkspaceVolumeBinding} {
		if slices.Contains(info.Msg.GetCapabilities(), name) {
			t.Errorf("%s listed without a node serving volumes", name)
		}
	}
	_, err = c.Volume.CreateVolume(t.Context(), connect.NewRequest(&ctrlv1.CreateVolumeRequest{Metadata: md("v"), CapacityBytes: 64 << 20}))
	wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false)
	_, err = c.Workspace.CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Metadata: md("w"),
		Resources:     &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500},
		VolumeBinding: &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW, NewVolumeCapacityBytes: 64 << 20, MountPath: "/v"}}))
	if d := wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false); d.GetField() != "volume_binding" {
		t.Errorf("field %q", d.GetField())
	}
}

// TestVolumeLifecycle: over the wire with the fake runtime, on both
// stores: the capabilities are served; CreateVolume returns it AVAILABLE;
// a Workspace binds it and mounts it at its path; DeleteVolume is refused
// while bound (failed_precondition with observed_volume); the binding is
// moved to another Workspace (released, bound, mounted there at the next
// start); ResizeVolume grows it; DeleteWorkspace releases it or, with
// delete_with_workspace, deletes it; GetVolumeCommand and ListVolumes see
// all of it.
func TestVolumeLifecycle(t *testing.T) {
	forDialects(t, func(t *testing.T, pg bool) {
		_, c, rt := volumeEnv(t, pg, 10<<30)
		info, err := c.ServerInfo.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{capability.VolumeCreate, capability.WorkspaceVolumeBinding} {
			if !slices.Contains(info.Msg.GetCapabilities(), name) {
				t.Errorf("%s not listed with a node serving volumes", name)
			}
		}
		v := createVolume(t, c, "vol", 64<<20)
		if v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.GetPlacement().GetNodeId() != "node-1" || v.GetPlacement().GetStoragePool() != "default" {
			t.Fatalf("created %v", v)
		}
		if st := rt.VolumeStatus(v.GetVolumeId()); !st.Exists || st.CapacityBytes != 64<<20 {
			t.Fatalf("the node holds %+v", st)
		}
		a := createBoundWS(t, c, "ws-a", &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND,
			VolumeId: v.GetVolumeId(), MountPath: "/data"})
		if m, ok := rt.Mount(a.GetWorkspaceId()); !ok || m.VolumeID != v.GetVolumeId() || m.MountPath != "/data" {
			t.Errorf("mount of a: %+v, %v", m, ok)
		}
		_, err = c.Volume.DeleteVolume(t.Context(), connect.NewRequest(&ctrlv1.DeleteVolumeRequest{Metadata: md("del-bound"), VolumeId: v.GetVolumeId()}))
		d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT, true)
		if d.GetObservedVolume().GetBoundWorkspaceId() != a.GetWorkspaceId() {
			t.Errorf("observed_volume %v", d.GetObservedVolume())
		}
		// Configuration only: refused while a runs.
		_, err = c.Workspace.UpdateWorkspaceVolumeBinding(t.Context(), connect.NewRequest(&ctrlv1.UpdateWorkspaceVolumeBindingRequest{
			Metadata: md("rebind-running"), WorkspaceId: a.GetWorkspaceId(), ExpectedRevision: 1,
			VolumeBinding: &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE}}))
		if d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true); d.GetObservedWorkspace() == nil {
			t.Error("no observed_workspace")
		}
		stopped(t, c, "stop-a", a)
		r, err := c.Workspace.UpdateWorkspaceVolumeBinding(t.Context(), connect.NewRequest(&ctrlv1.UpdateWorkspaceVolumeBindingRequest{
			Metadata: md("release-a"), WorkspaceId: a.GetWorkspaceId(), ExpectedRevision: 1,
			VolumeBinding: &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE}}))
		if err != nil || r.Msg.GetWorkspace().GetBindingRevision() != 2 {
			t.Fatalf("release = %v, %v", r, err)
		}
		if got := getVolume(t, c, v.GetVolumeId()); got.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || got.GetBoundWorkspaceId() != "" {
			t.Errorf("released volume %v", got)
		}
		b := createBoundWS(t, c, "ws-b", nil)
		stopped(t, c, "stop-b", b)
		if _, err := c.Workspace.UpdateWorkspaceVolumeBinding(t.Context(), connect.NewRequest(&ctrlv1.UpdateWorkspaceVolumeBindingRequest{
			Metadata: md("bind-b"), WorkspaceId: b.GetWorkspaceId(), ExpectedRevision: 1,
			VolumeBinding: &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: v.GetVolumeId(),
				MountPath: "/mnt/shared", DeleteWithWorkspace: true}})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Workspace.StartWorkspace(t.Context(), connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("start-b"),
			WorkspaceId: b.GetWorkspaceId(), ExpectedExpirationRevision: 1})); err != nil {
			t.Fatal(err)
		}
		waitState(t, c, b.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
		if m, ok := rt.Mount(b.GetWorkspaceId()); !ok || m.VolumeID != v.GetVolumeId() || m.MountPath != "/mnt/shared" {
			t.Errorf("mount of b: %+v, %v", m, ok)
		}
		// Resize (a mounted Volume: the fake node grows it).
		rs, err := c.Volume.ResizeVolume(t.Context(), connect.NewRequest(&ctrlv1.ResizeVolumeRequest{Metadata: md("grow"), VolumeId: v.GetVolumeId(),
			CapacityBytes: 128 << 20}))
		if err == nil {
			if rs.Msg.GetVolume().GetCapacityBytes() != 128<<20 || rs.Msg.GetCommand().GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_COMPLETED {
				t.Errorf("resize = %v", rs.Msg)
			}
		} else if d := wantErr(t, err, connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED, true); d.GetObservedVolume().GetCapacityBytes() != 64<<20 {
			t.Errorf("a refused resize changed the capacity: %v", d.GetObservedVolume())
		}
		cmd, err := c.Volume.GetVolumeCommand(t.Context(), connect.NewRequest(&ctrlv1.GetVolumeCommandRequest{CommandId: "grow"}))
		if err != nil || cmd.Msg.GetCommand().GetKind() != ctrlv1.VolumeCommandKind_VOLUME_COMMAND_KIND_RESIZE {
			t.Errorf("GetVolumeCommand(grow) = %v, %v", cmd, err)
		}
		// DeleteWorkspace with delete_with_workspace deletes the Volume.
		if _, err := c.Workspace.DeleteWorkspace(t.Context(), connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("del-b"),
			WorkspaceId: b.GetWorkspaceId(), ExpectedExpirationRevision: 1})); err != nil {
			t.Fatal(err)
		}
		waitVolume(t, c, v.GetVolumeId(), ctrlv1.VolumeState_VOLUME_STATE_DELETED)
		if st := rt.VolumeStatus(v.GetVolumeId()); st.Exists {
			t.Errorf("the node still holds %+v", st)
		}
		// Without it, the Volume is released.
		v2 := createVolume(t, c, "vol2", 32<<20)
		w := createBoundWS(t, c, "ws-c", &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: v2.GetVolumeId(), MountPath: "/v"})
		if _, err := c.Workspace.DeleteWorkspace(t.Context(), connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("del-c"),
			WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: 1})); err != nil {
			t.Fatal(err)
		}
		if got := waitVolume(t, c, v2.GetVolumeId(), ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE); got.GetBoundWorkspaceId() != "" {
			t.Errorf("volume of a deleted workspace: %v", got)
		}
		// NEW: created with the Workspace on its node.
		n := createBoundWS(t, c, "ws-new", &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW,
			NewVolumeCapacityBytes: 48 << 20, MountPath: "/new", DeleteWithWorkspace: true})
		nv := waitVolume(t, c, n.GetVolumeBinding().GetVolumeId(), ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE)
		if nv.GetBoundWorkspaceId() != n.GetWorkspaceId() || nv.GetPlacement().GetNodeId() != "node-1" || nv.GetCapacityBytes() != 48<<20 {
			t.Errorf("NEW volume %v", nv)
		}
		if m, ok := rt.Mount(n.GetWorkspaceId()); !ok || m.VolumeID != nv.GetVolumeId() {
			t.Errorf("mount of the NEW volume: %+v, %v", m, ok)
		}
		list, err := c.Volume.ListVolumes(t.Context(), connect.NewRequest(&ctrlv1.ListVolumesRequest{IncludeDeleted: true}))
		if err != nil || len(list.Msg.GetVolumes()) != 3 {
			t.Errorf("ListVolumes(include_deleted) = %v, %v", list, err)
		}
		list, err = c.Volume.ListVolumes(t.Context(), connect.NewRequest(&ctrlv1.ListVolumesRequest{}))
		if err != nil || len(list.Msg.GetVolumes()) != 2 {
			t.Errorf("ListVolumes = %v, %v", list, err)
		}
	})
}
