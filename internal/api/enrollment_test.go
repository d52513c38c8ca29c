package api_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/node/enroll"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/store"
)

// bootstrap returns a BootstrapService client that presents no client
// certificate, as a node without one does.
func bootstrap(t *testing.T, e *ctrltest.Env) nodev1connect.BootstrapServiceClient {
	return nodev1connect.NewBootstrapServiceClient(e.Client(t, "", ""), e.URL)
}

// csr makes a fresh key and its signing request.
func csr(t *testing.T, dir string) []byte {
	t.Helper()
	key, err := pki.EnsureKey(filepath.Join(dir, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	der, err := pki.CreateCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func createEnrollment(t *testing.T, c ctrltest.Clients, id, nodeID string, ttl time.Duration) *ctrlv1.CreateEnrollmentResponse {
	t.Helper()
	req := &ctrlv1.CreateEnrollmentRequest{CommandId: id, NodeId: nodeID}
	if ttl != 0 {
		req.Ttl = durationpb.New(ttl)
	}
	res, err := c.Enrollment.CreateEnrollment(t.Context(), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("CreateEnrollment(%s) = %v", id, err)
	}
	return res.Msg
}

func TestEnrollmentNotServedWithoutCAKey(t *testing.T) {
	e, c := newEnv(t)
	info, err := c.ServerInfo.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(info.Msg.GetCapabilities(), capability.NodeEnrollment) {
		t.Errorf("capabilities %v list %s without a CA key", info.Msg.GetCapabilities(), capability.NodeEnrollment)
	}
	_, err = c.Enrollment.CreateEnrollment(t.Context(), connect.NewRequest(&ctrlv1.CreateEnrollmentRequest{CommandId: "c1"}))
	wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false)
	_, err = c.Enrollment.ListEnrollments(t.Context(), connect.NewRequest(&ctrlv1.ListEnrollmentsRequest{}))
	wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false)
	_, err = c.Enrollment.GetEnrollment(t.Context(), connect.NewRequest(&ctrlv1.GetEnrollmentRequest{EnrollmentId: "en-x"}))
	wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false)
	_, err = c.Enrollment.RevokeEnrollment(t.Context(), connect.NewRequest(&ctrlv1.RevokeEnrollmentRequest{EnrollmentId: "en-x"}))
	wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false)
	_, err = bootstrap(t, e).Enroll(t.Context(), connect.NewRequest(&nodev1.EnrollRequest{Token: "kbe1.en-x.y", Csr: csr(t, t.TempDir())}))
	wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false)
}

// TestEnrollment runs the life of enrollment tokens on both stores.
func TestEnrollment(t *testing.T) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			testEnrollment(t, pg)
		})
	}
}

func testEnrollment(t *testing.T, pg bool) {
	e := ctrltest.New(t, ctrltest.Options{Postgres: pg, Enrollment: true})
	c := e.Clients(e.HTTP)
	boot := bootstrap(t, e)
	ctx := t.Context()

	info, err := c.ServerInfo.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil || !slices.Contains(info.Msg.GetCapabilities(), capability.NodeEnrollment) {
		t.Fatalf("GetServerInfo = %v, %v; want %s listed", info.Msg.GetCapabilities(), err, capability.NodeEnrollment)
	}

	t.Run("create, replay, reuse", func(t *testing.T) {
		first := createEnrollment(t, c, "en-create", "", 0)
		en := first.GetEnrollment()
		if !strings.HasPrefix(first.GetToken(), "kbe1."+en.GetEnrollmentId()+".") || en.GetState() != ctrlv1.EnrollmentState_ENROLLMENT_STATE_PENDING {
			t.Fatalf("CreateEnrollment = %v", first)
		}
		if got := en.GetExpireTime().AsTime().Sub(en.GetCreatedAt().AsTime()); got != time.Hour {
			t.Errorf("default ttl = %s, want 1h", got)
		}
		again := createEnrollment(t, c, "en-create", "", 0)
		if again.GetToken() != first.GetToken() || again.GetEnrollment().GetEnrollmentId() != en.GetEnrollmentId() {
			t.Errorf("replay = %v, want the first answer %v", again, first)
		}
		_, err := c.Enrollment.CreateEnrollment(ctx, connect.NewRequest(&ctrlv1.CreateEnrollmentRequest{CommandId: "en-create", NodeId: "other"}))
		wantErr(t, err, connect.CodeAlreadyExists, ctrlv1.FailureReason_FAILURE_REASON_COMMAND_ID_REUSED, false)

		got, err := c.Enrollment.GetEnrollment(ctx, connect.NewRequest(&ctrlv1.GetEnrollmentRequest{EnrollmentId: en.GetEnrollmentId()}))
		if err != nil || got.Msg.GetEnrollment().GetState() != ctrlv1.EnrollmentState_ENROLLMENT_STATE_PENDING {
			t.Fatalf("GetEnrollment = %v, %v", got, err)
		}

		// The token is stored nowhere: not in the enrollment, not in the
		// command record.
		secret := first.GetToken()[strings.LastIndexByte(first.GetToken(), '.')+1:]
		err = e.Store.View(ctx, func(tx store.Tx) error {
			r, err := tx.GetResource(ctx, "enrollment", en.GetEnrollmentId())
			if err != nil {
				return err
			}
			cmd, err := tx.GetCommand(ctx, "en-create")
			if err != nil {
				return err
			}
			for _, b := range [][]byte{r.Spec, cmd.Result, cmd.ErrorDetail} {
				if bytes.Contains(b, []byte(secret)) || bytes.Contains(b, []byte(first.GetToken())) {
					t.Errorf("the token is stored: %q", b)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			req   *ctrlv1.CreateEnrollmentRequest
			field string
		}{
			{"node id upper case", &ctrlv1.CreateEnrollmentRequest{CommandId: "bad-1", NodeId: "Node1"}, "node_id"},
			{"node id dash end", &ctrlv1.CreateEnrollmentRequest{CommandId: "bad-2", NodeId: "node-"}, "node_id"},
			{"node id too long", &ctrlv1.CreateEnrollmentRequest{CommandId: "bad-3", NodeId: strings.Repeat("a", 64)}, "node_id"},
			{"negative ttl", &ctrlv1.CreateEnrollmentRequest{CommandId: "bad-4", Ttl: durationpb.New(-time.Second)}, "ttl"},
			{"ttl above 7 days", &ctrlv1.CreateEnrollmentRequest{CommandId: "bad-5", Ttl: durationpb.New(8 * 24 * time.Hour)}, "ttl"},
			{"ttl below 1s", &ctrlv1.CreateEnrollmentRequest{CommandId: "bad-6", Ttl: durationpb.New(time.Millisecond)}, "ttl"},
			{"no command id", &ctrlv1.CreateEnrollmentRequest{}, "command_id"},
			{"reserved command id", &ctrlv1.CreateEnrollmentRequest{CommandId: "guest-shutdown/x"}, "command_id"},
			{"malformed command id", &ctrlv1.CreateEnrollmentRequest{CommandId: "-x"}, "command_id"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := c.Enrollment.CreateEnrollment(ctx, connect.NewRequest(tc.req))
				if err == nil || connect.CodeOf(err) != connect.CodeInvalidArgument {
					t.Fatalf("err = %v, want invalid_argument", err)
				}
				d := wantDetail(t, err)
				if d.GetField() != tc.field || d.GetCommandSettled() {
					t.Errorf("detail = %v, want field %q, not settled", d, tc.field)
				}
			})
		}
		// Nothing was recorded: the same ID with valid input executes.
		createEnrollment(t, c, "bad-1", "node1", 0)
	})

	t.Run("enroll", func(t *testing.T) {
		res := createEnrollment(t, c, "en-enroll", "", 0)
		dir := t.TempDir()
		req := &nodev1.EnrollRequest{Token: res.GetToken(), Hostname: "Worker-7.example.com", Csr: csr(t, dir)}
		out, err := boot.Enroll(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("Enroll = %v", err)
		}
		if out.Msg.GetNodeId() != "worker-7" {
			t.Errorf("node ID = %q, want the host name's first label, lower case", out.Msg.GetNodeId())
		}
		cert := parseCert(t, out.Msg.GetCertificate())
		if cert.Subject.CommonName != "worker-7" || !slices.Equal(cert.Subject.OrganizationalUnit, []string{pki.RoleNode}) {
			t.Errorf("certificate subject = %v", cert.Subject)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: caPool(t, e), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("certificate does not verify against the CA: %v", err)
		}
		got, _ := c.Enrollment.GetEnrollment(ctx, connect.NewRequest(&ctrlv1.GetEnrollmentRequest{EnrollmentId: res.GetEnrollment().GetEnrollmentId()}))
		en := got.Msg.GetEnrollment()
		if en.GetState() != ctrlv1.EnrollmentState_ENROLLMENT_STATE_USED || en.GetEnrolledNodeId() != "worker-7" || en.GetUsedAt() == nil ||
			!en.GetCertificateExpireTime().AsTime().Equal(cert.NotAfter) {
			t.Errorf("enrollment after use = %v", en)
		}

		// The same node (same key) again: the same certificate.
		again, err := boot.Enroll(ctx, connect.NewRequest(req))
		if err != nil || !bytes.Equal(again.Msg.GetCertificate(), out.Msg.GetCertificate()) {
			t.Errorf("resend with the same key = %v, want the same certificate", err)
		}
		// Another key: refused.
		_, err = boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: res.GetToken(), Hostname: "other", Csr: csr(t, t.TempDir())}))
		d := wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
		if !strings.Contains(d.GetMessage(), "already used") {
			t.Errorf("message = %q", d.GetMessage())
		}
		// A used token cannot be revoked.
		_, err = c.Enrollment.RevokeEnrollment(ctx, connect.NewRequest(&ctrlv1.RevokeEnrollmentRequest{EnrollmentId: en.GetEnrollmentId()}))
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, false)

		// An unbound token never takes over a registered node ID.
		other := createEnrollment(t, c, "en-takeover", "", 0)
		_, err = boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: other.GetToken(), NodeId: "worker-7", Csr: csr(t, t.TempDir())}))
		wantErr(t, err, connect.CodeAlreadyExists, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT, false)
		// ... and the refusal did not use the token.
		if _, err := boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: other.GetToken(), NodeId: "worker-8", Csr: csr(t, t.TempDir())})); err != nil {
			t.Errorf("Enroll after a refused attempt = %v", err)
		}
		// A token bound to it re-enrolls it (a replaced machine).
		bound := createEnrollment(t, c, "en-rebind", "worker-7", 0)
		re, err := boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: bound.GetToken(), Hostname: "ignored", Csr: csr(t, t.TempDir())}))
		if err != nil || re.Msg.GetNodeId() != "worker-7" {
			t.Errorf("bound re-enrollment = %v, %v", re, err)
		}
		// A bound token refuses another requested ID.
		b2 := createEnrollment(t, c, "en-bound-2", "worker-9", 0)
		_, err = boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: b2.GetToken(), NodeId: "worker-10", Csr: csr(t, t.TempDir())}))
		wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
	})

	t.Run("concurrent use", func(t *testing.T) {
		res := createEnrollment(t, c, "en-race", "", 0)
		const n = 8
		errs := make(chan error, n)
		for i := range n {
			req := &nodev1.EnrollRequest{Token: res.GetToken(), NodeId: fmt.Sprintf("race-%d", i), Csr: csr(t, t.TempDir())}
			go func() { _, err := boot.Enroll(ctx, connect.NewRequest(req)); errs <- err }()
		}
		ok := 0
		for range n {
			if err := <-errs; err == nil {
				ok++
			} else if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("losing Enroll = %v, want unauthenticated", err)
			}
		}
		if ok != 1 {
			t.Errorf("%d of %d concurrent uses of one token succeeded, want exactly 1", ok, n)
		}
	})

	t.Run("refused tokens", func(t *testing.T) {
		res := createEnrollment(t, c, "en-refused", "", 0)
		tok := res.GetToken()
		for name, bad := range map[string]string{
			"empty":          "",
			"garbage":        "not-a-token",
			"wrong secret":   tok[:len(tok)-4] + "AAAA",
			"unknown id":     "kbe1.en-aaaaaaaaaaaaaaaaaaaa." + tok[strings.LastIndexByte(tok, '.')+1:],
			"wrong prefix":   "kbe2" + tok[4:],
			"trailing field": tok + ".x",
		} {
			_, err := boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: bad, NodeId: "n-refused", Csr: csr(t, t.TempDir())}))
			d := wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
			if !strings.Contains(d.GetMessage(), "not valid") {
				t.Errorf("%s: message = %q", name, d.GetMessage())
			}
		}
		_, err := boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: tok, NodeId: "n-refused", Csr: []byte("junk")}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || wantDetail(t, err).GetField() != "csr" {
			t.Errorf("junk CSR = %v", err)
		}
		_, err = boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: tok, Hostname: "_bad_", Csr: csr(t, t.TempDir())}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("unusable host name = %v", err)
		}

		// Revoked: refused; revoking twice changes nothing.
		rv, err := c.Enrollment.RevokeEnrollment(ctx, connect.NewRequest(&ctrlv1.RevokeEnrollmentRequest{EnrollmentId: res.GetEnrollment().GetEnrollmentId()}))
		if err != nil || rv.Msg.GetEnrollment().GetState() != ctrlv1.EnrollmentState_ENROLLMENT_STATE_REVOKED {
			t.Fatalf("RevokeEnrollment = %v, %v", rv, err)
		}
		rv2, err := c.Enrollment.RevokeEnrollment(ctx, connect.NewRequest(&ctrlv1.RevokeEnrollmentRequest{EnrollmentId: res.GetEnrollment().GetEnrollmentId()}))
		if err != nil || !rv2.Msg.GetEnrollment().GetRevokedAt().AsTime().Equal(rv.Msg.GetEnrollment().GetRevokedAt().AsTime()) {
			t.Errorf("second RevokeEnrollment = %v, %v; want the same result", rv2, err)
		}
		_, err = boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: tok, NodeId: "n-refused", Csr: csr(t, t.TempDir())}))
		d := wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
		if !strings.Contains(d.GetMessage(), "revoked") {
			t.Errorf("message = %q", d.GetMessage())
		}

		// Expired.
		short := createEnrollment(t, c, "en-short", "", time.Second)
		time.Sleep(1100 * time.Millisecond)
		got, _ := c.Enrollment.GetEnrollment(ctx, connect.NewRequest(&ctrlv1.GetEnrollmentRequest{EnrollmentId: short.GetEnrollment().GetEnrollmentId()}))
		if got.Msg.GetEnrollment().GetState() != ctrlv1.EnrollmentState_ENROLLMENT_STATE_EXPIRED {
			t.Errorf("state after ttl = %v", got.Msg.GetEnrollment().GetState())
		}
		_, err = boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: short.GetToken(), NodeId: "n-short", Csr: csr(t, t.TempDir())}))
		d = wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
		if !strings.Contains(d.GetMessage(), "expired") {
			t.Errorf("message = %q", d.GetMessage())
		}

		for _, id := range []string{"", "eg-123", "en-nope"} {
			_, err := c.Enrollment.GetEnrollment(ctx, connect.NewRequest(&ctrlv1.GetEnrollmentRequest{EnrollmentId: id}))
			want := connect.CodeNotFound
			if id == "" {
				want = connect.CodeInvalidArgument
			}
			if connect.CodeOf(err) != want {
				t.Errorf("GetEnrollment(%q) = %v, want %v", id, err, want)
			}
		}
	})

	t.Run("list", func(t *testing.T) {
		var all []*ctrlv1.Enrollment
		token := ""
		for {
			res, err := c.Enrollment.ListEnrollments(ctx, connect.NewRequest(&ctrlv1.ListEnrollmentsRequest{PageSize: 2, PageToken: token}))
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, res.Msg.GetEnrollments()...)
			if token = res.Msg.GetNextPageToken(); token == "" {
				break
			}
		}
		if len(all) < 8 {
			t.Errorf("listed %d enrollments, want every one created", len(all))
		}
		seen := map[string]bool{}
		for i, en := range all {
			if seen[en.GetEnrollmentId()] {
				t.Errorf("%s listed twice", en.GetEnrollmentId())
			}
			seen[en.GetEnrollmentId()] = true
			if i > 0 && en.GetCreatedAt().AsTime().Before(all[i-1].GetCreatedAt().AsTime()) {
				t.Errorf("not in creation order at %d", i)
			}
		}
		_, err := c.Enrollment.ListEnrollments(ctx, connect.NewRequest(&ctrlv1.ListEnrollmentsRequest{PageSize: 1001}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("page_size 1001 = %v", err)
		}
	})

	// No token, whole or secret part, in any log line.
	for _, line := range strings.Split(e.Log.String(), "\n") {
		if strings.Contains(line, "kbe1.") {
			t.Errorf("a log line holds a token: %s", line)
		}
	}
}

// TestEnrolledNodeRunsWorkspaces: a node that enrolls with a token (the
// code kibotos-node runs) connects with its certificate, and the deployment
// serves workspaces through it.
func TestEnrolledNodeRunsWorkspaces(t *testing.T) {
	e := ctrltest.New(t, ctrltest.Options{Enrollment: true})
	c := e.Clients(e.HTTP)
	res := createEnrollment(t, c, "en-node", "node-e", 0)
	dir := t.TempDir()
	cert, key, err := enroll.Ensure(t.Context(), enroll.Options{Endpoint: e.URL, CA: e.PKI.CA, Dir: dir, Token: res.GetToken()})
	if err != nil {
		t.Fatalf("enroll.Ensure = %v", err)
	}
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode = %v, %v; want 0600", fi.Mode(), err)
	}
	// A second call finds the certificate and needs no token.
	if c2, _, err := enroll.Ensure(t.Context(), enroll.Options{Endpoint: e.URL, CA: e.PKI.CA, Dir: dir}); err != nil || c2 != cert {
		t.Errorf("Ensure again = %q, %v", c2, err)
	}
	if _, _, err := enroll.Ensure(t.Context(), enroll.Options{Endpoint: e.URL, CA: e.PKI.CA, Dir: t.TempDir()}); err != enroll.ErrNoCredentials {
		t.Errorf("Ensure without certificate or token = %v, want ErrNoCredentials", err)
	}
	rt := agenttest.New()
	e.StartNodeWith(t, "node-e", cert, key, ctrltest.Options{Runtime: rt})
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.ServerInfo.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err == nil && slices.Contains(info.Msg.GetCapabilities(), capability.WorkspaceCreate) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the enrolled node never registered (capabilities %v, %v)", info.Msg.GetCapabilities(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	w, _ := createWS(t, c, "ws-on-enrolled")
	waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	err = e.Store.View(t.Context(), func(tx store.Tx) error {
		row, err := tx.GetWorkspace(t.Context(), w.GetWorkspaceId())
		if err == nil && row.NodeID != "node-e" {
			t.Errorf("workspace on node %q, want node-e", row.NodeID)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	// Re-enrolling node-e (a replaced machine) shuts out the old
	// certificate; the new one connects.
	hello := func(cert, key string) error {
		nc := nodev1connect.NewNodeServiceClient(e.Client(t, cert, key), e.URL)
		stream := nc.Connect(t.Context())
		if err := stream.Send(&nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Hello{Hello: &nodev1.Hello{
			NodeId: "node-e", Capacity: &nodev1.Capacity{MemoryMib: 1024, CpuMillis: 1000}}}}); err != nil {
			return err
		}
		_, err := stream.Receive()
		_ = stream.CloseRequest()
		_ = stream.CloseResponse()
		return err
	}
	again := createEnrollment(t, c, "en-node-again", "node-e", 0)
	dir2 := t.TempDir()
	cert2, key2, err := enroll.Ensure(t.Context(), enroll.Options{Endpoint: e.URL, CA: e.PKI.CA, Dir: dir2, Token: again.GetToken()})
	if err != nil {
		t.Fatalf("re-enrollment = %v", err)
	}
	if err := hello(cert, key); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "superseded") {
		t.Errorf("the replaced machine's certificate connected: %v", err)
	}
	if err := hello(cert2, key2); err != nil {
		t.Errorf("the new certificate: %v", err)
	}

	// Renewal: the node asks for a fresh certificate for the same key.
	hc, renewer, err := enroll.Client(e.URL, e.PKI.CA, cert2, key2, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := renewer.Holder.Current().Leaf
	if renewer.Due() {
		t.Error("a fresh certificate is due for renewal")
	}
	renewer.Now = func() time.Time { return before.NotAfter.Add(-time.Hour) }
	if !renewer.Due() {
		t.Error("a certificate an hour from expiry is not due")
	}
	if err := renewer.Renew(t.Context()); err != nil {
		t.Fatalf("Renew = %v", err)
	}
	after := renewer.Holder.Current().Leaf
	onDisk, _ := pki.LoadLeaf(cert2)
	if after.SerialNumber.Cmp(before.SerialNumber) == 0 || after.NotAfter.Before(before.NotAfter) ||
		!onDisk.Equal(after) || after.Subject.CommonName != "node-e" {
		t.Errorf("renewed certificate: serial %v → %v, not after %v → %v, on disk the same: %v", before.SerialNumber, after.SerialNumber, before.NotAfter, after.NotAfter, onDisk.Equal(after))
	}
	h1, _ := pki.PublicKeyHash(before.PublicKey)
	h2, _ := pki.PublicKeyHash(after.PublicKey)
	if h1 != h2 {
		t.Error("renewal changed the key")
	}
	if err := hello(cert2, key2); err != nil {
		t.Errorf("the renewed certificate: %v", err)
	}
	// A renewal request signed by another key is refused.
	certs := nodev1connect.NewCertificateServiceClient(hc, e.URL)
	_, err = certs.RenewCertificate(t.Context(), connect.NewRequest(&nodev1.RenewCertificateRequest{Csr: csr(t, t.TempDir())}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("renewal for another key = %v", err)
	}
	// The superseded machine cannot renew.
	old, _, err := enroll.Client(e.URL, e.PKI.CA, cert, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	oldKey, _ := pki.EnsureKey(key)
	oldCSR, _ := pki.CreateCSR(oldKey)
	_, err = nodev1connect.NewCertificateServiceClient(old, e.URL).RenewCertificate(t.Context(), connect.NewRequest(&nodev1.RenewCertificateRequest{Csr: oldCSR}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("renewal by the superseded certificate = %v", err)
	}
	// An operator certificate cannot call CertificateService.
	_, err = nodev1connect.NewCertificateServiceClient(e.HTTP, e.URL).RenewCertificate(t.Context(), connect.NewRequest(&nodev1.RenewCertificateRequest{Csr: oldCSR}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("renewal with an operator certificate = %v", err)
	}
}

func parseCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("no PEM in %q", b)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func caPool(t *testing.T, e *ctrltest.Env) *x509.CertPool {
	b, err := os.ReadFile(e.PKI.CA)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(b)
	return p
}
