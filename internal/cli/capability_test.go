package cli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
)

// TestFieldCapabilitySendsNothing: a flag whose request field needs a
// capability the server does not list exits 14 before the write is sent,
// naming the flag, the field and the capability.
func TestFieldCapabilitySendsNothing(t *testing.T) {
	t.Parallel()
	create := []string{"workspace", "create", "--memory-mib", "256", "--cpu-millis", "500"}
	tests := []struct {
		name string
		caps []string
		args []string
		want []string // in stderr
	}{
		{
			name: "network mode",
			caps: []string{capability.WorkspaceCreate},
			args: args(create, "--network-mode", "public-internet"),
			want: []string{`error: --network-mode needs the capability "workspace.network_policy" (field network_policy of WorkspaceService/CreateWorkspace), which the server does not offer; nothing was sent`},
		},
		{
			name: "expiration",
			caps: []string{capability.WorkspaceCreate, capability.WorkspaceNetworkPolicy},
			args: args(create, "--expiration", "stop", "--expire-in", "1h"),
			want: []string{`--expiration and --expire-in need the capability "workspace.expiration" (field expiration of`},
		},
		{
			name: "bound volume",
			caps: []string{capability.WorkspaceCreate},
			args: args(create, "--volume", "vol-1", "--mount-path", "/data"),
			want: []string{`--volume needs the capability "workspace.volume_binding"`},
		},
		{
			name: "new volume without volume.create",
			caps: []string{capability.WorkspaceCreate, capability.WorkspaceVolumeBinding},
			args: args(create, "--new-volume-mib", "64", "--mount-path", "/data"),
			want: []string{`--new-volume-mib needs the capability "volume.create" (field volume_binding.new_volume_capacity_bytes`},
		},
		{
			name: "network policy file",
			caps: []string{capability.WorkspaceCreate},
			args: args(create, "--network-policy-file", "testdata/policy_public.json"),
			want: []string{`--network-policy-file needs the capability "workspace.network_policy"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, tt.caps...)
			r := kibo(t, args(f.conn(), tt.args...)...).want(t, ExitUnavailable)
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
			if !strings.Contains(r.stderr, "nothing was sent") || printedID.MatchString(r.stderr) {
				t.Errorf("stderr:\n%s", r.stderr)
			}
			if diff := cmp.Diff([]string{ctrlv1connect.ServerInfoServiceGetServerInfoProcedure}, f.requests()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFieldCapabilityOffered: the same flags are sent when the server lists
// what they need, and a network mode of none needs nothing more.
func TestFieldCapabilityOffered(t *testing.T) {
	t.Parallel()
	create := []string{"workspace", "create", "--memory-mib", "256", "--cpu-millis", "500"}
	f := newFake(t, capability.WorkspaceCreate)
	kibo(t, args(f.conn(), args(create, "--network-mode", "none")...)...).want(t, ExitOK)
	f = newFake(t, capability.WorkspaceCreate, capability.WorkspaceNetworkPolicy, capability.WorkspaceExpiration)
	kibo(t, args(f.conn(), args(create, "--network-mode", "public-internet", "--expiration", "delete", "--expire-in", "1h")...)...).want(t, ExitOK)
	got := f.ws.requests()
	if len(got) != 1 {
		t.Fatalf("CreateWorkspace received %d times, want 1", len(got))
	}
	req := got[0].(*ctrlv1.CreateWorkspaceRequest)
	if req.GetNetworkPolicy().GetMode() != ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET || req.GetExpiration().GetPolicy() != ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE {
		t.Errorf("CreateWorkspace request = %v", req)
	}
}

// TestHelpExamplesNeedNoMoreThanTheDevServer: the examples of workspace
// create use no flag whose capability a deployment without the optional
// workspace features (scripts/dev.sh) refuses.
func TestHelpExamplesNeedNoMoreThanTheDevServer(t *testing.T) {
	t.Parallel()
	for _, c := range commands() {
		if c.CommandPath() != "kibo workspace create" {
			continue
		}
		for _, flag := range []string{"--network-mode", "--network-policy-file", "--expiration", "--expire-at", "--expire-in", "--volume", "--new-volume-mib"} {
			if strings.Contains(c.Example, flag) {
				t.Errorf("kibo workspace create --help shows %s, which the dev server refuses:\n%s", flag, c.Example)
			}
		}
		return
	}
	t.Fatal("no kibo workspace create")
}
