package api_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/pki"
)

func TestServerInfo(t *testing.T) {
	t.Parallel()
	_, c := newEnv(t)
	res, err := c.ServerInfo.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetSourceRevision() != "test-revision" {
		t.Errorf("source_revision = %q", res.Msg.GetSourceRevision())
	}
	if !slices.Equal(res.Msg.GetCapabilities(), capability.Served(capability.Features{})) {
		t.Errorf("capabilities = %v, want %v", res.Msg.GetCapabilities(), capability.Served(capability.Features{}))
	}
	// Nothing of the Workspace API is advertised while no node can run a
	// workspace.
	for _, name := range res.Msg.GetCapabilities() {
		if strings.HasPrefix(name, "workspace.") || strings.HasPrefix(name, "volume.") {
			t.Errorf("capability %q is advertised but not served", name)
		}
	}
	// Once a node registered, the lifecycle is advertised, and only it.
	_, wc, _ := wsEnv(t, ctrltest.Options{})
	waitNode(t, wc)
	res, err = wc.ServerInfo.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Msg.GetCapabilities(), capability.Served(capability.Features{Nodes: true})) || !slices.Contains(res.Msg.GetCapabilities(), "workspace.create") {
		t.Errorf("capabilities with a node = %v, want %v", res.Msg.GetCapabilities(), capability.Served(capability.Features{Nodes: true}))
	}
}

func TestUnimplementedCarriesDetail(t *testing.T) {
	t.Parallel()
	_, c := newEnv(t)
	// The test environment's node does not serve Volumes: a Volume binding
	// and VolumeService are refused.
	_, err := c.Workspace.CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Metadata: md("ws-1"),
		Resources:     &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100},
		VolumeBinding: &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: "vol-1", MountPath: "/data"}}))
	if d := wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false); d.GetField() != "volume_binding" {
		t.Errorf("field %q, want volume_binding", d.GetField())
	}
	_, err = c.Volume.GetVolume(t.Context(), connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: "vol-1"}))
	wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false)
}

func TestOperatorCertificateRequired(t *testing.T) {
	t.Parallel()
	e, _ := newEnv(t)
	other, err := pki.EnsureDev(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, hc := range map[string]*http.Client{
		"no certificate":      e.Client(t, "", ""),
		"foreign certificate": e.Client(t, other.Operator, other.OperatorKey),
		"server certificate":  e.Client(t, e.PKI.Server, e.PKI.ServerKey), // not a client certificate
	} {
		for pname, opts := range ctrltest.Protocols {
			t.Run(name+"/"+pname, func(t *testing.T) {
				c := e.Clients(hc, opts...)
				_, err := c.ServerInfo.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
				wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
				_, err = c.Egress.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md("x"), Spec: socks("127.0.0.1:1080")}))
				wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
			})
		}
	}
	list, err := e.Clients(e.HTTP).Egress.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
	if err != nil || len(list.Msg.GetEgresses()) != 0 {
		t.Fatalf("unauthenticated creates stored %d egresses (%v)", len(list.Msg.GetEgresses()), err)
	}
}

// TestConnectJSONOverHTTP1 calls the API the way curl does.
func TestConnectJSONOverHTTP1(t *testing.T) {
	t.Parallel()
	e, _ := newEnv(t)
	hc := e.HTTP1Client(t, e.PKI.Operator, e.PKI.OperatorKey)
	post := func(path, body string) (int, string) {
		t.Helper()
		res, err := hc.Post(e.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.ProtoMajor != 1 {
			t.Fatalf("served over HTTP/%d, want 1.1", res.ProtoMajor)
		}
		return res.StatusCode, string(b)
	}
	code, body := post("/kibotos.ctrl.v1.EgressService/CreateEgress", `{"metadata":{"commandId":"curl-1"},"spec":{"socks5":{"address":"127.0.0.1:1080","username":"u","password":"hunter2"}}}`)
	if code != 200 || !strings.Contains(body, `"egressId":"eg-`) || strings.Contains(body, "hunter2") {
		t.Fatalf("CreateEgress over HTTP/1.1 = %d %s", code, body)
	}
	// Malformed JSON: invalid_argument with an ErrorDetail.
	code, body = post("/kibotos.ctrl.v1.EgressService/CreateEgress", `{"metadata":`)
	if code != 400 || !strings.Contains(body, `"invalid_argument"`) || !strings.Contains(body, "kibotos.ctrl.v1.ErrorDetail") {
		t.Fatalf("malformed JSON = %d %s", code, body)
	}
	// Unknown field.
	code, body = post("/kibotos.ctrl.v1.EgressService/CreateEgress", `{"metadata":{"commandId":"curl-2"},"nope":1}`)
	if code != 400 || !strings.Contains(body, "kibotos.ctrl.v1.ErrorDetail") {
		t.Fatalf("unknown field = %d %s", code, body)
	}
	// Oversized body: refused before it is parsed.
	big := fmt.Sprintf(`{"metadata":{"commandId":"curl-3"},"annotations":{"a":"%s"}}`, strings.Repeat("x", 5<<20))
	code, body = post("/kibotos.ctrl.v1.EgressService/CreateEgress", big)
	if code == 200 || !strings.Contains(body, "kibotos.ctrl.v1.ErrorDetail") {
		t.Fatalf("oversized body = %d %.300s", code, body)
	}
}

func TestLabelsAndAnnotations(t *testing.T) {
	t.Parallel()
	_, c := newEnv(t)
	ctx := t.Context()
	eg := createEgress(t, c, "l-create", socks("127.0.0.1:1080"), map[string]string{"a": "1", "b": "2"})
	id := eg.GetEgressId()
	setLabels := func(cid string, rev uint64, m map[string]string) (*ctrlv1.Egress, error) {
		r, err := c.Egress.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{Metadata: md(cid), EgressId: id, ExpectedRevision: rev, Labels: m}))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetEgress(), nil
	}
	// Replace, never merge.
	got, err := setLabels("l-1", 1, map[string]string{"c": "3"})
	if err != nil || got.GetLabelsRevision() != 2 || len(got.GetLabels()) != 1 || got.GetLabels()["c"] != "3" {
		t.Fatalf("replace labels = %v, %v", got, err)
	}
	// The spec revision is untouched by label changes.
	if got.GetRevision() != 1 {
		t.Fatalf("revision = %d after a label change, want 1", got.GetRevision())
	}
	// Equal content keeps the revision.
	got, err = setLabels("l-2", 2, map[string]string{"c": "3"})
	if err != nil || got.GetLabelsRevision() != 2 {
		t.Fatalf("equal labels: revision %d, %v; want 2", got.GetLabelsRevision(), err)
	}
	// Mismatch is aborted and nothing changes.
	_, err = setLabels("l-3", 1, map[string]string{"d": "4"})
	wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
	// Invalid labels.
	for i, m := range []map[string]string{
		{"kibotos.io/owner": "x"},
		{"bad key": "x"},
		{"k": "bad value"},
		{strings.Repeat("k", 64): "x"},
		tooMany(),
	} {
		_, err = setLabels(fmt.Sprintf("l-bad-%d", i), 2, m)
		wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
	}
	// Annotations: own revision, any UTF-8 value, 256 KiB in all.
	r, err := c.Egress.UpdateEgressAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateEgressAnnotationsRequest{Metadata: md("a-1"), EgressId: id, ExpectedRevision: 1, Annotations: map[string]string{"note": "free text: ünïcode ✓"}}))
	if err != nil || r.Msg.GetEgress().GetAnnotationsRevision() != 2 || r.Msg.GetEgress().GetLabelsRevision() != 2 {
		t.Fatalf("annotations = %v, %v", r, err)
	}
	_, err = c.Egress.UpdateEgressAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateEgressAnnotationsRequest{Metadata: md("a-2"), EgressId: id, ExpectedRevision: 2, Annotations: map[string]string{"big": strings.Repeat("x", 256<<10)}}))
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
	_, err = c.Egress.UpdateEgressAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateEgressAnnotationsRequest{Metadata: md("a-3"), EgressId: id, ExpectedRevision: 1}))
	wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
	// Labels on create are validated too.
	_, err = c.Egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md("l-bad-create"), Spec: socks("127.0.0.1:1080"), Labels: map[string]string{"x.kibotos.io/a": "b"}}))
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
}

func tooMany() map[string]string {
	m := map[string]string{}
	for i := range 65 {
		m[fmt.Sprintf("k%d", i)] = "v"
	}
	return m
}

func TestListPaging(t *testing.T) {
	t.Parallel()
	_, c := newEnv(t)
	ctx := t.Context()
	var want []string
	for i := range 230 {
		lbl := map[string]string{"parity": []string{"even", "odd"}[i%2]}
		want = append(want, createEgress(t, c, fmt.Sprintf("p-%d", i), socks("127.0.0.1:1080"), lbl).GetEgressId())
	}
	list := func(size uint32, token string, sel map[string]string) (*ctrlv1.ListEgressesResponse, error) {
		r, err := c.Egress.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{PageSize: size, PageToken: token, LabelSelector: sel}))
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}
	// Default page size is 100.
	first, err := list(0, "", nil)
	if err != nil || len(first.GetEgresses()) != 100 || first.GetNextPageToken() == "" {
		t.Fatalf("default page: %d items, token %q, %v", len(first.GetEgresses()), first.GetNextPageToken(), err)
	}
	// Walk everything in pages of 7: creation order, nothing skipped or repeated.
	var got []string
	token := ""
	for {
		page, err := list(7, token, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, eg := range page.GetEgresses() {
			got = append(got, eg.GetEgressId())
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("paged listing returned %d ids, want %d in creation order", len(got), len(want))
	}
	// Selector.
	odd, err := list(1000, "", map[string]string{"parity": "odd"})
	if err != nil || len(odd.GetEgresses()) != 115 || odd.GetNextPageToken() != "" {
		t.Fatalf("odd selector: %d items, %v", len(odd.GetEgresses()), err)
	}
	// Above the maximum is rejected, not clamped.
	_, err = list(1001, "", nil)
	d := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
	if d.GetField() != "page_size" {
		t.Fatalf("field = %q", d.GetField())
	}
	// A token is only valid with the selector it was issued for.
	page, _ := list(5, "", map[string]string{"parity": "odd"})
	_, err = list(5, page.GetNextPageToken(), map[string]string{"parity": "even"})
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_PAGE_TOKEN_INVALID, false)
	_, err = list(5, page.GetNextPageToken(), nil)
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_PAGE_TOKEN_INVALID, false)
	_, err = list(5, "garbage", nil)
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_PAGE_TOKEN_INVALID, false)
	// A token is also tied to its kind.
	_, err = c.Resolver.ListResolvers(ctx, connect.NewRequest(&ctrlv1.ListResolversRequest{PageToken: first.GetNextPageToken()}))
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_PAGE_TOKEN_INVALID, false)
	// Invalid selectors.
	_, err = list(5, "", map[string]string{"bad key": "x"})
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
}

// TestPasswordNeverLeaves creates Egresses with a known password, drives
// every method including failing ones, and searches every response, error
// and log line for the password.
func TestPasswordNeverLeaves(t *testing.T) {
	t.Parallel()
	const pw = "S3cr3t-Passw0rd-Canary"
	e, _ := newEnv(t)
	var seen bytes.Buffer
	for pname, opts := range ctrltest.Protocols {
		pname = strings.ReplaceAll(pname, "+", "-")
		c := e.Clients(e.HTTP, opts...)
		ctx := t.Context()
		keep := func(msg any, err error) {
			if err != nil {
				seen.WriteString(err.Error())
				if ce, ok := err.(*connect.Error); ok {
					for _, d := range ce.Details() {
						v, _ := d.Value()
						fmt.Fprintf(&seen, "%v", v)
					}
				}
			}
			if msg != nil {
				if pm, ok := msg.(proto.Message); ok {
					b, _ := protojson.Marshal(pm)
					seen.Write(b)
				}
			}
		}
		cr, err := c.Egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md(pname + "-pw-1"), Spec: socksAuth("127.0.0.1:1080", "user", pw)}))
		if err != nil {
			t.Fatal(err)
		}
		keep(cr.Msg, nil)
		id := cr.Msg.GetEgress().GetEgressId()
		// Replay returns the recorded response: still no password.
		cr2, err := c.Egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md(pname + "-pw-1"), Spec: socksAuth("127.0.0.1:1080", "user", pw)}))
		keep(msgOf(cr2), err)
		// Failures that mention the spec.
		_, err = c.Egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md(pname + "-pw-2"), Spec: socksAuth("10.0.0.1:1080", "user", pw)}))
		keep(nil, err)
		_, err = c.Egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md(pname + "-pw-3"), Spec: socksAuth("127.0.0.1:1080", "", pw)}))
		keep(nil, err)
		_, err = c.Egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md(pname + "-pw-4"), Spec: socksAuth("127.0.0.1:1080", "user", pw+strings.Repeat("x", 300))}))
		keep(nil, err)
		_, err = c.Egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Metadata: md(pname + "-pw-1"), Spec: socksAuth("127.0.0.1:1080", "user", pw+"2")}))
		keep(nil, err)
		g, err := c.Egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: id}))
		keep(msgOf(g), err)
		l, err := c.Egress.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
		keep(msgOf(l), err)
		u, err := c.Egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: md(pname + "-pw-5"), EgressId: id, ExpectedRevision: 1, Spec: socksAuth("127.0.0.1:1081", "user", pw)}))
		keep(msgOf(u), err)
		_, err = c.Egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Metadata: md(pname + "-pw-6"), EgressId: id, ExpectedRevision: 9, Spec: socksAuth("127.0.0.1:1081", "user", pw)}))
		keep(nil, err)
		lb, err := c.Egress.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{Metadata: md(pname + "-pw-7"), EgressId: id, ExpectedRevision: 1, Labels: map[string]string{"a": "b"}}))
		keep(msgOf(lb), err)
		if g.Msg.GetEgress().GetSpec().GetSocks5().GetUsername() != "user" {
			t.Fatalf("username not returned: %v", g.Msg.GetEgress())
		}
	}
	seen.WriteString(e.Log.String())
	if strings.Contains(seen.String(), pw) {
		t.Fatalf("the password appears in a response, error or log line")
	}
	if !strings.Contains(e.Log.String(), "CreateEgress") {
		t.Fatalf("the log has no calls; the search proves nothing")
	}
}

// msgOf returns a response's message, or nil for a failed call.
func msgOf[T any](r *connect.Response[T]) any {
	if r == nil {
		return nil
	}
	return r.Msg
}
