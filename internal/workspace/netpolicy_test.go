package workspace_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
	"github.com/kibotos/kibotos/internal/workspace"
)

const (
	public     = ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET
	egTCP      = "eg-tcponlyaaaaaaaaaaaaa"
	egUDP      = "eg-udpenabledaaaaaaaaa"
	egGone     = "eg-deletedaaaaaaaaaaaaa"
	egNever    = "eg-neverexistedaaaaaaa"
	rsUDP      = "rs-udpaaaaaaaaaaaaaaaaa"
	rsTCP      = "rs-tcpaaaaaaaaaaaaaaaaa"
	rsNever    = "rs-neverexistedaaaaaaa"
	policyProc = "UpdateNetworkPolicy"
)

func u32(v uint32) *uint32 { return &v }

// addCatalog stores the Egresses and Resolvers the tests reference, as
// EgressService and ResolverService do, and deletes egGone again.
func addCatalog(t *testing.T, st store.Store) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	put := func(tx store.Tx, kind store.ResourceKind, id string, spec proto.Message) error {
		b, err := proto.Marshal(spec)
		if err != nil {
			return err
		}
		return tx.InsertResource(t.Context(), &store.Resource{Kind: kind, ID: id, CreatedAt: now, UpdatedAt: now, Revision: 1,
			Spec: b, Labels: map[string]string{}, LabelsRevision: 1, Annotations: map[string]string{}, AnnotationsRevision: 1})
	}
	socks := func(udp bool) *ctrlv1.EgressSpec {
		return &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "198.51.100.7:1080"}}, UdpEnabled: udp}
	}
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		return errors.Join(
			put(tx, store.KindEgress, egTCP, socks(false)),
			put(tx, store.KindEgress, egUDP, socks(true)),
			put(tx, store.KindEgress, egGone, socks(true)),
			put(tx, store.KindResolver, rsUDP, &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "198.51.100.53:53"}}}),
			put(tx, store.KindResolver, rsTCP, &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: "198.51.100.53:53"}}}),
			tx.DeleteResource(t.Context(), store.KindEgress, egGone),
		)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// edit changes a stored Workspace as the reconciler would, in one
// transaction.
func edit(t *testing.T, st store.Store, id string, f func(w *store.Workspace, pub *ctrlv1.Workspace)) {
	t.Helper()
	err := st.InTx(context.Background(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(context.Background(), id)
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		f(w, pub)
		if err := workspace.Save(w, pub, time.Now().UTC().Truncate(time.Microsecond)); err != nil {
			return err
		}
		return tx.UpdateWorkspace(context.Background(), w)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// running plays a node that started the Workspace with the current DNS
// configuration (version 1).
func running(t *testing.T, st store.Store, id string) {
	t.Helper()
	makeAvailable(t, st, id)
	edit(t, st, id, func(w *store.Workspace, _ *ctrlv1.Workspace) { w.ExecDNSVersion = 1 })
}

// stopped plays a node that stopped the Workspace.
func stopped(t *testing.T, st store.Store, id string) {
	t.Helper()
	edit(t, st, id, func(w *store.Workspace, pub *ctrlv1.Workspace) {
		pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, false
		w.Power, w.ObservedGeneration, w.ObservedState, w.CommandID, w.NodeID = store.PowerStopped, w.Generation, store.ExecStopped, "", "node-1"
	})
}

func row(t *testing.T, st store.Store, id string) (*store.Workspace, *ctrlv1.Workspace) {
	t.Helper()
	var (
		w   *store.Workspace
		pub *ctrlv1.Workspace
	)
	err := st.View(t.Context(), func(tx store.Tx) error {
		var err error
		if w, err = tx.GetWorkspace(t.Context(), id); err != nil {
			return err
		}
		pub, err = workspace.Decode(w)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return w, pub
}

func refCount(t *testing.T, st store.Store, kind store.RefKind, target string) int {
	t.Helper()
	var n int
	if err := st.View(t.Context(), func(tx store.Tx) error {
		var err error
		n, err = tx.CountReferences(t.Context(), kind, target)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func updateReq(cid, ws string, expected uint64, p *ctrlv1.NetworkPolicy, drain *uint32) *ctrlv1.UpdateWorkspaceNetworkPolicyRequest {
	return &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: cid}, WorkspaceId: ws,
		ExpectedRevision: expected, NetworkPolicy: p, DrainSeconds: drain}
}

func webPolicy() *ctrlv1.NetworkPolicy {
	return &ctrlv1.NetworkPolicy{Mode: public, Allow: []*ctrlv1.Destination{{Cidr: "0.0.0.0/0", PortMin: 443, PortMax: 443}}}
}

// unchanged fails unless the Workspace's row is as before.
func unchanged(t *testing.T, st store.Store, id string, w0 *store.Workspace) {
	t.Helper()
	w, _ := row(t, st, id)
	if w.Generation != w0.Generation || w.CommandID != w0.CommandID || w.PolicyDrainSeconds != w0.PolicyDrainSeconds || string(w.Doc) != string(w0.Doc) {
		t.Errorf("the workspace changed: generation %d→%d, command %q→%q, drain %d→%d, document changed %v",
			w0.Generation, w.Generation, w0.CommandID, w.CommandID, w0.PolicyDrainSeconds, w.PolicyDrainSeconds, string(w.Doc) != string(w0.Doc))
	}
}

func recorded(t *testing.T, s *workspace.Service, cid string) bool {
	t.Helper()
	_, err := s.GetCommand(t.Context(), &ctrlv1.GetWorkspaceCommandRequest{CommandId: cid})
	return fault.KindOf(err) != fault.KindNotFound
}

// TestUpdateNetworkPolicyInvalid: each malformed input is invalid_argument
// naming its field, records nothing (the same command ID is free) and
// leaves the Workspace as it was.
func TestUpdateNetworkPolicyInvalid(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	ws := create(t, s, "inv-create").GetWorkspaceId()
	running(t, st, ws)
	w0, _ := row(t, st, ws)
	for _, tc := range []struct {
		name  string
		req   *ctrlv1.UpdateWorkspaceNetworkPolicyRequest
		field string
	}{
		{"no workspace", updateReq("inv", "", 0, webPolicy(), nil), "workspace_id"},
		{"host bits", updateReq("inv", ws, 0, &ctrlv1.NetworkPolicy{Mode: public, Deny: []*ctrlv1.Destination{{Cidr: "203.0.113.9/24"}}}, nil), "network_policy.deny[0].cidr"},
		{"ports reversed", updateReq("inv", ws, 0, &ctrlv1.NetworkPolicy{Mode: public, Allow: []*ctrlv1.Destination{{Cidr: "0.0.0.0/0", PortMin: 9, PortMax: 8}}}, nil), "network_policy.allow[0].port_max"},
		{"unknown mode", updateReq("inv", ws, 0, &ctrlv1.NetworkPolicy{Mode: 7}, nil), "network_policy.mode"},
		{"via without resolver", updateReq("inv", ws, 0, &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ViaEgressId: egUDP}}, nil), "network_policy.dns.via_egress_id"},
		{"route without egress", updateReq("inv", ws, 0, &ctrlv1.NetworkPolicy{Mode: public, Egresses: []*ctrlv1.EgressRoute{{Destinations: []*ctrlv1.Destination{{Cidr: "::/0"}}}}}, nil), "network_policy.egresses[0].egress_id"},
		{"drain too long", updateReq("inv", ws, 0, webPolicy(), u32(3601)), "drain_seconds"},
		{"bad command ID", updateReq("-bad", ws, 0, webPolicy(), nil), "metadata.command_id"},
	} {
		_, err := s.UpdateNetworkPolicy(t.Context(), tc.req)
		wantFault(t, tc.name, err, fault.KindInvalidArgument, tc.field)
		if fe, ok := fault.As(err); ok && fe.Settled {
			t.Errorf("%s: the refusal is settled", tc.name)
		}
		unchanged(t, st, ws, w0)
	}
	if recorded(t, s, "inv") {
		t.Errorf("an invalid request recorded its command ID")
	}
}

// TestUpdateNetworkPolicyCAS: a non-zero expected_revision that is not the
// current one is aborted, even for equal content, and changes nothing;
// zero skips the check.
func TestUpdateNetworkPolicyCAS(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	ws := create(t, s, "cas-create").GetWorkspaceId()
	stopped(t, st, ws)
	w0, _ := row(t, st, ws)
	for name, p := range map[string]*ctrlv1.NetworkPolicy{"equal": {}, "different": webPolicy()} {
		_, err := s.UpdateNetworkPolicy(t.Context(), updateReq("cas-"+name, ws, 2, p, nil))
		wantFault(t, "CAS("+name+")", err, fault.KindAborted, "expected_revision")
		fe, _ := fault.As(err)
		if fe.Reason != fault.ReasonRevisionMismatch || fe.ObservedWorkspace.GetNetworkPolicy().GetRevision() != 1 || !fe.Settled {
			t.Errorf("CAS(%s) = %+v, want REVISION_MISMATCH, settled, observing revision 1", name, fe)
		}
		unchanged(t, st, ws, w0)
	}
	res, err := s.UpdateNetworkPolicy(t.Context(), updateReq("cas-ok", ws, 1, webPolicy(), nil))
	if err != nil || res.GetWorkspace().GetNetworkPolicy().GetRevision() != 2 {
		t.Fatalf("CAS at the current revision = %v, %v; want revision 2", res, err)
	}
	res, err = s.UpdateNetworkPolicy(t.Context(), updateReq("cas-zero", ws, 0, &ctrlv1.NetworkPolicy{}, nil))
	if err != nil || res.GetWorkspace().GetNetworkPolicy().GetRevision() != 3 {
		t.Fatalf("expected_revision 0 = %v, %v; want revision 3", res, err)
	}
}

// TestUpdateNetworkPolicyEqual: content equal to the current policy
// (whatever its revision, spelling or UNSPECIFIED mode says) succeeds at
// once with the same revision, opens no command and asks nothing of the
// node, even on an AVAILABLE Workspace.
func TestUpdateNetworkPolicyEqual(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	s.WaitBound = time.Hour // an equal update must not wait at all
	ws := create(t, s, "eq-create").GetWorkspaceId()
	running(t, st, ws)
	w0, _ := row(t, st, ws)
	for i, p := range []*ctrlv1.NetworkPolicy{nil, {}, {Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE, Revision: 42}, {Dns: &ctrlv1.DnsConfig{}}} {
		cid := "eq-" + string(rune('a'+i))
		res, err := s.UpdateNetworkPolicy(t.Context(), updateReq(cid, ws, 1, p, u32(0)))
		if err != nil || res.GetCommand() != nil || res.GetWorkspace().GetNetworkPolicy().GetRevision() != 1 {
			t.Fatalf("equal update %v = %v, %v; want revision 1 and no command", p, res, err)
		}
		unchanged(t, st, ws, w0)
		if recorded(t, s, cid) {
			t.Errorf("GetWorkspaceCommand(%s) finds a command; an equal update opens none", cid)
		}
	}
	// A different spelling of the same CIDR is the same content.
	stopped(t, st, ws)
	p := &ctrlv1.NetworkPolicy{Mode: public, Deny: []*ctrlv1.Destination{{Cidr: "2001:DB8::/32"}}}
	if _, err := s.UpdateNetworkPolicy(t.Context(), updateReq("eq-set", ws, 0, p, nil)); err != nil {
		t.Fatal(err)
	}
	_, pub := row(t, st, ws)
	if got := pub.GetNetworkPolicy().GetDeny()[0].GetCidr(); got != "2001:db8::/32" {
		t.Errorf("stored cidr %q, want the canonical 2001:db8::/32", got)
	}
	p.Deny[0].Cidr = "2001:db8:0::/32"
	res, err := s.UpdateNetworkPolicy(t.Context(), updateReq("eq-spelling", ws, 2, p, nil))
	if err != nil || res.GetWorkspace().GetNetworkPolicy().GetRevision() != 2 {
		t.Fatalf("same CIDR spelled differently = %v, %v; want revision 2", res, err)
	}
}

// TestUpdateNetworkPolicyStates: a change is refused (failed_precondition,
// STATE_CONFLICT, observed_workspace) in every state but AVAILABLE and
// STOPPED, and stores nothing.
func TestUpdateNetworkPolicyStates(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	for _, tc := range []struct {
		name string
		set  func(w *store.Workspace, pub *ctrlv1.Workspace)
	}{
		{"CREATING", func(*store.Workspace, *ctrlv1.Workspace) {}},
		{"STARTING", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, w.Generation = ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING, 3
		}},
		{"STOPPING", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, w.Power = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING, store.PowerStopped
		}},
		{"FAILED holding its execution", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, pub.HoldsExecution, w.ObservedState, w.ObservedGeneration, w.CommandID = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, true, store.ExecFailed, w.Generation, ""
		}},
		{"FAILED without an execution", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, pub.HoldsExecution, w.ObservedState, w.ObservedGeneration, w.CommandID = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, false, store.ExecFailed, w.Generation, ""
		}},
		{"DELETING", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, w.Power = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING, store.PowerDeleted
		}},
		{"DELETED", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, w.Power, w.ObservedState, w.ObservedGeneration = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, store.PowerDeleted, store.ExecDeleted, w.Generation
		}},
		{"UNKNOWN, starting underneath", func(w *store.Workspace, pub *ctrlv1.Workspace) {
			pub.State, w.Generation = ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN, 3
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := create(t, s, "state-"+strings.ReplaceAll(strings.ReplaceAll(tc.name, " ", "-"), ",", "")).GetWorkspaceId()
			edit(t, st, ws, tc.set)
			w0, _ := row(t, st, ws)
			_, err := s.UpdateNetworkPolicy(t.Context(), updateReq("upd-"+ws, ws, 0, webPolicy(), nil))
			wantFault(t, "UpdateNetworkPolicy", err, fault.KindFailedPrecondition, "")
			if fe, ok := fault.As(err); !ok || fe.Reason != fault.ReasonStateConflict || fe.ObservedWorkspace.GetWorkspaceId() != ws {
				t.Errorf("refusal = %+v, want STATE_CONFLICT observing the workspace", fe)
			}
			unchanged(t, st, ws, w0)
		})
	}
}

// TestUpdateNetworkPolicyStopped: a STOPPED Workspace only records the
// policy: revision+1, references, status PENDING, a completed command, no
// new generation for the node.
func TestUpdateNetworkPolicyStopped(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	addCatalog(t, st)
	s.WaitBound = time.Hour
	ws := create(t, s, "stopped-create").GetWorkspaceId()
	stopped(t, st, ws)
	w0, _ := row(t, st, ws)
	p := &ctrlv1.NetworkPolicy{Mode: public,
		Egresses: []*ctrlv1.EgressRoute{{EgressId: egTCP, Destinations: []*ctrlv1.Destination{{Cidr: "203.0.113.0/24"}}}},
		Dns:      &ctrlv1.DnsConfig{ResolverId: rsUDP, ViaEgressId: egUDP}}
	res, err := s.UpdateNetworkPolicy(t.Context(), updateReq("stopped-upd", ws, 1, p, u32(5)))
	if err != nil {
		t.Fatal(err)
	}
	if c := res.GetCommand(); c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED ||
		c.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_NETWORK_POLICY || c.GetError() != nil {
		t.Errorf("command = %v, want a completed UPDATE_NETWORK_POLICY", c)
	}
	w, pub := row(t, st, ws)
	want := proto.CloneOf(p)
	want.Revision = 2
	if !proto.Equal(pub.GetNetworkPolicy(), want) || pub.GetNetworkPolicyStatus().GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING {
		t.Errorf("stored %v / %v, want %v, PENDING", pub.GetNetworkPolicy(), pub.GetNetworkPolicyStatus(), want)
	}
	if w.Generation != w0.Generation || w.CommandID != "" || w.PolicyDrainSeconds != 5 || pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Errorf("row: generation %d (was %d), command %q, drain %d, state %v", w.Generation, w0.Generation, w.CommandID, w.PolicyDrainSeconds, pub.GetState())
	}
	for _, r := range []struct {
		kind   store.RefKind
		target string
	}{{store.RefEgress, egTCP}, {store.RefEgress, egUDP}, {store.RefEgressUDP, egUDP}, {store.RefResolver, rsUDP}} {
		if n := refCount(t, st, r.kind, r.target); n != 1 {
			t.Errorf("references %s %s = %d, want 1", r.kind, r.target, n)
		}
	}
	// Back to no network: the references go.
	if _, err := s.UpdateNetworkPolicy(t.Context(), updateReq("stopped-none", ws, 2, nil, nil)); err != nil {
		t.Fatal(err)
	}
	if n := refCount(t, st, store.RefEgress, egUDP) + refCount(t, st, store.RefResolver, rsUDP); n != 0 {
		t.Errorf("%d references left after the policy became NONE", n)
	}
}

// TestUpdateNetworkPolicyReferences: a referenced Egress or Resolver that
// does not exist or was deleted is not_found naming the field; a udp
// Resolver through an Egress without udp_enabled is failed_precondition;
// each is settled and stores nothing.
func TestUpdateNetworkPolicyReferences(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	addCatalog(t, st)
	ws := create(t, s, "refs-create").GetWorkspaceId()
	stopped(t, st, ws)
	w0, _ := row(t, st, ws)
	route := func(id string) *ctrlv1.EgressRoute {
		return &ctrlv1.EgressRoute{EgressId: id, Destinations: []*ctrlv1.Destination{{Cidr: "0.0.0.0/0"}}}
	}
	for i, tc := range []struct {
		name  string
		p     *ctrlv1.NetworkPolicy
		kind  fault.Kind
		field string
	}{
		{"route to a missing egress", &ctrlv1.NetworkPolicy{Mode: public, Egresses: []*ctrlv1.EgressRoute{route(egTCP), route(egNever)}}, fault.KindNotFound, "network_policy.egresses[1].egress_id"},
		{"route to a deleted egress", &ctrlv1.NetworkPolicy{Mode: public, Egresses: []*ctrlv1.EgressRoute{route(egGone)}}, fault.KindNotFound, "network_policy.egresses[0].egress_id"},
		{"missing resolver", &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ResolverId: rsNever}}, fault.KindNotFound, "network_policy.dns.resolver_id"},
		{"via a deleted egress", &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ResolverId: rsTCP, ViaEgressId: egGone}}, fault.KindNotFound, "network_policy.dns.via_egress_id"},
		{"udp resolver via an egress without udp", &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ResolverId: rsUDP, ViaEgressId: egTCP}}, fault.KindFailedPrecondition, "network_policy.dns.via_egress_id"},
	} {
		_, err := s.UpdateNetworkPolicy(t.Context(), updateReq("refs-"+string(rune('a'+i)), ws, 0, tc.p, nil))
		wantFault(t, tc.name, err, tc.kind, tc.field)
		if fe, ok := fault.As(err); ok && !fe.Settled {
			t.Errorf("%s: the refusal is not settled", tc.name)
		}
		unchanged(t, st, ws, w0)
	}
	if n := refCount(t, st, store.RefEgress, egTCP); n != 0 {
		t.Errorf("a refused update left %d references", n)
	}
	// A tcp Resolver needs no udp_enabled.
	p := &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ResolverId: rsTCP, ViaEgressId: egTCP}}
	if _, err := s.UpdateNetworkPolicy(t.Context(), updateReq("refs-tcp", ws, 0, p, nil)); err != nil {
		t.Fatalf("tcp resolver via an egress without udp = %v", err)
	}
	if refCount(t, st, store.RefEgressUDP, egTCP) != 0 || refCount(t, st, store.RefEgress, egTCP) != 1 {
		t.Errorf("references of a tcp resolver via an egress are wrong")
	}
}

// play is a node that applies (or fails) the policy generation it is
// given: it waits until the command waits, then records the outcome as the
// reconciler does and notifies.
func play(t *testing.T, st *sqlite.Store, ws, cid string, failure *fault.Error) {
	t.Helper()
	waitWaiters(t, st, 1)
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(t.Context(), ws)
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		rec, err := tx.GetCommand(t.Context(), cid)
		if err != nil {
			return err
		}
		rec.Status, rec.CompletedAt = store.CommandCompleted, time.Now().UTC().Truncate(time.Microsecond)
		ps := pub.GetNetworkPolicyStatus()
		if failure != nil {
			if rec.ErrorCode, rec.ErrorDetail, err = fault.Encode(failure); err != nil {
				return err
			}
			ps.State, ps.Message = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_FAILED, failure.Message
		} else {
			ps.State, ps.AppliedRevision = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED, pub.GetNetworkPolicy().GetRevision()
		}
		w.ObservedGeneration, w.CommandID = w.Generation, ""
		if err := workspace.Save(w, pub, time.Now().UTC().Truncate(time.Microsecond)); err != nil {
			return err
		}
		if err := tx.UpdateWorkspace(t.Context(), w); err != nil {
			return err
		}
		return tx.UpdateCommand(t.Context(), rec)
	})
	if err != nil {
		t.Fatal(err)
	}
	st.Notify(store.WorkspaceTopic(ws))
}

type policyAnswer struct {
	res *ctrlv1.UpdateWorkspaceNetworkPolicyResponse
	err error
}

func updateAsync(s *workspace.Service, req *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) <-chan policyAnswer {
	ch := make(chan policyAnswer, 1)
	go func() {
		res, err := s.UpdateNetworkPolicy(context.Background(), req)
		ch <- policyAnswer{res, err}
	}()
	return ch
}

func answerOf(t *testing.T, ch <-chan policyAnswer) policyAnswer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("UpdateNetworkPolicy did not return")
	}
	return policyAnswer{}
}

// TestUpdateNetworkPolicyAvailable: on an AVAILABLE Workspace the change
// gets a new revision and generation, drain_seconds (600 when absent), a
// PENDING status, and the call returns once the node confirmed, or with
// the node's failure; a resend replays the outcome.
func TestUpdateNetworkPolicyAvailable(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	addCatalog(t, st)
	s.WaitBound = time.Minute
	ws := create(t, s, "avail-create").GetWorkspaceId()
	running(t, st, ws)
	w0, _ := row(t, st, ws)

	p := &ctrlv1.NetworkPolicy{Mode: public, Egresses: []*ctrlv1.EgressRoute{{EgressId: egTCP, Destinations: []*ctrlv1.Destination{{Cidr: "203.0.113.0/24"}}}},
		Dns: &ctrlv1.DnsConfig{ResolverId: rsTCP}}
	ch := updateAsync(s, updateReq("avail-1", ws, 1, p, nil))
	waitWaiters(t, st, 1)
	w, pub := row(t, st, ws)
	if w.Generation != w0.Generation+1 || w.CommandID != "avail-1" || w.PolicyDrainSeconds != 600 ||
		pub.GetNetworkPolicy().GetRevision() != 2 || pub.GetNetworkPolicyStatus().GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING ||
		pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("while waiting: generation %d (was %d), command %q, drain %d, policy %v, status %v, state %v",
			w.Generation, w0.Generation, w.CommandID, w.PolicyDrainSeconds, pub.GetNetworkPolicy(), pub.GetNetworkPolicyStatus(), pub.GetState())
	}
	if refCount(t, st, store.RefEgress, egTCP) != 1 || refCount(t, st, store.RefResolver, rsTCP) != 1 {
		t.Errorf("references not recorded with the admission")
	}
	play(t, st, ws, "avail-1", nil)
	a := answerOf(t, ch)
	if a.err != nil || a.res.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED ||
		a.res.GetWorkspace().GetNetworkPolicyStatus().GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED ||
		a.res.GetWorkspace().GetNetworkPolicy().GetRevision() != 2 {
		t.Fatalf("UpdateNetworkPolicy = %v, %v; want the applied revision 2 and a completed command", a.res, a.err)
	}
	// A resend (with another revision in the policy: ignored) replays it.
	again := proto.CloneOf(p)
	again.Revision = 77
	res, err := s.UpdateNetworkPolicy(t.Context(), updateReq("avail-1", ws, 1, again, nil))
	if err != nil || res.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
		t.Fatalf("resend = %v, %v", res, err)
	}
	// The same ID with other content is already_exists.
	_, err = s.UpdateNetworkPolicy(t.Context(), updateReq("avail-1", ws, 1, webPolicy(), nil))
	wantFault(t, "same ID, other policy", err, fault.KindAlreadyExists, "metadata.command_id")

	// drain_seconds 0 is kept as 0; the node fails the change.
	ch = updateAsync(s, updateReq("avail-2", ws, 2, webPolicy(), u32(0)))
	waitWaiters(t, st, 1)
	if w, _ := row(t, st, ws); w.PolicyDrainSeconds != 0 {
		t.Errorf("drain_seconds 0 stored as %d", w.PolicyDrainSeconds)
	}
	nodeFailure := &fault.Error{Kind: fault.KindFailedPrecondition, Reason: fault.ReasonExecutionFailed, Stage: "apply_network_policy", Message: "boom"}
	play(t, st, ws, "avail-2", nodeFailure)
	a = answerOf(t, ch)
	wantFault(t, "failed change", a.err, fault.KindFailedPrecondition, "")
	if fe, _ := fault.As(a.err); fe == nil || fe.Reason != fault.ReasonExecutionFailed || !fe.Settled {
		t.Errorf("failed change = %v, want the node's EXECUTION_FAILED, settled", a.err)
	}
	_, err = s.UpdateNetworkPolicy(t.Context(), updateReq("avail-2", ws, 2, webPolicy(), u32(0)))
	if fe, _ := fault.As(err); fe == nil || fe.Reason != fault.ReasonExecutionFailed {
		t.Errorf("resend of the failed change = %v, want its failure again", err)
	}
}

// TestUpdateNetworkPolicyDNSVersion: an AVAILABLE Workspace whose
// execution reported no DNS configuration version refuses a policy with a
// Resolver, changing nothing; one without a Resolver is accepted, and a
// STOPPED Workspace records either.
func TestUpdateNetworkPolicyDNSVersion(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	addCatalog(t, st)
	s.WaitBound = 20 * time.Millisecond
	ws := create(t, s, "dns-create").GetWorkspaceId()
	makeAvailable(t, st, ws) // ExecDNSVersion 0: an earlier release
	w0, _ := row(t, st, ws)
	withResolver := &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ResolverId: rsTCP}}
	_, err := s.UpdateNetworkPolicy(t.Context(), updateReq("dns-1", ws, 0, withResolver, nil))
	wantFault(t, "resolver on an earlier release's execution", err, fault.KindFailedPrecondition, "network_policy.dns.resolver_id")
	if fe, _ := fault.As(err); fe == nil || fe.ObservedWorkspace == nil {
		t.Errorf("refusal without observed_workspace: %v", err)
	}
	unchanged(t, st, ws, w0)
	if refCount(t, st, store.RefResolver, rsTCP) != 0 {
		t.Errorf("the refused policy's references were recorded")
	}
	// Without a Resolver the change goes to the node (which never answers
	// here: TIMED_OUT).
	_, err = s.UpdateNetworkPolicy(t.Context(), updateReq("dns-2", ws, 0, webPolicy(), nil))
	if fe, _ := fault.As(err); fe == nil || fe.Reason != fault.ReasonTimedOut {
		t.Errorf("policy without a resolver = %v, want TIMED_OUT (admitted)", err)
	}
	stopped(t, st, ws)
	if _, err := s.UpdateNetworkPolicy(t.Context(), updateReq("dns-3", ws, 0, withResolver, nil)); err != nil {
		t.Errorf("resolver on a STOPPED workspace = %v, want recorded", err)
	}
}

// TestUpdateNetworkPolicyTimeout: past the bound the answer is retryable
// deadline_exceeded (TIMED_OUT) and the policy status UNKNOWN; a Workspace
// whose node fell silent (UNKNOWN) is answered unavailable
// (NODE_UNREACHABLE) at once; the command goes on and a resend after the
// node confirmed returns the success.
func TestUpdateNetworkPolicyTimeout(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	s.WaitBound = 50 * time.Millisecond
	ws := create(t, s, "to-create").GetWorkspaceId()
	running(t, st, ws)
	t0 := time.Now()
	_, err := s.UpdateNetworkPolicy(t.Context(), updateReq("to-1", ws, 0, webPolicy(), nil))
	fe, _ := fault.As(err)
	if fe == nil || fe.Kind != fault.KindDeadlineExceeded || fe.Reason != fault.ReasonTimedOut || !fe.Retryable || fe.Settled {
		t.Fatalf("UpdateNetworkPolicy without a node = %v, want retryable deadline_exceeded TIMED_OUT", err)
	}
	if d := time.Since(t0); d < s.WaitBound {
		t.Errorf("returned after %v, before the bound", d)
	}
	_, pub := row(t, st, ws)
	if pub.GetNetworkPolicyStatus().GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_UNKNOWN || pub.GetNetworkPolicy().GetRevision() != 2 {
		t.Errorf("after the timeout: status %v, revision %d; want UNKNOWN, 2", pub.GetNetworkPolicyStatus(), pub.GetNetworkPolicy().GetRevision())
	}

	// The node falls silent: the resend is NODE_UNREACHABLE at once.
	edit(t, st, ws, func(_ *store.Workspace, pub *ctrlv1.Workspace) {
		pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN
	})
	s.WaitBound = time.Hour
	_, err = s.UpdateNetworkPolicy(t.Context(), updateReq("to-1", ws, 0, webPolicy(), nil))
	if fe, _ := fault.As(err); fe == nil || fe.Kind != fault.KindUnavailable || fe.Reason != fault.ReasonNodeUnreachable || !fe.Retryable {
		t.Fatalf("resend with the node silent = %v, want retryable unavailable NODE_UNREACHABLE", err)
	}
	// A new change on the silent Workspace (AVAILABLE underneath) is
	// admitted, supersedes the first and is NODE_UNREACHABLE too.
	_, err = s.UpdateNetworkPolicy(t.Context(), updateReq("to-2", ws, 0, &ctrlv1.NetworkPolicy{Mode: public}, nil))
	if fe, _ := fault.As(err); fe == nil || fe.Reason != fault.ReasonNodeUnreachable {
		t.Fatalf("new change with the node silent = %v, want NODE_UNREACHABLE", err)
	}
	first, err := s.GetCommand(t.Context(), &ctrlv1.GetWorkspaceCommandRequest{CommandId: "to-1"})
	if err != nil || first.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED ||
		first.GetError().GetDetail().GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CONFLICT {
		t.Errorf("the superseded command = %v, %v; want completed with CONFLICT", first, err)
	}

	// The node comes back and applies it: the resend returns the success.
	edit(t, st, ws, func(_ *store.Workspace, pub *ctrlv1.Workspace) {
		pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
	})
	ch := updateAsync(s, updateReq("to-2", ws, 0, &ctrlv1.NetworkPolicy{Mode: public}, nil))
	play(t, st, ws, "to-2", nil)
	if a := answerOf(t, ch); a.err != nil || a.res.GetWorkspace().GetNetworkPolicyStatus().GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED {
		t.Fatalf("resend after the node applied it = %v, %v", a.res, a.err)
	}
}

// TestCreateWithNetworkPolicy: CreateWorkspace validates the policy
// (nothing recorded when malformed), checks its references (settled), and
// stores it normalized at revision 1 with its references; its
// network_policy.revision is not part of the input.
func TestCreateWithNetworkPolicy(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	addCatalog(t, st)
	req := func(cid string, p *ctrlv1.NetworkPolicy) *ctrlv1.CreateWorkspaceRequest {
		r := createReq(cid, nil)
		r.NetworkPolicy = p
		return r
	}
	_, err := s.Create(t.Context(), req("cwp-bad", &ctrlv1.NetworkPolicy{Mode: public, Allow: []*ctrlv1.Destination{{Cidr: "10.0.0.1/8"}}}))
	wantFault(t, "Create(host bits)", err, fault.KindInvalidArgument, "network_policy.allow[0].cidr")
	if recorded(t, s, "cwp-bad") {
		t.Errorf("a malformed create recorded its command")
	}
	_, err = s.Create(t.Context(), req("cwp-missing", &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ResolverId: rsNever}}))
	wantFault(t, "Create(missing resolver)", err, fault.KindNotFound, "network_policy.dns.resolver_id")
	_, err = s.Create(t.Context(), req("cwp-udp", &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ResolverId: rsUDP, ViaEgressId: egTCP}}))
	wantFault(t, "Create(udp via tcp-only egress)", err, fault.KindFailedPrecondition, "network_policy.dns.via_egress_id")

	p := &ctrlv1.NetworkPolicy{Revision: 9, Mode: public, Deny: []*ctrlv1.Destination{{Cidr: "2001:DB8::/32"}},
		Dns: &ctrlv1.DnsConfig{ResolverId: rsUDP, ViaEgressId: egUDP}}
	res, err := s.Create(t.Context(), req("cwp-ok", p))
	if err != nil {
		t.Fatal(err)
	}
	got := res.GetWorkspace().GetNetworkPolicy()
	if got.GetRevision() != 1 || got.GetDeny()[0].GetCidr() != "2001:db8::/32" || got.GetDns().GetViaEgressId() != egUDP {
		t.Errorf("created policy = %v, want it normalized at revision 1", got)
	}
	if refCount(t, st, store.RefEgressUDP, egUDP) != 1 || refCount(t, st, store.RefResolver, rsUDP) != 1 {
		t.Errorf("the created workspace's references are not recorded")
	}
	p2 := proto.CloneOf(p)
	p2.Revision = 1
	again, err := s.Create(t.Context(), req("cwp-ok", p2))
	if err != nil || again.GetWorkspace().GetWorkspaceId() != res.GetWorkspace().GetWorkspaceId() {
		t.Errorf("replay with another network_policy.revision = %v, %v; want the first acceptance", again, err)
	}
	// With no policy the Workspace has NONE at revision 1.
	if w := create(t, s, "cwp-none"); !proto.Equal(w.GetNetworkPolicy(), &ctrlv1.NetworkPolicy{Revision: 1, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}) {
		t.Errorf("default policy = %v", w.GetNetworkPolicy())
	}
}

// TestUpdateNetworkPolicyKicksBeforeWaiting: the call wakes the reconciler
// as soon as the change is admitted, not after its own wait for the node —
// otherwise the new desired state waits for the reconciler's next tick and
// the call (and the workspace's new flows) with it. Here the node answers
// only when kicked, so a kick that came after the wait would time out.
func TestUpdateNetworkPolicyKicksBeforeWaiting(t *testing.T) {
	t.Parallel()
	s, st := newService(t)
	addCatalog(t, st)
	s.WaitBound = 5 * time.Second
	ws := create(t, s, "kick-create").GetWorkspaceId()
	running(t, st, ws)
	kicked := make(chan struct{}, 8)
	s.Kick = func() { kicked <- struct{}{} }
	ch := updateAsync(s, updateReq("kick-1", ws, 1, webPolicy(), nil))
	select {
	case <-kicked:
	case a := <-ch:
		t.Fatalf("UpdateNetworkPolicy returned (%v, %v) before kicking the reconciler", a.res, a.err)
	case <-time.After(4 * time.Second):
		t.Fatal("the reconciler was not kicked while the call waited for the node")
	}
	play(t, st, ws, "kick-1", nil)
	if a := answerOf(t, ch); a.err != nil {
		t.Fatalf("UpdateNetworkPolicy = %v", a.err)
	}
}
