package capability

import (
	"slices"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// TestNetworkPolicyField: CreateWorkspace's network_policy needs
// workspace.network_policy exactly when the policy says more than no
// network; the revision never matters.
func TestNetworkPolicyField(t *testing.T) {
	const proc = "/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace"
	dst := []*ctrlv1.Destination{{Cidr: "203.0.113.0/24"}}
	for _, tc := range []struct {
		name string
		p    *ctrlv1.NetworkPolicy
		want bool
	}{
		{"none given", nil, false},
		{"empty", &ctrlv1.NetworkPolicy{}, false},
		{"NONE with a revision", &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE, Revision: 3}, false},
		{"empty dns", &ctrlv1.NetworkPolicy{Dns: &ctrlv1.DnsConfig{}}, false},
		{"public", &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET}, true},
		{"unknown mode", &ctrlv1.NetworkPolicy{Mode: 9}, true},
		{"allow", &ctrlv1.NetworkPolicy{Allow: dst}, true},
		{"deny", &ctrlv1.NetworkPolicy{Deny: dst}, true},
		{"egresses", &ctrlv1.NetworkPolicy{Egresses: []*ctrlv1.EgressRoute{{EgressId: "eg-x", Destinations: dst}}}, true},
		{"resolver", &ctrlv1.NetworkPolicy{Dns: &ctrlv1.DnsConfig{ResolverId: "rs-x"}}, true},
		{"via egress", &ctrlv1.NetworkPolicy{Dns: &ctrlv1.DnsConfig{ViaEgressId: "eg-x"}}, true},
	} {
		req := &ctrlv1.CreateWorkspaceRequest{NetworkPolicy: tc.p}
		got := slices.Contains(FieldNeeds(proc, req), Need{Field: "network_policy", Capability: WorkspaceNetworkPolicy})
		if got != tc.want {
			t.Errorf("%s: FieldNeeds names network_policy = %v, want %v", tc.name, got, tc.want)
		}
	}
}
