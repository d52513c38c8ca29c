package api_test

import (
	"fmt"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
)

func udpResolver(addr string) *ctrlv1.ResolverSpec {
	return &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: addr}}}
}

func tcpResolver(addr string) *ctrlv1.ResolverSpec {
	return &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: addr}}}
}

func TestResolverLifecycle(t *testing.T) {
	t.Parallel()
	e, c := newEnv(t)
	ctx := t.Context()

	bad := []struct {
		spec   *ctrlv1.ResolverSpec
		field  string
		reason ctrlv1.FailureReason
	}{
		{nil, "spec", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{&ctrlv1.ResolverSpec{}, "spec", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{udpResolver("127.0.0.1"), "spec.udp.address", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{tcpResolver("[::1]"), "spec.tcp.address", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{udpResolver("169.254.169.254:53"), "spec.udp.address", ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN},
		{tcpResolver("[fc00::53]:53"), "spec.tcp.address", ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN},
	}
	for i, tt := range bad {
		_, err := c.Resolver.CreateResolver(ctx, connect.NewRequest(&ctrlv1.CreateResolverRequest{Metadata: md(fmt.Sprintf("rs-bad-%d", i)), Spec: tt.spec}))
		d := wantErr(t, err, connect.CodeInvalidArgument, tt.reason, false)
		if d.GetField() != tt.field {
			t.Errorf("CreateResolver(%v): field %q, want %q", tt.spec, d.GetField(), tt.field)
		}
	}

	cr, err := c.Resolver.CreateResolver(ctx, connect.NewRequest(&ctrlv1.CreateResolverRequest{Metadata: md("rs-1"), Spec: udpResolver("127.0.0.53:53"), Labels: map[string]string{"dns": "local"}}))
	if err != nil {
		t.Fatal(err)
	}
	rs := cr.Msg.GetResolver()
	if rs.GetRevision() != 1 || rs.GetResolverId()[:3] != "rs-" {
		t.Fatalf("created resolver = %v", rs)
	}
	// Replay.
	again, err := c.Resolver.CreateResolver(ctx, connect.NewRequest(&ctrlv1.CreateResolverRequest{Metadata: md("rs-1"), Spec: udpResolver("127.0.0.53:53"), Labels: map[string]string{"dns": "local"}}))
	if err != nil || again.Msg.GetResolver().GetResolverId() != rs.GetResolverId() {
		t.Fatalf("replay = %v, %v", again, err)
	}
	// Update: CAS, equal content keeps the revision, a change of protocol increments it.
	upd := func(cid string, rev uint64, spec *ctrlv1.ResolverSpec) (*ctrlv1.Resolver, error) {
		r, err := c.Resolver.UpdateResolver(ctx, connect.NewRequest(&ctrlv1.UpdateResolverRequest{Metadata: md(cid), ResolverId: rs.GetResolverId(), ExpectedRevision: rev, Spec: spec}))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetResolver(), nil
	}
	got, err := upd("rs-u1", 1, udpResolver("127.0.0.53:53"))
	if err != nil || got.GetRevision() != 1 {
		t.Fatalf("equal update = %v, %v", got, err)
	}
	got, err = upd("rs-u2", 1, tcpResolver("127.0.0.53:53"))
	if err != nil || got.GetRevision() != 2 || got.GetSpec().GetTcp() == nil {
		t.Fatalf("tcp update = %v, %v", got, err)
	}
	_, err = upd("rs-u3", 1, udpResolver("127.0.0.53:53"))
	wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
	// Labels and annotations.
	lr, err := c.Resolver.UpdateResolverLabels(ctx, connect.NewRequest(&ctrlv1.UpdateResolverLabelsRequest{Metadata: md("rs-l"), ResolverId: rs.GetResolverId(), ExpectedRevision: 1, Labels: map[string]string{"x": "y"}}))
	if err != nil || lr.Msg.GetResolver().GetLabelsRevision() != 2 {
		t.Fatalf("labels = %v, %v", lr, err)
	}
	ar, err := c.Resolver.UpdateResolverAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateResolverAnnotationsRequest{Metadata: md("rs-a"), ResolverId: rs.GetResolverId(), ExpectedRevision: 1, Annotations: map[string]string{"why": "because"}}))
	if err != nil || ar.Msg.GetResolver().GetAnnotationsRevision() != 2 {
		t.Fatalf("annotations = %v, %v", ar, err)
	}
	// Listing by selector.
	lst, err := c.Resolver.ListResolvers(ctx, connect.NewRequest(&ctrlv1.ListResolversRequest{LabelSelector: map[string]string{"x": "y"}}))
	if err != nil || len(lst.Msg.GetResolvers()) != 1 {
		t.Fatalf("list = %v, %v", lst, err)
	}
	// Delete is refused while referenced.
	if err := e.Store.InTx(ctx, func(tx store.Tx) error {
		return tx.SetReferences(ctx, "ws-1", []store.Reference{{Kind: store.RefResolver, TargetID: rs.GetResolverId()}})
	}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Resolver.DeleteResolver(ctx, connect.NewRequest(&ctrlv1.DeleteResolverRequest{Metadata: md("rs-d1"), ResolverId: rs.GetResolverId()}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT, true)
	if err := e.Store.InTx(ctx, func(tx store.Tx) error { return tx.SetReferences(ctx, "ws-1", nil) }); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resolver.DeleteResolver(ctx, connect.NewRequest(&ctrlv1.DeleteResolverRequest{Metadata: md("rs-d2"), ResolverId: rs.GetResolverId()})); err != nil {
		t.Fatal(err)
	}
	_, err = c.Resolver.GetResolver(ctx, connect.NewRequest(&ctrlv1.GetResolverRequest{ResolverId: rs.GetResolverId()}))
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
	// An Egress ID is not a Resolver.
	_, err = c.Resolver.GetResolver(ctx, connect.NewRequest(&ctrlv1.GetResolverRequest{ResolverId: "eg-aaaaaaaaaaaaaaaaaaaa"}))
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
	_, err = c.Resolver.GetResolver(ctx, connect.NewRequest(&ctrlv1.GetResolverRequest{}))
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
}
