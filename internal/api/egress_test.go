package api_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

func md(id string) *ctrlv1.CommandMetadata { return &ctrlv1.CommandMetadata{CommandId: id} }

func socks(addr string) *ctrlv1.EgressSpec {
	return &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: addr}}}
}

func socksAuth(addr, user, pass string) *ctrlv1.EgressSpec {
	s := socks(addr)
	s.GetSocks5().Username, s.GetSocks5().Password = user, pass
	return s
}

// wantErr checks err's code, reason and flags, and returns its detail.
func wantErr(t *testing.T, err error, code connect.Code, reason ctrlv1.FailureReason, settled bool) *ctrlv1.ErrorDetail {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want %v %v", code, reason)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, not a Connect error", err)
	}
	d, ok := kibotos.Detail(ce)
	if !ok {
		t.Fatalf("err = %v carries no ErrorDetail", err)
	}
	if ce.Code() != code || d.GetReason() != reason || d.GetCommandSettled() != settled {
		t.Fatalf("err = %v (reason %v, settled %v), want %v (reason %v, settled %v)", ce.Code(), d.GetReason(), d.GetCommandSettled(), code, reason, settled)
	}
	return d
}

func newEnv(t *testing.T) (*ctrltest.Env, ctrltest.Clients) {
	e := ctrltest.New(t, ctrltest.Options{})
	return e, e.Clients(e.HTTP)
}

func createEgress(t *testing.T, c ctrltest.Clients, id string, spec *ctrlv1.EgressSpec, lbls map[string]string) *ctrlv1.Egress {
	t.Helper()
	res, err := c.Egress.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md(id), Spec: spec, Labels: lbls}))
	if err != nil {
		t.Fatalf("CreateEgress(%s) = %v", id, err)
	}
	return res.Msg.GetEgress()
}

// TestEgressLifecycleAllProtocols runs the whole life of an Egress over each
// wire protocol and codec, on both stores.
func TestEgressLifecycleAllProtocols(t *testing.T) {
	for _, pg := range []bool{false, true} {
		storeName := map[bool]string{false: "sqlite", true: "postgres"}[pg]
		e := ctrltest.New(t, ctrltest.Options{Postgres: pg})
		for name, opts := range ctrltest.Protocols {
			t.Run(storeName+"/"+name, func(t *testing.T) {
				c := e.Clients(e.HTTP, opts...)
				ctx := t.Context()
				prefix := storeName + "-" + strings.ReplaceAll(name, "+", "-")
				eg := createEgress(t, c, prefix+"-create", socksAuth("127.0.0.1:1080", "u", "p"), map[string]string{"team": "a"})
				if eg.GetRevision() != 1 || eg.GetLabelsRevision() != 1 || eg.GetAnnotationsRevision() != 1 {
					t.Fatalf("new egress revisions = %d/%d/%d, want 1/1/1", eg.GetRevision(), eg.GetLabelsRevision(), eg.GetAnnotationsRevision())
				}
				if !strings.HasPrefix(eg.GetEgressId(), "eg-") || eg.GetCreatedAt() == nil {
					t.Fatalf("new egress = %v", eg)
				}
				got, err := c.Egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: eg.GetEgressId()}))
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(eg, got.Msg.GetEgress(), protocmp.Transform()); diff != "" {
					t.Fatalf("GetEgress differs from CreateEgress (-create +get):\n%s", diff)
				}
				up, err := c.Egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{
					Metadata: md(prefix + "-update"), EgressId: eg.GetEgressId(), ExpectedRevision: 1, Spec: socksAuth("127.0.0.1:1081", "u", "p"),
				}))
				if err != nil {
					t.Fatal(err)
				}
				if up.Msg.GetEgress().GetRevision() != 2 {
					t.Fatalf("revision after update = %d, want 2", up.Msg.GetEgress().GetRevision())
				}
				list, err := c.Egress.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{LabelSelector: map[string]string{"team": "a"}}))
				if err != nil {
					t.Fatal(err)
				}
				found := false
				for _, x := range list.Msg.GetEgresses() {
					found = found || x.GetEgressId() == eg.GetEgressId()
				}
				if !found {
					t.Fatalf("ListEgresses does not return %s", eg.GetEgressId())
				}
				if _, err := c.Egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Metadata: md(prefix + "-delete"), EgressId: eg.GetEgressId()})); err != nil {
					t.Fatal(err)
				}
				_, err = c.Egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: eg.GetEgressId()}))
				wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
			})
		}
	}
}

func TestCreateEgressValidation(t *testing.T) {
	t.Parallel()
	_, c := newEnv(t)
	long := strings.Repeat("x", 256)
	pemCA := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	tests := []struct {
		name   string
		spec   *ctrlv1.EgressSpec
		field  string
		reason ctrlv1.FailureReason
	}{
		{"no spec", nil, "spec", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"no protocol", &ctrlv1.EgressSpec{UdpEnabled: true}, "spec", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"empty address", socks(""), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"no port", socks("127.0.0.1"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"port zero", socks("127.0.0.1:0"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"port too big", socks("127.0.0.1:65536"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"unbracketed v6", socks("::1:1080"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"url", socks("socks5://127.0.0.1:1080"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"username 256 bytes", socksAuth("127.0.0.1:1080", long, "p"), "spec.socks5.username", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"password 256 bytes", socksAuth("127.0.0.1:1080", "u", long), "spec.socks5.password", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"password without username", socksAuth("127.0.0.1:1080", "", "p"), "spec.socks5.username", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"ca_cert not PEM", withTLS(socks("127.0.0.1:1080"), "", "not pem"), "spec.socks5.tls.ca_cert", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"ca_cert bad certificate", withTLS(socks("127.0.0.1:1080"), "", pemCA), "spec.socks5.tls.ca_cert", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"ca_cert over 64 KiB", withTLS(socks("127.0.0.1:1080"), "", strings.Repeat("a", 64<<10+1)), "spec.socks5.tls.ca_cert", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		{"private address", socks("10.0.0.1:1080"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN},
		{"documentation address", socks("192.0.2.10:1080"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN},
		{"benchmarking address", socks("198.18.0.1:1080"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN},
		{"mapped private address", socks("[::ffff:10.1.2.3]:1080"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN},
		{"link-local v6", socks("[fe80::1]:1080"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN},
		{"unspecified", socks("0.0.0.0:1080"), "spec.socks5.address", ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Egress.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md(fmt.Sprintf("bad-%d", i)), Spec: tt.spec}))
			d := wantErr(t, err, connect.CodeInvalidArgument, tt.reason, false)
			if d.GetField() != tt.field || d.GetRetryable() {
				t.Fatalf("field = %q retryable = %v, want %q false", d.GetField(), d.GetRetryable(), tt.field)
			}
		})
	}
	// Nothing was stored by any of them.
	list, err := c.Egress.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
	if err != nil || len(list.Msg.GetEgresses()) != 0 {
		t.Fatalf("ListEgresses after refused creates = %d egresses, %v; want none", len(list.Msg.GetEgresses()), err)
	}
	// The limits themselves are accepted.
	max := strings.Repeat("y", 255)
	createEgress(t, c, "ok-255", socksAuth("127.0.0.1:1080", max, max), nil)
	createEgress(t, c, "ok-v6", socks("[::1]:1080"), nil)
}

func withTLS(s *ctrlv1.EgressSpec, serverName, ca string) *ctrlv1.EgressSpec {
	s.GetSocks5().Tls = &ctrlv1.EgressTls{ServerName: serverName, CaCert: ca}
	return s
}

// fakeResolver answers every name with fixed addresses.
type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func TestEgressHostnameResolvedOnce(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{Allow: []netip.Prefix{}, Resolver: fakeResolver{
		"public.example":  {netip.MustParseAddr("93.184.216.34")},
		"mixed.example":   {netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("10.0.0.5")},
		"private.example": {netip.MustParseAddr("192.168.1.1")},
		"v6local.example": {netip.MustParseAddr("fd00::1")},
	}})
	c := e.Clients(e.HTTP)
	createEgress(t, c, "public", socks("public.example:1080"), nil)
	for _, host := range []string{"mixed.example", "private.example", "v6local.example"} {
		_, err := c.Egress.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md("h-" + host), Spec: socks(host + ":1080")}))
		wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN, false)
	}
	// Loopback is forbidden without the allow-list.
	_, err := c.Egress.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md("lo"), Spec: socks("127.0.0.1:1080")}))
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN, false)
	// Update applies the same checks.
	eg := createEgress(t, c, "public-2", socks("public.example:1080"), nil)
	_, err = c.Egress.UpdateEgress(t.Context(), connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: md("up-private"), EgressId: eg.GetEgressId(), ExpectedRevision: 1, Spec: socks("private.example:1080")}))
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN, false)
}

func TestCommandIDRules(t *testing.T) {
	t.Parallel()
	_, c := newEnv(t)
	tests := []struct {
		id     string
		reason ctrlv1.FailureReason
	}{
		{"", ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID},
		{"-leading-dash", ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID},
		{"has space", ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID},
		{"ünicode", ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID},
		{strings.Repeat("a", 129), ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID},
		{"expiration/ws-1/1", ctrlv1.FailureReason_FAILURE_REASON_RESERVED_COMMAND_ID},
		{"host-memory/n/1", ctrlv1.FailureReason_FAILURE_REASON_RESERVED_COMMAND_ID},
		{"guest-shutdown/ws/1", ctrlv1.FailureReason_FAILURE_REASON_RESERVED_COMMAND_ID},
	}
	for _, tt := range tests {
		_, err := c.Egress.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md(tt.id), Spec: socks("127.0.0.1:1080")}))
		d := wantErr(t, err, connect.CodeInvalidArgument, tt.reason, false)
		if d.GetRetryable() || d.GetField() != "metadata.command_id" {
			t.Errorf("CreateEgress(id %q): retryable %v field %q, want false metadata.command_id", tt.id, d.GetRetryable(), d.GetField())
		}
	}
	// Missing metadata is an empty ID.
	_, err := c.Egress.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Spec: socks("127.0.0.1:1080")}))
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID, false)
	list, _ := c.Egress.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
	if n := len(list.Msg.GetEgresses()); n != 0 {
		t.Fatalf("%d egresses stored by refused IDs, want 0", n)
	}
	for _, id := range []string{strings.Repeat("a", 128), "expiration", "a/expiration/x", "A.b_c-d/e"} {
		createEgress(t, c, id, socks("127.0.0.1:1080"), nil)
	}
}

func TestReplay(t *testing.T) {
	t.Parallel()
	_, c := newEnv(t)
	ctx := t.Context()
	first := createEgress(t, c, "replay-1", socks("127.0.0.1:1080"), map[string]string{"a": "b"})
	again := createEgress(t, c, "replay-1", socks("127.0.0.1:1080"), map[string]string{"a": "b"})
	if diff := cmp.Diff(first, again, protocmp.Transform()); diff != "" {
		t.Fatalf("replayed CreateEgress differs (-first +replay):\n%s", diff)
	}
	// Same ID, other input.
	_, err := c.Egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md("replay-1"), Spec: socks("127.0.0.1:1081")}))
	wantErr(t, err, connect.CodeAlreadyExists, ctrlv1.FailureReason_FAILURE_REASON_COMMAND_ID_REUSED, false)
	// Same ID on another method.
	_, err = c.Egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Metadata: md("replay-1"), EgressId: first.GetEgressId()}))
	wantErr(t, err, connect.CodeAlreadyExists, ctrlv1.FailureReason_FAILURE_REASON_COMMAND_ID_REUSED, false)

	// A settled failure replays even after the object changed so that the
	// same request would now succeed.
	upd := &ctrlv1.UpdateEgressRequest{Metadata: md("replay-upd"), EgressId: first.GetEgressId(), ExpectedRevision: 2, Spec: socks("127.0.0.1:1082")}
	_, err = c.Egress.UpdateEgress(ctx, connect.NewRequest(upd))
	wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
	if _, err := c.Egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: md("bump"), EgressId: first.GetEgressId(), ExpectedRevision: 1, Spec: socks("127.0.0.1:1083")})); err != nil {
		t.Fatal(err)
	}
	_, err = c.Egress.UpdateEgress(ctx, connect.NewRequest(upd)) // revision is now 2, but the ID is settled
	wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)

	// A not_found decision replays too.
	del := &ctrlv1.DeleteEgressRequest{Metadata: md("replay-del"), EgressId: "eg-doesnotexist"}
	_, err = c.Egress.DeleteEgress(ctx, connect.NewRequest(del))
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, true)
	_, err = c.Egress.DeleteEgress(ctx, connect.NewRequest(del))
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, true)

	// A successful delete replays success after the object is gone.
	d1 := &ctrlv1.DeleteEgressRequest{Metadata: md("replay-del-ok"), EgressId: first.GetEgressId()}
	for range 2 {
		if _, err := c.Egress.DeleteEgress(ctx, connect.NewRequest(d1)); err != nil {
			t.Fatalf("DeleteEgress replay = %v, want success", err)
		}
	}
	// A failure before any decision records nothing: the same ID may run.
	_, err = c.Egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md("replay-fixed"), Spec: socks("10.0.0.1:1080")}))
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN, false)
	createEgress(t, c, "replay-fixed", socks("127.0.0.1:1080"), nil)
}

func TestConcurrentSameCommandID(t *testing.T) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			e := ctrltest.New(t, ctrltest.Options{Postgres: pg})
			c := e.Clients(e.HTTP)
			const n = 64
			var wg sync.WaitGroup
			res := make([]*ctrlv1.CreateEgressResponse, n)
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() {
					r, err := c.Egress.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md("same-64"), Spec: socks("127.0.0.1:1080")}))
					if err == nil {
						res[i] = r.Msg
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("request %d: %v\n%s", i, errs[i], e.Log.String())
				}
				if !proto.Equal(res[i], res[0]) {
					t.Fatalf("request %d got %v, request 0 got %v", i, res[i], res[0])
				}
			}
			list, err := c.Egress.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
			if err != nil || len(list.Msg.GetEgresses()) != 1 {
				t.Fatalf("egresses after 64 concurrent creates = %d (%v), want 1", len(list.Msg.GetEgresses()), err)
			}
		})
	}
}

func TestUpdateEgressRules(t *testing.T) {
	t.Parallel()
	_, c := newEnv(t)
	ctx := t.Context()
	eg := createEgress(t, c, "u-create", socksAuth("127.0.0.1:1080", "user", "secret-1"), nil)
	id := eg.GetEgressId()
	update := func(cid string, rev uint64, spec *ctrlv1.EgressSpec, drain *uint32) (*ctrlv1.Egress, error) {
		r, err := c.Egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: md(cid), EgressId: id, ExpectedRevision: rev, Spec: spec, DrainSeconds: drain}))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetEgress(), nil
	}
	u32 := func(v uint32) *uint32 { return &v }

	// expected_revision is required.
	_, err := update("u-0", 0, socks("127.0.0.1:1080"), nil)
	d := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
	if d.GetField() != "expected_revision" {
		t.Fatalf("field = %q", d.GetField())
	}
	// A mismatch is aborted and nothing changes.
	_, err = update("u-1", 7, socks("127.0.0.1:1099"), nil)
	wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
	// Equal content (password included) keeps the revision.
	got, err := update("u-2", 1, socksAuth("127.0.0.1:1080", "user", "secret-1"), nil)
	if err != nil || got.GetRevision() != 1 {
		t.Fatalf("equal update: revision %d, %v; want 1", got.GetRevision(), err)
	}
	// A changed password alone is a change: the password is part of the content.
	got, err = update("u-3", 1, socksAuth("127.0.0.1:1080", "user", "secret-2"), nil)
	if err != nil || got.GetRevision() != 2 {
		t.Fatalf("password update: revision %d, %v; want 2", got.GetRevision(), err)
	}
	// drain_seconds 0..3600.
	for i, v := range []uint32{0, 3600} {
		got, err = update(fmt.Sprintf("u-drain-%d", i), got.GetRevision(), socks(fmt.Sprintf("127.0.0.1:%d", 2000+i)), u32(v))
		if err != nil {
			t.Fatalf("drain_seconds %d: %v", v, err)
		}
	}
	_, err = update("u-drain-bad", got.GetRevision(), socks("127.0.0.1:1080"), u32(3601))
	d = wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
	if d.GetField() != "drain_seconds" {
		t.Fatalf("field = %q", d.GetField())
	}
	if got.GetRevision() != 4 {
		t.Fatalf("revision = %d, want 4", got.GetRevision())
	}
	// Update of a missing Egress.
	_, err = c.Egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: md("u-missing"), EgressId: "eg-missing", ExpectedRevision: 1, Spec: socks("127.0.0.1:1080")}))
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, true)
}

func TestDeleteEgressReferenced(t *testing.T) {
	t.Parallel()
	e, c := newEnv(t)
	ctx := t.Context()
	eg := createEgress(t, c, "r-create", socks("127.0.0.1:1080"), nil)
	eg.Spec.UdpEnabled = true
	up, err := c.Egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: md("r-udp-on"), EgressId: eg.GetEgressId(), ExpectedRevision: 1, Spec: eg.GetSpec()}))
	if err != nil {
		t.Fatal(err)
	}
	setRefs := func(refs ...store.Reference) {
		t.Helper()
		if err := e.Store.InTx(ctx, func(tx store.Tx) error { return tx.SetReferences(ctx, "ws-test", refs) }); err != nil {
			t.Fatal(err)
		}
	}
	setRefs(store.Reference{Kind: store.RefEgress, TargetID: eg.GetEgressId()}, store.Reference{Kind: store.RefEgressUDP, TargetID: eg.GetEgressId()})
	_, err = c.Egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Metadata: md("r-del-1"), EgressId: eg.GetEgressId()}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT, true)
	// udp_enabled cannot be turned off while a udp Resolver goes through it.
	off := socks("127.0.0.1:1080")
	_, err = c.Egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: md("r-udp-off"), EgressId: eg.GetEgressId(), ExpectedRevision: up.Msg.GetEgress().GetRevision(), Spec: off}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT, true)
	// Other changes are fine, and never touch the referencing policy.
	setRefs(store.Reference{Kind: store.RefEgress, TargetID: eg.GetEgressId()})
	if _, err := c.Egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: md("r-udp-off-2"), EgressId: eg.GetEgressId(), ExpectedRevision: up.Msg.GetEgress().GetRevision(), Spec: off})); err != nil {
		t.Fatalf("udp off without udp references: %v", err)
	}
	_, err = c.Egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Metadata: md("r-del-2"), EgressId: eg.GetEgressId()}))
	wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT, true)
	// Once the Workspace no longer references it (deleted), delete works.
	setRefs()
	if _, err := c.Egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Metadata: md("r-del-3"), EgressId: eg.GetEgressId()})); err != nil {
		t.Fatal(err)
	}
	// A deleted Egress is not_found to every read and write.
	_, err = c.Egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: eg.GetEgressId()}))
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
	_, err = c.Egress.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{Metadata: md("r-lbl"), EgressId: eg.GetEgressId(), ExpectedRevision: 1}))
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, true)
	_, err = c.Egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Metadata: md("r-del-4"), EgressId: eg.GetEgressId()}))
	wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, true)
}

// TestUpdateEgressRepushes: an UpdateEgress that changes the spec stores
// its drain_seconds with the new revision (absent: 600) and, in the same
// transaction, moves the generation of the running Workspaces that
// reference the Egress, without touching their command or their policy;
// an equal update moves nothing. UpdateResolver likewise. Nothing logged
// holds the password.
func TestUpdateEgressRepushes(t *testing.T) {
	t.Parallel()
	e, c := newEnv(t)
	ctx := t.Context()
	const pw = "pw-never-shown-7731"
	eg := createEgress(t, c, "rp-create", socksAuth("127.0.0.1:1080", "user", pw), nil)
	rs, err := c.Resolver.CreateResolver(ctx, connect.NewRequest(&ctrlv1.CreateResolverRequest{Metadata: md("rp-rs"), Spec: udpResolver("127.0.0.1:53")}))
	if err != nil {
		t.Fatal(err)
	}
	rsID := rs.Msg.GetResolver().GetResolverId()
	// A running Workspace on a node this ctrl does not know, referencing
	// both, and a stopped one.
	put := func(id string, power store.Power, exec store.ExecState) {
		t.Helper()
		now := time.Now().UTC().Truncate(time.Microsecond)
		w := &store.Workspace{ID: id, CreatedAt: now, NodeID: "n-elsewhere", Power: power, Generation: 5, ObservedGeneration: 5,
			ObservedState: exec, CommandID: ""}
		pub := &ctrlv1.Workspace{WorkspaceId: id, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE,
			NetworkPolicy: &ctrlv1.NetworkPolicy{Revision: 2, Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET,
				Egresses: []*ctrlv1.EgressRoute{{EgressId: eg.GetEgressId(), Destinations: []*ctrlv1.Destination{{Cidr: "192.0.2.0/24"}}}},
				Dns:      &ctrlv1.DnsConfig{ResolverId: rsID}}}
		if err := workspace.Save(w, pub, now); err != nil {
			t.Fatal(err)
		}
		if err := e.Store.InTx(ctx, func(tx store.Tx) error {
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return err
			}
			return tx.SetReferences(ctx, id, []store.Reference{{Kind: store.RefEgress, TargetID: eg.GetEgressId()},
				{Kind: store.RefResolver, TargetID: rsID}})
		}); err != nil {
			t.Fatal(err)
		}
	}
	put("ws-running", store.PowerRunning, store.ExecRunning)
	put("ws-stopped", store.PowerStopped, store.ExecStopped)
	check := func(stage string, wantGen uint64, wantDrain uint32) {
		t.Helper()
		if err := e.Store.View(ctx, func(tx store.Tx) error {
			for id, gen := range map[string]uint64{"ws-running": wantGen, "ws-stopped": 5} {
				w, err := tx.GetWorkspace(ctx, id)
				if err != nil {
					return err
				}
				pub, err := workspace.Decode(w)
				if err != nil {
					return err
				}
				if w.Generation != gen || w.CommandID != "" || pub.GetNetworkPolicy().GetRevision() != 2 {
					t.Errorf("%s: %s generation %d, command %q, policy revision %d; want %d, none, 2", stage, id, w.Generation, w.CommandID,
						pub.GetNetworkPolicy().GetRevision(), gen)
				}
			}
			r, err := tx.GetResource(ctx, store.KindEgress, eg.GetEgressId())
			if err != nil {
				return err
			}
			if r.DrainSeconds != wantDrain {
				t.Errorf("%s: stored drain %d, want %d", stage, r.DrainSeconds, wantDrain)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	update := func(cid string, rev uint64, spec *ctrlv1.EgressSpec, drain *uint32) uint64 {
		t.Helper()
		r, err := c.Egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: md(cid), EgressId: eg.GetEgressId(),
			ExpectedRevision: rev, Spec: spec, DrainSeconds: drain}))
		if err != nil {
			t.Fatalf("UpdateEgress %s: %v", cid, err)
		}
		return r.Msg.GetEgress().GetRevision()
	}
	thirty := uint32(30)
	rev := update("rp-1", 1, socksAuth("127.0.0.1:1081", "user", pw), &thirty)
	check("changed with drain 30", 6, 30)
	rev = update("rp-2", rev, socksAuth("127.0.0.1:1081", "user", pw), nil)
	check("equal content", 6, 30)
	update("rp-3", rev, socksAuth("127.0.0.1:1082", "user", pw), nil)
	check("changed, drain absent", 7, 600)
	if _, err := c.Resolver.UpdateResolver(ctx, connect.NewRequest(&ctrlv1.UpdateResolverRequest{Metadata: md("rp-rs-1"), ResolverId: rsID,
		ExpectedRevision: 1, Spec: tcpResolver("127.0.0.1:53")})); err != nil {
		t.Fatal(err)
	}
	check("resolver changed", 8, 600)
	if strings.Contains(e.Log.String(), pw) {
		t.Error("ctrl's logs contain the Egress password")
	}
}
