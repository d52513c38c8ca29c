package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/pki"
)

// TestDataPlaneThroughEitherReplica runs two kibotos-ctrl replicas on one
// PostgreSQL database and a real kibotos-node given both: the node keeps
// data tunnels to both, so an exec and a file upload and download
// through the replica that does NOT hold the node's stream work; a
// data-plane token revoked through one replica is refused at the other
// within the revocation bound (1 s; measured); and when the replica
// holding the stream is SIGKILLed, an exec through the survivor still
// works, and, once the killed replica is started again, through it too.
func TestDataPlaneThroughEitherReplica(t *testing.T) {
	requireRoot(t)
	url := pgSchema(t)
	e := newSoakEnv(t, 2, "--dev-no-node", "--store", url, "--log-level", "info")
	ctx := t.Context()
	logs, holder := e.startRealNode("dp-failover")
	other := 1 - holder
	e.waitCapability(holder, capability.WorkspaceCreate)
	ws, took := e.createReal(holder, "dp-failover-w1")
	t.Logf("node's stream on replica %d; a create through it: AVAILABLE and READY in %v", holder, took)

	// Exec through the replica without the node's stream: over the
	// node's own tunnel to it.
	start := time.Now()
	out, err := e.execEcho(other, ws)
	if err != nil || out != "hi\n" {
		t.Fatalf("exec in %s through replica %d (not the stream's): %q, %v", ws, other, out, err)
	}
	t.Logf("exec through replica %d (not holding the stream): %v", other, time.Since(start).Round(time.Millisecond))

	// Files through it: 4 MiB up, the same back.
	tok := e.dpToken(other, ws, "dp-failover-fs", ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM)
	files := ctrlv1connect.NewFileServiceClient(e.dataClient(), e.url(other))
	content := make([]byte, 4<<20)
	rand.Read(content)
	start = time.Now()
	fi, err := e2eWrite(ctx, files, tok, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/tmp/dp-failover.bin", Mode: 0o600}, content)
	if err != nil || fi.GetSize() != uint64(len(content)) {
		t.Fatalf("WriteFile through replica %d: %v, %v", other, fi, err)
	}
	up := time.Since(start)
	start = time.Now()
	back, err := e2eRead(ctx, files, tok, ws, "/tmp/dp-failover.bin")
	if err != nil || !bytes.Equal(back, content) {
		t.Fatalf("ReadFile through replica %d: %d bytes (want %d, equal %v), %v", other, len(back), len(content), bytes.Equal(back, content), err)
	}
	t.Logf("4 MiB through replica %d (no stream): upload %v, download %v", other, up.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	// Timed again through each replica in turn, for comparison.
	for round := range 2 {
		for _, i := range []int{holder, other} {
			tk := e.dpToken(i, ws, fmt.Sprintf("dp-failover-fs-%d-%d", round, i), ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM)
			f := ctrlv1connect.NewFileServiceClient(e.dataClient(), e.url(i))
			start := time.Now()
			if _, err := e2eWrite(ctx, f, tk, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/tmp/dp-failover-t.bin", Mode: 0o600}, content); err != nil {
				t.Fatalf("WriteFile through replica %d: %v", i, err)
			}
			upi := time.Since(start)
			start = time.Now()
			if back, err := e2eRead(ctx, f, tk, ws, "/tmp/dp-failover-t.bin"); err != nil || !bytes.Equal(back, content) {
				t.Fatalf("ReadFile through replica %d: %d bytes, %v", i, len(back), err)
			}
			t.Logf("round %d, replica %d (stream: %v): 4 MiB upload %v, download %v", round, i, i == holder,
				upi.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		}
	}

	// Revocation across replicas: a token used at B (its generation
	// cached there) is revoked through A, then refused at B.
	for _, dir := range [][2]int{{holder, other}, {other, holder}} {
		a, b := dir[0], dir[1]
		cid := "dp-failover-revoke-" + time.Now().Format("150405.000000")
		rtok := e.dpToken(a, ws, cid+"-s", ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM)
		fb := ctrlv1connect.NewFileServiceClient(e.dataClient(), e.url(b))
		probe := func() error {
			s, err := fb.ReadFile(ctx, bearer(&ctrlv1.ReadFileRequest{WorkspaceId: ws, Path: "/tmp/dp-failover-none"}, rtok))
			if err != nil {
				return err
			}
			defer s.Close()
			for s.Receive() {
			}
			return s.Err()
		}
		if err := probe(); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("replica %d before the revocation: %v, want not_found (the token accepted)", b, err)
		}
		if _, err := e.ws(a).RevokeWorkspaceDataPlane(ctx, connect.NewRequest(&ctrlv1.RevokeWorkspaceDataPlaneRequest{
			Metadata: md(cid), WorkspaceId: ws})); err != nil {
			t.Fatalf("revoke through replica %d: %v", a, err)
		}
		answered := time.Now()
		var refusedAfter, probeTook time.Duration
		for {
			p0 := time.Now()
			err := probe()
			probeTook = time.Since(p0)
			if connect.CodeOf(err) == connect.CodeUnauthenticated {
				refusedAfter = time.Since(answered)
				break
			}
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("replica %d after the revocation: %v", b, err)
			}
			if time.Since(answered) > 2*time.Second {
				t.Fatalf("replica %d still accepts a token revoked through replica %d %v ago", b, a, time.Since(answered))
			}
		}
		t.Logf("token revoked through replica %d: refused at replica %d %v after the revocation answered (one probe takes %v)",
			a, b, refusedAfter.Round(time.Millisecond), probeTook.Round(time.Millisecond))
		if refusedAfter > time.Second {
			t.Errorf("revocation reached replica %d after %v; the bound is 1 s", b, refusedAfter)
		}
	}

	// Isolation through the stream's replica ends the data plane carried
	// by the other: a process stream open through it ends.
	xtok := e.dpToken(other, ws, "dp-failover-iso-s", ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC)
	proc := ctrlv1connect.NewProcessServiceClient(e.dataClient(), e.url(other))
	st, err := proc.StartProcess(ctx, bearer(&ctrlv1.StartProcessRequest{WorkspaceId: ws, Argv: []string{"sleep", "60"}}, xtok))
	if err != nil {
		t.Fatalf("StartProcess through replica %d: %v", other, err)
	}
	evCtx, evCancel := context.WithTimeout(ctx, 20*time.Second)
	defer evCancel()
	ev, err := proc.ProcessEvents(evCtx, bearer(&ctrlv1.ProcessEventsRequest{WorkspaceId: ws, ProcessId: st.Msg.GetProcessId()}, xtok))
	if err != nil {
		t.Fatalf("ProcessEvents through replica %d: %v", other, err)
	}
	ended := make(chan time.Time, 1)
	go func() {
		for ev.Receive() {
		}
		ended <- time.Now()
	}()
	time.Sleep(200 * time.Millisecond) // the stream is open on the node
	nodes := ctrlv1connect.NewNodeServiceClient(e.hc, e.url(holder))
	gn, err := nodes.GetNode(ctx, connect.NewRequest(&ctrlv1.GetNodeRequest{NodeId: "dp-failover-node"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.IsolateNode(ctx, connect.NewRequest(&ctrlv1.IsolateNodeRequest{CommandId: "dp-failover-isolate", NodeId: "dp-failover-node",
		ExpectedRegistrationVersion: gn.Msg.GetNode().GetRegistrationVersion()})); err != nil {
		t.Fatalf("IsolateNode through replica %d: %v", holder, err)
	}
	isolated := time.Now()
	select {
	case at := <-ended:
		t.Logf("node isolated through replica %d: a process stream through replica %d ended %v later (%v)", holder, other,
			at.Sub(isolated).Round(time.Millisecond), ev.Err())
	case <-time.After(5 * time.Second):
		t.Fatalf("a process stream through replica %d still open 5 s after the node was isolated through replica %d", other, holder)
	}
	ev.Close()
	gn, err = nodes.GetNode(ctx, connect.NewRequest(&ctrlv1.GetNodeRequest{NodeId: "dp-failover-node"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.CancelNodeDrain(ctx, connect.NewRequest(&ctrlv1.CancelNodeDrainRequest{CommandId: "dp-failover-unisolate", NodeId: "dp-failover-node",
		ExpectedRegistrationVersion: gn.Msg.GetNode().GetRegistrationVersion()})); err != nil {
		t.Fatalf("CancelNodeDrain: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if out, err = e.execEcho(other, ws); err == nil && out == "hi\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec through replica %d after the isolation ended: %q, %v", other, out, err)
		}
	}

	// SIGKILL the replica holding the stream: the survivor already has a
	// tunnel, so an exec through it works without waiting for the stream.
	killed := time.Now()
	_ = e.procs[holder].cmd.Process.Signal(syscall.SIGKILL)
	_ = e.procs[holder].cmd.Wait()
	var execAfter time.Duration
	failed := 0
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out, err = e.execEcho(other, ws)
		if err == nil && out == "hi\n" {
			execAfter = time.Since(killed)
			break
		}
		failed++
		t.Logf("exec through the survivor after the kill: %q, %v", out, err)
		if time.Now().After(deadline) {
			t.Fatalf("exec through the survivor %d after the kill: %q, %v; the node's log:\n%s", other, out, err, logs)
		}
	}
	var opened time.Time
	for deadline := time.Now().Add(10 * time.Second); opened.IsZero() && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		opened = streamOpenedAt(logs.String(), e.url(other), killed)
	}
	if opened.IsZero() {
		t.Fatalf("the node's stream did not move to replica %d within 10 s of the kill", other)
	}
	t.Logf("replica %d SIGKILLed: an exec through replica %d answered %v after the kill (%d attempts failed before); the node's stream moved to it %v after the kill",
		holder, other, execAfter.Round(time.Millisecond), failed, opened.Sub(killed).Round(time.Millisecond))
	if failed > 0 {
		t.Errorf("%d execs through the survivor failed after the kill; its tunnel was open before", failed)
	}

	// The killed replica starts again: the node's tunnels reach it (their
	// redial back-off), and an exec through it works.
	e.procs[holder] = e.start(holder)
	restarted := time.Now()
	tries := 0
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		tries++
		if out, err = e.execEcho(holder, ws); err == nil && out == "hi\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec through the restarted replica %d: %q, %v", holder, out, err)
		}
	}
	t.Logf("replica %d restarted: an exec through it answered %v after it was serving (%d attempts)",
		holder, time.Since(restarted).Round(time.Millisecond), tries)
}

// dpToken creates, through replica i, a data-plane session of workspace
// id with scopes and returns its token.
func (e *soakEnv) dpToken(i int, id, cid string, scopes ...ctrlv1.DataPlaneScope) string {
	e.t.Helper()
	r, err := ctrlv1connect.NewSessionServiceClient(e.hc, e.url(i)).CreateDataPlaneSession(e.t.Context(),
		connect.NewRequest(&ctrlv1.CreateDataPlaneSessionRequest{Metadata: md(cid), WorkspaceId: id, Scopes: scopes}))
	if err != nil {
		e.t.Fatalf("CreateDataPlaneSession through replica %d: %v", i, err)
	}
	return r.Msg.GetSession().GetToken()
}

// dataClient is an HTTP client of the public data plane (TLS, no client
// certificate).
func (e *soakEnv) dataClient() *http.Client {
	tlsc, err := pki.ClientConfig(pki.DevPathsIn(e.dataDir).CA, "", "")
	if err != nil {
		e.t.Fatal(err)
	}
	return &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}, Timeout: 30 * time.Second}
}
