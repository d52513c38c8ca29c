package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
)

func (f *fakeWorkspaces) UpdateWorkspaceMemory(_ context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceMemoryRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceMemoryResponse], error) {
	if err := f.record("UpdateWorkspaceMemory", req.Msg); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceMemoryResponse{Workspace: f.workspace()}), nil
}

func (f *fakeWorkspaces) UpdateWorkspaceCpu(_ context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceCpuRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceCpuResponse], error) {
	if err := f.record("UpdateWorkspaceCpu", req.Msg); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceCpuResponse{Workspace: f.workspace()}), nil
}

func (f *fakeWorkspaces) ResizeWorkspaceWritableLayer(_ context.Context, req *connect.Request[ctrlv1.ResizeWorkspaceWritableLayerRequest]) (*connect.Response[ctrlv1.ResizeWorkspaceWritableLayerResponse], error) {
	if err := f.record("ResizeWorkspaceWritableLayer", req.Msg); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: f.workspace(),
		Command: f.command(req.Msg.GetMetadata().GetCommandId(), completed)}), nil
}

func (f *fakeWorkspaces) UpdateWorkspaceExpiration(_ context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceExpirationRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceExpirationResponse], error) {
	if err := f.record("UpdateWorkspaceExpiration", req.Msg); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceExpirationResponse{Workspace: f.workspace()}), nil
}

func (f *fakeWorkspaces) UpdateWorkspaceVolumeBinding(_ context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceVolumeBindingRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceVolumeBindingResponse], error) {
	if err := f.record("UpdateWorkspaceVolumeBinding", req.Msg); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceVolumeBindingResponse{Workspace: f.workspace()}), nil
}

// configured is the Workspace the fake returns to the configuration
// commands: each revision differs, so a test sees which one was read.
func configured() *ctrlv1.Workspace {
	return &ctrlv1.Workspace{
		WorkspaceId: fakeWorkspaceID, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED,
		ResourcesRevision: 11, BindingRevision: 12, Expiration: &ctrlv1.Expiration{Revision: 13},
	}
}

// TestConfigCommands: what each configuration command sends, and which
// revision "current" reads (once, before the first attempt).
func TestConfigCommands(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		caps []string
		args []string
		gets int
		want proto.Message // without metadata
	}{
		{
			name: "set-memory with a revision",
			caps: []string{capability.WorkspaceResources},
			args: []string{"workspace", "set-memory", fakeWorkspaceID, "--memory-mib", "2048", "--expected-revision", "4"},
			want: &ctrlv1.UpdateWorkspaceMemoryRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 4, MemoryMib: 2048},
		},
		{
			name: "set-memory with current reads resources_revision",
			caps: []string{capability.WorkspaceResources, capability.WorkspaceCreate},
			args: []string{"workspace", "set-memory", fakeWorkspaceID, "--memory-mib", "512", "--expected-revision", "current"},
			gets: 1,
			want: &ctrlv1.UpdateWorkspaceMemoryRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 11, MemoryMib: 512},
		},
		{
			name: "set-cpu with current reads resources_revision",
			caps: []string{capability.WorkspaceResources, capability.WorkspaceCreate},
			args: []string{"workspace", "set-cpu", fakeWorkspaceID, "--cpu-millis", "1500", "--expected-revision", "current"},
			gets: 1,
			want: &ctrlv1.UpdateWorkspaceCpuRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 11, CpuMillis: 1500},
		},
		{
			name: "resize sends bytes and no revision",
			caps: []string{capability.WorkspaceWritableLayerGrow},
			args: []string{"workspace", "resize", fakeWorkspaceID, "--capacity-mib", "4096"},
			want: &ctrlv1.ResizeWorkspaceWritableLayerRequest{WorkspaceId: fakeWorkspaceID, CapacityBytes: 4096 << 20},
		},
		{
			name: "set-expiration with current reads expiration.revision",
			caps: []string{capability.WorkspaceExpiration, capability.WorkspaceCreate},
			args: []string{"workspace", "set-expiration", fakeWorkspaceID, "--expiration", "delete", "--expire-at", "2031-01-02T03:04:05Z", "--expected-revision", "current"},
			gets: 1,
			want: &ctrlv1.UpdateWorkspaceExpirationRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 13,
				Expiration: &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, Deadline: mustTimestamp(t, "2031-01-02T03:04:05Z")}},
		},
		{
			name: "set-expiration --clear sends no expiration",
			caps: []string{capability.WorkspaceExpiration},
			args: []string{"workspace", "set-expiration", fakeWorkspaceID, "--clear", "--expected-revision", "9"},
			want: &ctrlv1.UpdateWorkspaceExpirationRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 9},
		},
		{
			name: "bind-volume binds the complete target",
			caps: []string{capability.WorkspaceVolumeBinding, capability.WorkspaceCreate},
			args: []string{"workspace", "bind-volume", fakeWorkspaceID, "--volume", "vol-abcdefghijklmnopqrst", "--mount-path", "/data", "--delete-with-workspace", "--expected-revision", "current"},
			gets: 1,
			want: &ctrlv1.UpdateWorkspaceVolumeBindingRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 12,
				VolumeBinding: &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: "vol-abcdefghijklmnopqrst", MountPath: "/data", DeleteWithWorkspace: true}},
		},
		{
			name: "bind-volume --none releases",
			caps: []string{capability.WorkspaceVolumeBinding},
			args: []string{"workspace", "bind-volume", fakeWorkspaceID, "--none", "--expected-revision", "3"},
			want: &ctrlv1.UpdateWorkspaceVolumeBindingRequest{WorkspaceId: fakeWorkspaceID, ExpectedRevision: 3,
				VolumeBinding: &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, tt.caps...)
			f.ws.current = configured()
			kibo(t, args(f.conn(), tt.args...)...).want(t, ExitOK)
			if n := f.count(getWorkspacePath); n != tt.gets {
				t.Errorf("GetWorkspace called %d times, want %d", n, tt.gets)
			}
			got := f.ws.requests()
			if len(got) != 1 {
				t.Fatalf("got %d requests, want 1", len(got))
			}
			if diff := cmp.Diff(tt.want, got[0], protocmp.Transform(), protocmp.IgnoreFields(tt.want, "metadata")); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
		})
	}
}

// TestConfigCommandsRefuse: a missing capability exits 14 and a bad
// combination of flags exits 2; neither sends the write.
func TestConfigCommandsRefuse(t *testing.T) {
	t.Parallel()
	f := newFake(t, capability.WorkspaceCreate)
	for _, a := range [][]string{
		{"workspace", "set-memory", fakeWorkspaceID, "--memory-mib", "1", "--expected-revision", "1"},
		{"workspace", "resize", fakeWorkspaceID, "--capacity-mib", "1"},
		{"workspace", "set-expiration", fakeWorkspaceID, "--clear", "--expected-revision", "1"},
		{"workspace", "bind-volume", fakeWorkspaceID, "--none", "--expected-revision", "1"},
		{"volume", "list"},
	} {
		kibo(t, args(f.conn(), a...)...).want(t, 14)
	}
	g := newFake(t, capability.WorkspaceResources, capability.WorkspaceExpiration, capability.WorkspaceVolumeBinding, capability.WorkspaceWritableLayerGrow)
	for _, a := range [][]string{
		{"workspace", "set-memory", fakeWorkspaceID, "--memory-mib", "1"},
		{"workspace", "set-cpu", fakeWorkspaceID, "--expected-revision", "1"},
		{"workspace", "resize", fakeWorkspaceID},
		{"workspace", "set-expiration", fakeWorkspaceID, "--expected-revision", "1"},
		{"workspace", "set-expiration", fakeWorkspaceID, "--clear", "--expire-in", "1h", "--expected-revision", "1"},
		{"workspace", "set-expiration", fakeWorkspaceID, "--expiration", "stop", "--expected-revision", "1"},
		{"workspace", "bind-volume", fakeWorkspaceID, "--none", "--volume", "vol-abcdefghijklmnopqrst", "--expected-revision", "1"},
		{"workspace", "bind-volume", fakeWorkspaceID, "--none", "--mount-path", "/x", "--expected-revision", "1"},
		{"workspace", "bind-volume", fakeWorkspaceID, "--expected-revision", "1"},
	} {
		if r := kibo(t, args(g.conn(), a...)...); r.code != ExitUsage {
			t.Errorf("kibo %s: exit %d, want 2\n%s", strings.Join(a, " "), r.code, r.stderr)
		}
	}
	if got := append(f.ws.requests(), g.ws.requests()...); len(got) != 0 {
		t.Errorf("refused commands sent %v", got)
	}
}

func mustTimestamp(t *testing.T, s string) *timestamppb.Timestamp {
	t.Helper()
	tm, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return timestamppb.New(tm)
}
