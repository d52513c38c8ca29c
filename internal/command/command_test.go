package command

import (
	"bytes"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

func TestFingerprint(t *testing.T) {
	mk := func(id string, rev uint64, labels map[string]string) *ctrlv1.UpdateWorkspaceNetworkPolicyRequest {
		return &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: id}, WorkspaceId: "ws-1",
			NetworkPolicy: &ctrlv1.NetworkPolicy{Revision: rev, Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET},
		}
	}
	ignoreRev := func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { r.GetNetworkPolicy().Revision = 0 }
	fp := func(m string, r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest, n func(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest)) []byte {
		b, err := Fingerprint(m, r, n)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	base := fp("m", mk("a", 1, nil), ignoreRev)
	if !bytes.Equal(base, fp("m", mk("b", 1, nil), ignoreRev)) {
		t.Error("metadata changes the fingerprint")
	}
	if !bytes.Equal(base, fp("m", mk("a", 7, nil), ignoreRev)) {
		t.Error("network_policy.revision changes the fingerprint although it is ignored")
	}
	if bytes.Equal(base, fp("m", mk("a", 7, nil), nil)) {
		t.Error("without normalization the revision must count")
	}
	if bytes.Equal(base, fp("other", mk("a", 1, nil), ignoreRev)) {
		t.Error("the method does not change the fingerprint")
	}
	// The request itself is left alone.
	r := mk("a", 5, nil)
	fp("m", r, ignoreRev)
	if r.GetMetadata().GetCommandId() != "a" || r.GetNetworkPolicy().GetRevision() != 5 {
		t.Error("Fingerprint modified its input")
	}
	// Map order does not matter.
	a := &ctrlv1.CreateEgressRequest{Labels: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}}
	b := &ctrlv1.CreateEgressRequest{Labels: map[string]string{"d": "4", "c": "3", "b": "2", "a": "1"}}
	fa, _ := Fingerprint("m", a, nil)
	for range 20 {
		fb, _ := Fingerprint("m", b, nil)
		if !bytes.Equal(fa, fb) {
			t.Fatal("map order changes the fingerprint")
		}
	}
}
