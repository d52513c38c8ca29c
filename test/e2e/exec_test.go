package e2e

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/pki"
)

// TestExecThroughPublicEndpoint: processes of a real workspace through the
// public ProcessService over TLS, with a data-plane token and no client
// certificate, forwarded over the embedded node's data tunnel: output and
// exit codes, input, revocation; and the round trip of `true` (start →
// exit event, as the client sees it), p50/p99 over 200 runs.
func TestExecThroughPublicEndpoint(t *testing.T) {
	requireRoot(t)
	dataDir := t.TempDir()
	p := startCtrl(t, dataDir, "--guest-binary", filepath.Join(binDir, "kibotos-guest"))
	hc := operatorClient(t, dataDir)
	ws := ctrlv1connect.NewWorkspaceServiceClient(hc, p.url)
	sessions := ctrlv1connect.NewSessionServiceClient(hc, p.url)
	info := ctrlv1connect.NewServerInfoServiceClient(hc, p.url)
	ctx := t.Context()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := info.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(res.Msg.GetCapabilities(), "workspace.exec") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace.exec never advertised; stderr:\n%s", p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cr, err := ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md("e2e-exec-ws"), Resources: &ctrlv1.Resources{MemoryMib: 128, CpuMillis: 500}, WritableLayerCapacityBytes: 64 << 20,
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := cr.Msg.GetWorkspace().GetWorkspaceId()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		g, err := ws.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			t.Fatal(err)
		}
		if g.Msg.GetWorkspace().GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE &&
			g.Msg.GetWorkspace().GetGuestObservation().GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_READY {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace not AVAILABLE and READY: %v\nstderr:\n%s", g.Msg.GetWorkspace(), p.stderr)
		}
	}
	session := func(cid string) string {
		r, err := sessions.CreateDataPlaneSession(ctx, connect.NewRequest(&ctrlv1.CreateDataPlaneSessionRequest{
			Metadata: md(cid), WorkspaceId: id, Scopes: []ctrlv1.DataPlaneScope{ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC}}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetSession().GetToken()
	}
	tok := session("e2e-exec-s1")
	// No client certificate.
	dp := pki.DevPathsIn(dataDir)
	tlsc, err := pki.ClientConfig(dp.CA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	proc := ctrlv1connect.NewProcessServiceClient(&http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}}, p.url)
	auth := func(r interface{ Header() http.Header }, tok string) {
		r.Header().Set("Authorization", "Bearer "+tok)
	}
	run := func(tok string, argv ...string) (string, *ctrlv1.ProcessExited, error) {
		sr := connect.NewRequest(&ctrlv1.StartProcessRequest{WorkspaceId: id, Argv: argv})
		auth(sr, tok)
		st, err := proc.StartProcess(ctx, sr)
		if err != nil {
			return "", nil, err
		}
		er := connect.NewRequest(&ctrlv1.ProcessEventsRequest{WorkspaceId: id, ProcessId: st.Msg.GetProcessId()})
		auth(er, tok)
		s, err := proc.ProcessEvents(ctx, er)
		if err != nil {
			return "", nil, err
		}
		defer s.Close()
		var out string
		var exit *ctrlv1.ProcessExited
		for s.Receive() {
			out += string(s.Msg().GetOutput().GetData())
			if e := s.Msg().GetExited(); e != nil {
				exit = e
			}
		}
		return out, exit, s.Err()
	}
	if out, exit, err := run(tok, "echo", "hi"); err != nil || out != "hi\n" || exit.GetExitCode() != 0 {
		t.Fatalf("echo hi = %q, %v, %v; stderr:\n%s", out, exit, err, p.stderr)
	}
	if _, exit, err := run(tok, "sh", "-c", "exit 7"); err != nil || exit.GetExitCode() != 7 {
		t.Fatalf("exit 7 = %v, %v", exit, err)
	}
	// Input through the public endpoint.
	sr := connect.NewRequest(&ctrlv1.StartProcessRequest{WorkspaceId: id, Argv: []string{"cat"}})
	auth(sr, tok)
	st, err := proc.StartProcess(ctx, sr)
	if err != nil {
		t.Fatal(err)
	}
	in := connect.NewRequest(&ctrlv1.SendInputRequest{WorkspaceId: id, ProcessId: st.Msg.GetProcessId(), Data: []byte("typed\n")})
	auth(in, tok)
	if r, err := proc.SendInput(ctx, in); err != nil || r.Msg.GetAcceptedBytes() != 6 {
		t.Fatalf("SendInput = %v, %v", r, err)
	}
	ci := connect.NewRequest(&ctrlv1.CloseInputRequest{WorkspaceId: id, ProcessId: st.Msg.GetProcessId()})
	auth(ci, tok)
	if _, err := proc.CloseInput(ctx, ci); err != nil {
		t.Fatal(err)
	}
	er := connect.NewRequest(&ctrlv1.ProcessEventsRequest{WorkspaceId: id, ProcessId: st.Msg.GetProcessId()})
	auth(er, tok)
	s, err := proc.ProcessEvents(ctx, er)
	if err != nil {
		t.Fatal(err)
	}
	var out string
	for s.Receive() {
		out += string(s.Msg().GetOutput().GetData())
	}
	if out != "typed\n" || s.Err() != nil {
		t.Fatalf("cat = %q, %v", out, s.Err())
	}

	// Streamed input (WriteInput): 8 MiB, far beyond the 64 KiB input
	// buffer, sent to a process that does not read for a while, is taken
	// whole (flow control, no resource_exhausted) and read in order.
	sr = connect.NewRequest(&ctrlv1.StartProcessRequest{WorkspaceId: id, Argv: []string{"sh", "-c", "sleep 0.3; md5sum"}})
	auth(sr, tok)
	if st, err = proc.StartProcess(ctx, sr); err != nil {
		t.Fatal(err)
	}
	wi := proc.WriteInput(ctx)
	wi.RequestHeader().Set("Authorization", "Bearer "+tok)
	sum := md5.New()
	const inputBytes = 8 << 20
	for i := 0; i < inputBytes/(128<<10); i++ {
		chunk := bytes.Repeat([]byte{byte('a' + i%26)}, 128<<10)
		sum.Write(chunk)
		m := &ctrlv1.WriteInputRequest{Data: chunk, CloseInput: i == inputBytes/(128<<10)-1}
		if i == 0 {
			m.WorkspaceId, m.ProcessId = id, st.Msg.GetProcessId()
		}
		if err := wi.Send(m); err != nil {
			break // CloseAndReceive says why
		}
	}
	wr, err := wi.CloseAndReceive()
	if err != nil || wr.Msg.GetAcceptedBytes() != inputBytes {
		t.Fatalf("WriteInput = %v, %v", wr, err)
	}
	er = connect.NewRequest(&ctrlv1.ProcessEventsRequest{WorkspaceId: id, ProcessId: st.Msg.GetProcessId()})
	auth(er, tok)
	if s, err = proc.ProcessEvents(ctx, er); err != nil {
		t.Fatal(err)
	}
	out = ""
	for s.Receive() {
		out += string(s.Msg().GetOutput().GetData())
	}
	if want := hex.EncodeToString(sum.Sum(nil)); !strings.HasPrefix(out, want) {
		t.Fatalf("md5sum of the streamed input = %q, want %s", out, want)
	}

	// An HTTP/1.1 client (no HTTP/2, as a browser's fetch without
	// streaming request bodies) runs a process with the unary and
	// server-streaming forms.
	h1 := tlsc.Clone()
	h1.NextProtos = []string{"http/1.1"}
	proc1 := ctrlv1connect.NewProcessServiceClient(&http.Client{Transport: &http.Transport{TLSClientConfig: h1}}, p.url)
	sr = connect.NewRequest(&ctrlv1.StartProcessRequest{WorkspaceId: id, Argv: []string{"echo", "over http/1.1"}})
	auth(sr, tok)
	if st, err = proc1.StartProcess(ctx, sr); err != nil {
		t.Fatalf("StartProcess over HTTP/1.1: %v", err)
	}
	er = connect.NewRequest(&ctrlv1.ProcessEventsRequest{WorkspaceId: id, ProcessId: st.Msg.GetProcessId()})
	auth(er, tok)
	if s, err = proc1.ProcessEvents(ctx, er); err != nil {
		t.Fatal(err)
	}
	out = ""
	for s.Receive() {
		out += string(s.Msg().GetOutput().GetData())
	}
	if out != "over http/1.1\n" || s.Err() != nil {
		t.Fatalf("ProcessEvents over HTTP/1.1 = %q, %v", out, s.Err())
	}

	// Round trip of `true`.
	var rtt []time.Duration
	for range 200 {
		start := time.Now()
		if _, exit, err := run(tok, "true"); err != nil || exit == nil || exit.GetExitCode() != 0 {
			t.Fatalf("true = %v, %v", exit, err)
		}
		rtt = append(rtt, time.Since(start))
	}
	sort.Slice(rtt, func(i, j int) bool { return rtt[i] < rtt[j] })
	t.Logf("`true` through the public endpoint, start → exit event, 200 runs: p50 %v, p99 %v, max %v", rtt[99], rtt[197], rtt[199])

	// Revocation ends an open stream and refuses the old token; a new one
	// works.
	sr = connect.NewRequest(&ctrlv1.StartProcessRequest{WorkspaceId: id, Argv: []string{"sleep", "60"}})
	auth(sr, tok)
	if st, err = proc.StartProcess(ctx, sr); err != nil {
		t.Fatal(err)
	}
	er = connect.NewRequest(&ctrlv1.ProcessEventsRequest{WorkspaceId: id, ProcessId: st.Msg.GetProcessId()})
	auth(er, tok)
	if s, err = proc.ProcessEvents(ctx, er); err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatalf("no first event: %v", s.Err())
	}
	if _, err := ws.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(&ctrlv1.RevokeWorkspaceDataPlaneRequest{Metadata: md("e2e-exec-revoke"), WorkspaceId: id})); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for s.Receive() {
		}
		ended <- s.Err()
	}()
	select {
	case err := <-ended:
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("stream after revocation ended with %v, want unauthenticated", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream of a revoked token is still open after 5s")
	}
	if _, _, err := run(tok, "true"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("old token after revocation = %v, want unauthenticated", err)
	}
	if _, exit, err := run(session("e2e-exec-s2"), "true"); err != nil || exit == nil {
		t.Fatalf("new token = %v, %v", exit, err)
	}
}
