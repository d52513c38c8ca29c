package api_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/api"
	"github.com/kibotos/kibotos/internal/apierr"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// policyServer serves WorkspaceService alone (no capability refusal: the
// node's network feature is not what these tests are about) over HTTP/2
// with TLS, so that the Connect and the gRPC protocols both carry it; the
// test plays the node and the catalog by writing the store.
func policyServer(t *testing.T) (store.Store, map[string]ctrlv1connect.WorkspaceServiceClient) {
	t.Helper()
	st := ctrltest.OpenStore(t, false)
	svc := &workspace.Service{
		Engine: &command.Engine{Store: st}, Store: st, Pages: paging.NewCodec([]byte("0123456789abcdef0123456789abcdef")),
		Templates:   func(id string) (string, bool) { return "v1", id == workspace.DefaultTemplate },
		MaxCapacity: func() workspace.Capacity { return workspace.Capacity{MemoryMiB: 4096, CPUMillis: 4000} },
		WaitBound:   50 * time.Millisecond,
	}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(api.NewWorkspaces(svc),
		connect.WithInterceptors(apierr.NewInterceptor(slog.New(slog.DiscardHandler)))))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return st, map[string]ctrlv1connect.WorkspaceServiceClient{
		"connect": ctrlv1connect.NewWorkspaceServiceClient(srv.Client(), srv.URL),
		"grpc":    ctrlv1connect.NewWorkspaceServiceClient(srv.Client(), srv.URL, connect.WithGRPC()),
	}
}

// setRow changes a stored Workspace as a node's reports would.
func setRow(t *testing.T, st store.Store, id string, f func(w *store.Workspace, pub *ctrlv1.Workspace)) {
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

func availableRow(dnsVersion uint32) func(w *store.Workspace, pub *ctrlv1.Workspace) {
	return func(w *store.Workspace, pub *ctrlv1.Workspace) {
		pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, true
		w.ObservedGeneration, w.ObservedState, w.CommandID, w.NodeID, w.ExecDNSVersion = w.Generation, store.ExecRunning, "", "node-1", dnsVersion
	}
}

func stoppedRow(w *store.Workspace, pub *ctrlv1.Workspace) {
	pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, false
	w.Power, w.ObservedGeneration, w.ObservedState, w.CommandID, w.NodeID = store.PowerStopped, w.Generation, store.ExecStopped, "", "node-1"
}

// putCatalog stores an Egress without udp_enabled and a udp Resolver.
func putCatalog(t *testing.T, st store.Store, egressID, resolverID string) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	put := func(tx store.Tx, kind store.ResourceKind, id string, spec proto.Message) error {
		b, err := proto.Marshal(spec)
		if err != nil {
			return err
		}
		return tx.InsertResource(context.Background(), &store.Resource{Kind: kind, ID: id, CreatedAt: now, UpdatedAt: now, Revision: 1,
			Spec: b, Labels: map[string]string{}, LabelsRevision: 1, Annotations: map[string]string{}, AnnotationsRevision: 1})
	}
	err := st.InTx(context.Background(), func(tx store.Tx) error {
		if err := put(tx, store.KindEgress, egressID, socks("198.51.100.7:1080")); err != nil {
			return err
		}
		return put(tx, store.KindResolver, resolverID, &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "198.51.100.53:53"}}})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestUpdateWorkspaceNetworkPolicyWire: every rule of
// UpdateWorkspaceNetworkPolicy as a client sees it, over the Connect and
// the gRPC protocols: the code, the reason, the field, whether it is
// settled or retryable, observed_workspace, and that a refusal stores
// nothing.
func TestUpdateWorkspaceNetworkPolicyWire(t *testing.T) {
	t.Parallel()
	st, clients := policyServer(t)
	const (
		eg = "eg-wireaaaaaaaaaaaaaaaa"
		rs = "rs-wireaaaaaaaaaaaaaaaa"
	)
	putCatalog(t, st, eg, rs)
	public := ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET
	web := &ctrlv1.NetworkPolicy{Mode: public, Allow: []*ctrlv1.Destination{{Cidr: "0.0.0.0/0", PortMin: 443, PortMax: 443}}}
	drain := func(v uint32) *uint32 { return &v }
	for proto_, c := range clients {
		t.Run(proto_, func(t *testing.T) {
			ctx := t.Context()
			n := 0
			newWS := func(set func(w *store.Workspace, pub *ctrlv1.Workspace)) string {
				n++
				r, err := c.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
					Metadata: md(proto_ + "-create-" + string(rune('a'+n))), Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}}))
				if err != nil {
					t.Fatal(err)
				}
				id := r.Msg.GetWorkspace().GetWorkspaceId()
				if set != nil {
					setRow(t, st, id, set)
				}
				return id
			}
			update := func(cid, ws string, expected uint64, p *ctrlv1.NetworkPolicy, d *uint32) (*ctrlv1.UpdateWorkspaceNetworkPolicyResponse, error) {
				r, err := c.UpdateWorkspaceNetworkPolicy(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
					Metadata: md(cid), WorkspaceId: ws, ExpectedRevision: expected, NetworkPolicy: p, DrainSeconds: d}))
				if err != nil {
					return nil, err
				}
				return r.Msg, nil
			}
			policyOf := func(ws string) *ctrlv1.NetworkPolicy {
				r, err := c.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: ws}))
				if err != nil {
					t.Fatal(err)
				}
				return r.Msg.GetWorkspace().GetNetworkPolicy()
			}
			notRecorded := func(cid string) {
				t.Helper()
				_, err := c.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: cid}))
				wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
			}

			stopped := newWS(stoppedRow)
			var routes []*ctrlv1.EgressRoute
			for range 17 {
				routes = append(routes, &ctrlv1.EgressRoute{EgressId: eg, Destinations: []*ctrlv1.Destination{{Cidr: "::/0"}}})
			}
			for _, tc := range []struct {
				name  string
				p     *ctrlv1.NetworkPolicy
				d     *uint32
				field string
			}{
				{"host bits", &ctrlv1.NetworkPolicy{Mode: public, Allow: []*ctrlv1.Destination{{Cidr: "203.0.113.1/24"}}}, nil, "network_policy.allow[0].cidr"},
				{"port out of range", &ctrlv1.NetworkPolicy{Mode: public, Deny: []*ctrlv1.Destination{{Cidr: "::/0", PortMin: 1, PortMax: 70000}}}, nil, "network_policy.deny[0].port_max"},
				{"too many routes", &ctrlv1.NetworkPolicy{Mode: public, Egresses: routes}, nil, "network_policy.egresses"},
				{"drain", web, drain(3601), "drain_seconds"},
			} {
				_, err := update(proto_+"-inv", stopped, 0, tc.p, tc.d)
				d := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
				if d.GetField() != tc.field {
					t.Errorf("%s: field %q, want %q", tc.name, d.GetField(), tc.field)
				}
			}
			notRecorded(proto_ + "-inv")

			// CAS, even for equal content: aborted, settled, observed.
			_, err := update(proto_+"-cas", stopped, 5, nil, nil)
			d := wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
			if d.GetField() != "expected_revision" || d.GetObservedWorkspace().GetNetworkPolicy().GetRevision() != 1 {
				t.Errorf("CAS detail = %v", d)
			}
			// Equal content: the revision stays, no command.
			if r, err := update(proto_+"-eq", stopped, 1, &ctrlv1.NetworkPolicy{Revision: 8}, nil); err != nil || r.GetCommand() != nil || r.GetWorkspace().GetNetworkPolicy().GetRevision() != 1 {
				t.Errorf("equal content = %v, %v", r, err)
			}
			// References: not_found naming the field; udp via an Egress
			// without udp_enabled: failed_precondition.
			_, err = update(proto_+"-nf", stopped, 0, &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ResolverId: "rs-missingaaaaaaaaaaaaa"}}, nil)
			if d := wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, true); d.GetField() != "network_policy.dns.resolver_id" {
				t.Errorf("not_found field %q", d.GetField())
			}
			_, err = update(proto_+"-udp", stopped, 0, &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ResolverId: rs, ViaEgressId: eg}}, nil)
			if d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT, true); d.GetField() != "network_policy.dns.via_egress_id" {
				t.Errorf("udp precondition field %q", d.GetField())
			}
			if p := policyOf(stopped); p.GetRevision() != 1 || p.GetMode() != ctrlv1.NetworkMode_NETWORK_MODE_NONE {
				t.Errorf("refusals changed the policy: %v", p)
			}
			// STOPPED records it; the replay ignores network_policy.revision;
			// other content under the same ID is COMMAND_ID_REUSED.
			r, err := update(proto_+"-rec", stopped, 1, web, nil)
			if err != nil || r.GetWorkspace().GetNetworkPolicy().GetRevision() != 2 ||
				r.GetWorkspace().GetNetworkPolicyStatus().GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING ||
				r.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
				t.Fatalf("STOPPED update = %v, %v", r, err)
			}
			again := proto.CloneOf(web)
			again.Revision = 99
			if r2, err := update(proto_+"-rec", stopped, 1, again, nil); err != nil || !proto.Equal(r2, r) {
				t.Errorf("replay with another revision = %v, %v; want the first answer", r2, err)
			}
			_, err = update(proto_+"-rec", stopped, 1, &ctrlv1.NetworkPolicy{Mode: public}, nil)
			wantErr(t, err, connect.CodeAlreadyExists, ctrlv1.FailureReason_FAILURE_REASON_COMMAND_ID_REUSED, false)

			// Other states: failed_precondition, STATE_CONFLICT.
			creating := newWS(nil)
			_, err = update(proto_+"-state", creating, 0, web, nil)
			if d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true); d.GetObservedWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING {
				t.Errorf("state refusal observes %v", d.GetObservedWorkspace().GetState())
			}

			// AVAILABLE, started by an earlier release: a Resolver is refused.
			old := newWS(availableRow(0))
			_, err = update(proto_+"-dns", old, 0, &ctrlv1.NetworkPolicy{Mode: public, Dns: &ctrlv1.DnsConfig{ResolverId: rs}}, nil)
			if d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true); d.GetField() != "network_policy.dns.resolver_id" || d.GetObservedWorkspace() == nil {
				t.Errorf("DNS-version refusal detail = %v", d)
			}
			if p := policyOf(old); p.GetRevision() != 1 {
				t.Errorf("DNS-version refusal changed the policy: %v", p)
			}

			// AVAILABLE without a node that answers: retryable TIMED_OUT
			// (deadline_exceeded); with the node silent (UNKNOWN):
			// NODE_UNREACHABLE (unavailable).
			live := newWS(availableRow(1))
			_, err = update(proto_+"-to", live, 0, web, drain(0))
			if d := wantErr(t, err, connect.CodeDeadlineExceeded, ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT, false); !d.GetRetryable() || d.GetStage() != "apply_network_policy" {
				t.Errorf("timeout detail = %v", d)
			}
			setRow(t, st, live, func(_ *store.Workspace, pub *ctrlv1.Workspace) {
				pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN
			})
			_, err = update(proto_+"-to", live, 0, web, drain(0))
			if d := wantErr(t, err, connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_NODE_UNREACHABLE, false); !d.GetRetryable() {
				t.Errorf("unreachable detail = %v", d)
			}
			if p := policyOf(live); p.GetRevision() != 2 {
				t.Errorf("the admitted change is not recorded: %v", p)
			}
		})
	}
}
