package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/pki"
)

var (
	binMu    sync.Mutex
	binBuilt = map[string]error{}
)

// buildBinary builds cmd/NAME into the directory TestMain built the others
// in (once per test binary run; TestMain removes the directory).
func buildBinary(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(binDir, name)
	binMu.Lock()
	defer binMu.Unlock()
	err, done := binBuilt[name]
	if !done {
		cmd := exec.Command("go", "build", "-buildvcs=true", "-o", path, "../../cmd/"+name)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("build %s: %v\n%s", name, berr, out)
		}
		binBuilt[name] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNodeEnrollment is the operator's path to a second machine, with the
// real binaries: kibo creates an enrollment token, kibotos-node presents it
// once, keeps its certificate, runs a workspace, and restarts without the
// token; the used token enrolls nothing else.
func TestNodeEnrollment(t *testing.T) {
	requireRoot(t)
	dataDir := t.TempDir()
	p := startCtrl(t, dataDir, "--dev-no-node")
	paths := pki.DevPathsIn(dataDir)
	kibo := func(args ...string) (string, string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // a hang fails the test
		defer cancel()
		cmd := exec.CommandContext(ctx, buildBinary(t, "kibo"), args...)
		cmd.Env = append(os.Environ(), "KIBO_ENDPOINT="+p.url, "KIBO_CA="+paths.CA, "KIBO_CERT="+paths.Operator, "KIBO_KEY="+paths.OperatorKey)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	stdout, stderr, err := kibo("enrollment", "create", "--node-id", "e2e-node", "--ttl", "10m", "-o", "json")
	if err != nil {
		t.Fatalf("kibo enrollment create: %v\n%s", err, stderr)
	}
	var created struct {
		Token      string `json:"token"`
		Enrollment struct {
			EnrollmentID string `json:"enrollmentId"`
		} `json:"enrollment"`
	}
	if err := json.Unmarshal([]byte(stdout), &created); err != nil || created.Token == "" {
		t.Fatalf("kibo enrollment create printed %q (%v)", stdout, err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(created.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	stateDir := t.TempDir()
	// Runs after the node is killed (cleanups run last first): a failed
	// test leaves no execution behind.
	t.Cleanup(func() {
		if err := sandbox.Cleanup(stateDir); err != nil {
			t.Logf("sandbox.Cleanup: %v", err)
		}
	})
	removeBackstop(t, stateDir)
	startNode := func(extra ...string) (*exited, *bytes.Buffer) {
		args := append([]string{"--ctrl", p.url, "--ca", paths.CA, "--state-dir", stateDir,
			"--guest-binary", filepath.Join(binDir, "kibotos-guest")}, extra...)
		cmd := exec.Command(nodeBinary(t), args...)
		var logs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		// A workspace process that outlives the killed node may hold its
		// output pipe: Wait must not wait for it (it hung CI for 15 min).
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		e := waitExit(cmd)
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-e.done })
		return e, &logs
	}
	node, nodeLog := startNode("--enroll-token-file", tokenFile)

	hc := operatorClient(t, dataDir)
	info := ctrlv1connect.NewServerInfoServiceClient(hc, p.url)
	ws := ctrlv1connect.NewWorkspaceServiceClient(hc, p.url)
	ctx := t.Context()
	waitCap := func() {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			res, err := info.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
			if err == nil && contains(res.Msg.GetCapabilities(), "workspace.create") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the enrolled node never registered; node log:\n%s\nctrl stderr:\n%s", nodeLog, p.stderr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitCap()
	cert := filepath.Join(stateDir, "pki", "node.pem")
	leaf, err := pki.LoadLeaf(cert)
	if err != nil || leaf.Subject.CommonName != "e2e-node" {
		t.Fatalf("node certificate %s: %v, %v", cert, leaf, err)
	}
	if fi, err := os.Stat(filepath.Join(stateDir, "pki", "node-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("node key: %v, %v; want mode 0600", fi, err)
	}
	stdout, _, err = kibo("enrollment", "get", created.Enrollment.EnrollmentID)
	if err != nil || !strings.Contains(stdout, "used") || !strings.Contains(stdout, "by node e2e-node") || strings.Contains(stdout, created.Token) {
		t.Errorf("kibo enrollment get after use: %v\n%s", err, stdout)
	}

	// A workspace runs on the enrolled node.
	cr, err := ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md("enroll-ws-1"), Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}, WritableLayerCapacityBytes: 32 << 20,
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := cr.Msg.GetWorkspace().GetWorkspaceId()
	deadline := time.Now().Add(60 * time.Second)
	for {
		g, err := ws.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			t.Fatal(err)
		}
		if g.Msg.GetWorkspace().GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace stayed %v; node log:\n%s", g.Msg.GetWorkspace().GetState(), nodeLog)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Restart the node without the token: it keeps its certificate and
	// re-adopts the running workspace.
	_ = node.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-node.done:
	case <-time.After(30 * time.Second):
		_ = node.cmd.Process.Signal(syscall.SIGQUIT) // every goroutine's stack into its log, and the end
		select {
		case <-node.done:
		case <-time.After(5 * time.Second):
			_ = node.cmd.Process.Kill()
			<-node.done
		}
		t.Fatalf("kibotos-node did not end within 30 s of SIGTERM; its log:\n%s", nodeLog)
	}
	_, nodeLog = startNode()
	waitCap()
	if _, err := ws.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("enroll-ws-1-del"), WorkspaceId: id, ExpectedExpirationRevision: 1})); err != nil {
		t.Fatalf("DeleteWorkspace after the node restarted: %v; node log:\n%s", err, nodeLog)
	}
	if strings.Contains(nodeLog.String(), created.Token) || strings.Contains(p.stderr.String(), created.Token) {
		t.Error("a log holds the enrollment token")
	}

	// The used token enrolls no other machine.
	other := exec.Command(nodeBinary(t), "--ctrl", p.url, "--ca", paths.CA, "--state-dir", t.TempDir(), "--enroll-token", created.Token)
	out, err := other.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "already used") {
		t.Errorf("a second machine with the used token: %v\n%s", err, out)
	}
	// Without a certificate or a token the node says what to do.
	none := exec.Command(nodeBinary(t), "--ctrl", p.url, "--ca", paths.CA, "--state-dir", t.TempDir())
	out, err = none.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "kibo enrollment create") {
		t.Errorf("a node without certificate or token: %v\n%s", err, out)
	}
}
