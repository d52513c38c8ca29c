package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/pki"
)

// lockedBuffer is a bytes.Buffer safe to read while a process writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// streamOpenedAt returns when the node's log says its stream to url opened
// at or after since (zero: none yet).
func streamOpenedAt(log, url string, since time.Time) time.Time {
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var l struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
			URL  string    `json:"url"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "ctrl stream open" && l.URL == url && !l.Time.Before(since) {
			return l.Time
		}
	}
	return time.Time{}
}

// TestRealNodeFailsOverBetweenReplicas runs two kibotos-ctrl replicas on
// one PostgreSQL database and a real kibotos-node given both (--ctrl
// repeated), which enrolls with a token: when the replica holding the
// node's stream is SIGKILLed, the node opens a stream to the other within
// a few seconds; a workspace created before keeps running and answers an
// exec through the other replica (the node keeps data tunnels to both),
// and a workspace created through the other becomes AVAILABLE.
func TestRealNodeFailsOverBetweenReplicas(t *testing.T) {
	requireRoot(t)
	url := pgSchema(t)
	e := newSoakEnv(t, 2, "--dev-no-node", "--store", url, "--log-level", "info")
	logs, first := e.startRealNode("failover")
	other := 1 - first
	e.waitCapability(first, capability.WorkspaceCreate)
	w1, took := e.createReal(first, "failover-w1")
	t.Logf("node on replica %d; a create through it: AVAILABLE and READY in %v", first, took)

	killed := time.Now()
	_ = e.procs[first].cmd.Process.Signal(syscall.SIGKILL)
	_ = e.procs[first].cmd.Wait()
	var opened time.Time
	for deadline := time.Now().Add(10 * time.Second); opened.IsZero(); time.Sleep(20 * time.Millisecond) {
		opened = streamOpenedAt(logs.String(), e.url(other), killed)
		if opened.IsZero() && time.Now().After(deadline) {
			t.Fatalf("no stream to replica %d within 10s of the kill; the node's log:\n%s", other, logs)
		}
	}
	reconnect := opened.Sub(killed)
	e.waitCapability(other, capability.WorkspaceCreate)
	// The workspace created before kept running: it answers an exec
	// through the other replica, over the node's tunnel to it.
	var out string
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, err = e.execEcho(other, w1)
		if err == nil && out == "hi\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec in %s through replica %d: %q, %v", w1, other, out, err)
		}
	}
	execAt := time.Since(killed)
	_, took2 := e.createReal(other, "failover-w2")
	t.Logf("replica %d SIGKILLed: the node's stream to replica %d open after %v; an exec in the earlier workspace through it answered %v after the kill; a create through it: AVAILABLE and READY in %v",
		first, other, reconnect.Round(time.Millisecond), execAt.Round(time.Millisecond), took2)
	if reconnect > 5*time.Second {
		t.Errorf("reconnect took %v, want at most 5s", reconnect)
	}
}

// createReal creates a workspace of the default template through replica
// i and waits until it is AVAILABLE with its guest READY.
func (e *soakEnv) createReal(i int, cid string) (string, time.Duration) {
	t := e.t
	start := time.Now()
	ws := e.ws(i)
	r, err := ws.CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md(cid), Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}, WritableLayerCapacityBytes: 32 << 20}))
	if err != nil {
		t.Fatalf("create through replica %d: %v", i, err)
	}
	id := r.Msg.GetWorkspace().GetWorkspaceId()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		g, err := ws.GetWorkspace(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err == nil && g.Msg.GetWorkspace().GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE &&
			g.Msg.GetWorkspace().GetGuestObservation().GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_READY {
			return id, time.Since(start).Round(time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace %s through replica %d not AVAILABLE and READY within 60s: %v %v", id, i, g.Msg.GetWorkspace(), err)
		}
	}
}

// execEcho runs echo hi in workspace id through replica i's data plane.
func (e *soakEnv) execEcho(i int, id string) (string, error) {
	ctx := e.t.Context()
	sr, err := ctrlv1connect.NewSessionServiceClient(e.hc, e.url(i)).CreateDataPlaneSession(ctx, connect.NewRequest(&ctrlv1.CreateDataPlaneSessionRequest{
		Metadata: md("failover-exec-" + time.Now().Format("150405.000000000")), WorkspaceId: id,
		Scopes: []ctrlv1.DataPlaneScope{ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC}}))
	if err != nil {
		return "", err
	}
	tok := sr.Msg.GetSession().GetToken()
	tlsc, err := pki.ClientConfig(pki.DevPathsIn(e.dataDir).CA, "", "")
	if err != nil {
		return "", err
	}
	proc := ctrlv1connect.NewProcessServiceClient(&http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}, Timeout: 20 * time.Second}, e.url(i))
	req := connect.NewRequest(&ctrlv1.StartProcessRequest{WorkspaceId: id, Argv: []string{"echo", "hi"}})
	req.Header().Set("Authorization", "Bearer "+tok)
	st, err := proc.StartProcess(ctx, req)
	if err != nil {
		return "", err
	}
	er := connect.NewRequest(&ctrlv1.ProcessEventsRequest{WorkspaceId: id, ProcessId: st.Msg.GetProcessId()})
	er.Header().Set("Authorization", "Bearer "+tok)
	s, err := proc.ProcessEvents(ctx, er)
	if err != nil {
		return "", err
	}
	defer s.Close()
	var out string
	for s.Receive() {
		out += string(s.Msg().GetOutput().GetData())
	}
	return out, s.Err()
}

// startRealNode enrolls a real kibotos-node named prefix+"-node" with a
// token (CreateEnrollment through replica 0), given both replicas' URLs
// (e has two), with a 2 GiB, 2-CPU capacity; it returns the node's log and
// the replica its stream opened to first.
func (e *soakEnv) startRealNode(prefix string) (*lockedBuffer, int) {
	t := e.t
	enr := ctrlv1connect.NewEnrollmentServiceClient(e.hc, e.url(0))
	cr, err := enr.CreateEnrollment(t.Context(), connect.NewRequest(&ctrlv1.CreateEnrollmentRequest{
		CommandId: prefix + "-enroll", NodeId: prefix + "-node", Ttl: durationpb.New(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(cr.Msg.GetToken()), 0o600); err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	t.Cleanup(func() {
		if err := sandbox.Cleanup(stateDir); err != nil {
			t.Logf("sandbox.Cleanup: %v", err)
		}
	})
	removeBackstop(t, stateDir)
	paths := pki.DevPathsIn(e.dataDir)
	node := exec.Command(nodeBinary(t), "--ctrl", e.url(0), "--ctrl", e.url(1), "--ca", paths.CA, "--enroll-token-file", tokenFile,
		"--state-dir", stateDir, "--guest-binary", filepath.Join(binDir, "kibotos-guest"), "--memory-mib", "2048", "--cpu-millis", "2000")
	logs := &lockedBuffer{}
	node.Stdout, node.Stderr = logs, logs
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Process.Kill(); _ = node.Wait() })

	holder := -1
	for deadline := time.Now().Add(60 * time.Second); holder < 0; time.Sleep(20 * time.Millisecond) {
		for i := range 2 {
			if !streamOpenedAt(logs.String(), e.url(i), time.Time{}).IsZero() {
				holder = i
			}
		}
		if holder < 0 && time.Now().After(deadline) {
			t.Fatalf("the node opened no stream; its log:\n%s", logs)
		}
	}
	return logs, holder
}
