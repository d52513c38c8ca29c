package kibotos_test

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
)

func (f *fakeCtrl) UpdateWorkspaceMemory(ctx context.Context, r *connect.Request[ctrlv1.UpdateWorkspaceMemoryRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceMemoryResponse], error) {
	return answer[ctrlv1.UpdateWorkspaceMemoryResponse](ctx, f, "UpdateWorkspaceMemory", r.Msg)
}

func (f *fakeCtrl) UpdateWorkspaceCpu(ctx context.Context, r *connect.Request[ctrlv1.UpdateWorkspaceCpuRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceCpuResponse], error) {
	return answer[ctrlv1.UpdateWorkspaceCpuResponse](ctx, f, "UpdateWorkspaceCpu", r.Msg)
}

func (f *fakeCtrl) ResizeWorkspaceWritableLayer(ctx context.Context, r *connect.Request[ctrlv1.ResizeWorkspaceWritableLayerRequest]) (*connect.Response[ctrlv1.ResizeWorkspaceWritableLayerResponse], error) {
	return answer[ctrlv1.ResizeWorkspaceWritableLayerResponse](ctx, f, "ResizeWorkspaceWritableLayer", r.Msg)
}

func (f *fakeCtrl) UpdateWorkspaceExpiration(ctx context.Context, r *connect.Request[ctrlv1.UpdateWorkspaceExpirationRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceExpirationResponse], error) {
	return answer[ctrlv1.UpdateWorkspaceExpirationResponse](ctx, f, "UpdateWorkspaceExpiration", r.Msg)
}

func (f *fakeCtrl) UpdateWorkspaceVolumeBinding(ctx context.Context, r *connect.Request[ctrlv1.UpdateWorkspaceVolumeBindingRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceVolumeBindingResponse], error) {
	return answer[ctrlv1.UpdateWorkspaceVolumeBindingResponse](ctx, f, "UpdateWorkspaceVolumeBinding", r.Msg)
}

// TestWorkspaceConfiguration: each configuration write sends its request
// with the expected revision given, and its answer becomes Last().
func TestWorkspaceConfiguration(t *testing.T) {
	stopped := &ctrlv1.Workspace{WorkspaceId: fakeWorkspaceID, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, ResourcesRevision: 2}
	f := newFakeCtrl(capability.WorkspaceResources, capability.WorkspaceWritableLayerGrow, capability.WorkspaceExpiration, capability.WorkspaceVolumeBinding)
	f.on("UpdateWorkspaceMemory", func(context.Context, int, proto.Message) (proto.Message, error) {
		return &ctrlv1.UpdateWorkspaceMemoryResponse{Workspace: stopped}, nil
	}).on("UpdateWorkspaceCpu", func(context.Context, int, proto.Message) (proto.Message, error) {
		return &ctrlv1.UpdateWorkspaceCpuResponse{Workspace: stopped}, nil
	}).on("ResizeWorkspaceWritableLayer", func(_ context.Context, n int, _ proto.Message) (proto.Message, error) {
		if n == 1 {
			return nil, timedOut() // resent with the same command ID
		}
		return &ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: stopped}, nil
	}).on("UpdateWorkspaceExpiration", func(context.Context, int, proto.Message) (proto.Message, error) {
		return &ctrlv1.UpdateWorkspaceExpirationResponse{Workspace: stopped}, nil
	}).on("UpdateWorkspaceVolumeBinding", func(context.Context, int, proto.Message) (proto.Message, error) {
		return &ctrlv1.UpdateWorkspaceVolumeBindingResponse{Workspace: stopped}, nil
	})
	c := clientOf(t, f)
	w := c.Workspaces().Handle(fakeWorkspaceID)
	ctx := context.Background()
	bind := &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: "vol-abcdefghijklmnopqrst", MountPath: "/data"}
	for name, call := range map[string]func() error{
		"memory":     func() error { return w.SetMemory(ctx, 1024, 1) },
		"cpu":        func() error { return w.SetCPU(ctx, 2000, 2) },
		"resize":     func() error { return w.ResizeWritableLayer(ctx, 2<<30) },
		"expiration": func() error { return w.SetExpiration(ctx, nil, 3) },
		"binding":    func() error { return w.BindVolume(ctx, bind, 4) },
	} {
		if err := call(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	want := map[string][]proto.Message{
		"UpdateWorkspaceMemory": {&ctrlv1.UpdateWorkspaceMemoryRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 1, MemoryMib: 1024}},
		"UpdateWorkspaceCpu":    {&ctrlv1.UpdateWorkspaceCpuRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 2, CpuMillis: 2000}},
		"ResizeWorkspaceWritableLayer": {
			&ctrlv1.ResizeWorkspaceWritableLayerRequest{WorkspaceId: fakeWorkspaceID, CapacityBytes: 2 << 30},
			&ctrlv1.ResizeWorkspaceWritableLayerRequest{WorkspaceId: fakeWorkspaceID, CapacityBytes: 2 << 30},
		},
		"UpdateWorkspaceExpiration":    {&ctrlv1.UpdateWorkspaceExpirationRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 3}},
		"UpdateWorkspaceVolumeBinding": {&ctrlv1.UpdateWorkspaceVolumeBindingRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 4, VolumeBinding: bind}},
	}
	for method, reqs := range want {
		got := f.requests(method)
		if diff := cmp.Diff(reqs, got, protocmp.Transform(), protocmp.IgnoreFields(&ctrlv1.UpdateWorkspaceMemoryRequest{}, "metadata"),
			protocmp.IgnoreFields(&ctrlv1.UpdateWorkspaceCpuRequest{}, "metadata"), protocmp.IgnoreFields(&ctrlv1.ResizeWorkspaceWritableLayerRequest{}, "metadata"),
			protocmp.IgnoreFields(&ctrlv1.UpdateWorkspaceExpirationRequest{}, "metadata"), protocmp.IgnoreFields(&ctrlv1.UpdateWorkspaceVolumeBindingRequest{}, "metadata")); diff != "" {
			t.Errorf("%s (-want +got):\n%s", method, diff)
		}
	}
	resizes := f.requests("ResizeWorkspaceWritableLayer")
	if a, b := resizes[0].(*ctrlv1.ResizeWorkspaceWritableLayerRequest).GetMetadata().GetCommandId(), resizes[1].(*ctrlv1.ResizeWorkspaceWritableLayerRequest).GetMetadata().GetCommandId(); a == "" || a != b {
		t.Errorf("the resize was resent with command ID %q after %q; want the same", b, a)
	}
	if got := w.Last().GetState(); got != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Errorf("Last() state %v", got)
	}
}

// TestWorkspaceConfigurationNeedsItsCapability: a server that does not
// list workspace.resources gets nothing.
func TestWorkspaceConfigurationNeedsItsCapability(t *testing.T) {
	f := newFakeCtrl(capability.WorkspaceCreate)
	c := clientOf(t, f)
	err := c.Workspaces().Handle(fakeWorkspaceID).SetMemory(context.Background(), 1024, 1)
	var mc *kibotos.MissingCapabilityError
	if !errors.As(err, &mc) {
		t.Fatalf("SetMemory without the capability: %v", err)
	}
	if n := f.count("UpdateWorkspaceMemory"); n != 0 {
		t.Errorf("sent %d requests", n)
	}
}
