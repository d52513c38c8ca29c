package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/pki"
)

// TestHostMemoryStopsLargest drives a real node into memory pressure: a
// node with a host memory budget of 512 MiB overcommitted 4 times (it
// advertises 2048 MiB, so placement admits a 1536 MiB workspace and a
// 128 MiB one beside it), the large workspace fills 600 MiB of its
// /dev/shm, the node reports CRITICAL, and ctrl stops that workspace with
// a normal stop recorded as host-memory/<node>/1/<workspace> (kind STOP,
// initiator HOST_MEMORY, completed without error), not before it ran
// reconciler.HostMemoryMinAge, while the small one keeps running; the
// episode then ends.
func TestHostMemoryStopsLargest(t *testing.T) {
	requireRoot(t)
	const nodeID = "mem-node"
	work := t.TempDir()
	dataDir, nodeRoot := filepath.Join(work, "d"), filepath.Join(work, "n")
	for _, d := range []string{dataDir, nodeRoot} {
		must(t, os.MkdirAll(d, 0o700))
	}
	t.Cleanup(func() {
		if err := sandbox.Cleanup(nodeRoot); err != nil {
			t.Logf("sandbox.Cleanup: %v", err)
		}
	})
	removeBackstop(t, nodeRoot)
	ctrlLog, err := os.Create(filepath.Join(work, "ctrl.log"))
	must(t, err)
	nodeLog, err := os.Create(filepath.Join(work, "node.log"))
	must(t, err)
	addr := freePort(t)
	url := "https://" + addr
	ctrl := &faultProc{name: "kibotos-ctrl", path: filepath.Join(binDir, "kibotos-ctrl"), logf: ctrlLog, ready: "kibotos-ctrl is serving on ",
		args: []string{"--dev", "--dev-no-node", "--data-dir", dataDir, "--listen", addr, "--log-level", "debug"}}
	t.Cleanup(ctrl.kill)
	must(t, ctrl.start())
	paths := pki.DevPathsIn(dataDir)
	nodeCert, nodeKey := filepath.Join(work, "node.pem"), filepath.Join(work, "node-key.pem")
	must(t, pki.IssueClient(paths.CA, paths.CAKey, nodeID, pki.RoleNode, time.Hour, nodeCert, nodeKey))
	node := &faultProc{name: "kibotos-node", path: nodeBinary(t), logf: nodeLog, args: []string{
		"--ctrl", url, "--ca", paths.CA, "--cert", nodeCert, "--key", nodeKey,
		"--state-dir", nodeRoot, "--guest-binary", filepath.Join(binDir, "kibotos-guest"),
		"--memory-mib", "512", "--memory-overcommit-ratio", "4", "--log-level", "debug"}}
	t.Cleanup(node.kill)
	must(t, node.start())
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{ctrlLog.Name(), nodeLog.Name()} {
				b, _ := os.ReadFile(f)
				if len(b) > 16000 {
					b = b[len(b)-16000:]
				}
				t.Logf("tail of %s:\n%s", filepath.Base(f), b)
			}
		}
	})

	tlsc, err := pki.ClientConfig(paths.CA, paths.Operator, paths.OperatorKey)
	must(t, err)
	hc := &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}}
	ws := ctrlv1connect.NewWorkspaceServiceClient(hc, url)
	info := ctrlv1connect.NewServerInfoServiceClient(hc, url)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		res, err := info.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err == nil && slices.Contains(res.Msg.GetCapabilities(), "workspace.exec") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node never registered (last error %v)", err)
		}
	}
	ptls, err := pki.ClientConfig(paths.CA, "", "")
	must(t, err)
	proc := ctrlv1connect.NewProcessServiceClient(&http.Client{Transport: &http2.Transport{TLSClientConfig: ptls}}, url)
	sessions := ctrlv1connect.NewSessionServiceClient(hc, url)

	// Placement admits 1664 MiB of limits on a node whose budget is
	// 512 MiB: it advertises 512 × 4.
	create := func(name string, mib uint32) *dpEnv {
		cr, err := ws.CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
			Metadata: md("mem-" + name), Resources: &ctrlv1.Resources{MemoryMib: mib, CpuMillis: 500}, WritableLayerCapacityBytes: 64 << 20}))
		if err != nil {
			t.Fatalf("CreateWorkspace(%s, %d MiB): %v", name, mib, err)
		}
		return &dpEnv{t: t, dataDir: dataDir, nodeRoot: nodeRoot, p: &ctrlProc{url: url, stderr: &lockedBuffer{}},
			ws: ws, sessions: sessions, proc: proc, id: cr.Msg.GetWorkspace().GetWorkspaceId()}
	}
	big, small := create("big", 1536), create("small", 128)
	big.waitReady()
	small.waitReady()
	started := time.Now()
	if n := big.get().GetPlacement().GetNodeId(); n != nodeID {
		t.Fatalf("big placed on %q, want %s", n, nodeID)
	}
	smallTok, bigTok := small.token(), big.token()
	small.mustRun(smallTok, "dd", "if=/dev/zero", "of=/dev/shm/some", "bs=1M", "count=16")

	// 600 MiB of tmpfs are memory charged to big's cgroup: 117 % of the
	// budget.
	big.mustRun(bigTok, "dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=600")
	filled := time.Now()
	t.Logf("big filled 600 MiB of /dev/shm %v after it was ready", filled.Sub(started).Round(time.Millisecond))

	deadline := time.Now().Add(2 * time.Minute)
	var w *ctrlv1.Workspace
	for {
		w = big.get()
		if w.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("big was not stopped within 2 minutes of filling its memory: state %v", w.GetState())
		}
		time.Sleep(200 * time.Millisecond)
	}
	stoppedAt := time.Now()
	t.Logf("big STOPPED %v after it was filled, %v after it was ready", stoppedAt.Sub(filled).Round(time.Millisecond),
		stoppedAt.Sub(started).Round(time.Millisecond))
	// The host-memory policy spares workspaces that started less than 30 s
	// ago (the node lists big from its first heartbeat after the start, at
	// most 5 s later).
	if d := stoppedAt.Sub(started); d < 25*time.Second {
		t.Errorf("big was stopped %v after it started, before the policy's 30 s", d)
	}

	id := fmt.Sprintf("host-memory/%s/1/%s", nodeID, big.id)
	got, err := ws.GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: id}))
	if err != nil {
		t.Fatalf("GetWorkspaceCommand(%s): %v", id, err)
	}
	c := got.Msg.GetCommand()
	if c.GetWorkspaceId() != big.id || c.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP ||
		c.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_HOST_MEMORY ||
		c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED || c.GetError() != nil {
		t.Errorf("GetWorkspaceCommand(%s) = %v, want a completed STOP of %s by HOST_MEMORY without error", id, c, big.id)
	}
	// It says why: the node's use against its budget, big's use, the
	// policy's choice.
	why := regexp.MustCompile(`^host memory: node mem-node used \d+ MiB of its 512 MiB budget \(CRITICAL\); stopped as the largest user \((\d+) MiB\) ` +
		`among AVAILABLE workspaces listed 30 s or more; stop 1 of at most 8 in episode host-memory/mem-node/1$`)
	if m := why.FindStringSubmatch(c.GetMessage()); m == nil {
		t.Errorf("message of %s = %q, want it to match %s", id, c.GetMessage(), why)
	} else if used, _ := strconv.Atoi(m[1]); used < 500 {
		t.Errorf("message of %s = %q: big used %d MiB, want 500 or more (it filled 600 MiB of its /dev/shm)", id, c.GetMessage(), used)
	}
	// A normal stop: no forced one was needed.
	if _, err := ws.GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: id + "/force"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("GetWorkspaceCommand(%s/force) = %v, want not_found", id, err)
	}
	smallID := fmt.Sprintf("host-memory/%s/1/%s", nodeID, small.id)
	if _, err := ws.GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: smallID})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("GetWorkspaceCommand(%s) = %v, want not_found: the small workspace is not a victim", smallID, err)
	}

	// The episode ends on the next heartbeat (the shm went with the
	// execution); the small workspace still runs and answers.
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		b, _ := os.ReadFile(ctrlLog.Name())
		if strings.Contains(string(b), "host memory: episode ended") {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no \"episode ended\" in ctrl's log within 30 s of the stop")
		}
	}
	if st := small.get().GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Errorf("small = %v, want AVAILABLE", st)
	}
	if out := small.mustRun(smallTok, "cat", "/proc/self/cgroup"); out == "" {
		t.Errorf("small does not run processes any more")
	}
	b, _ := os.ReadFile(ctrlLog.Name())
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "host memory:") {
			t.Log(line)
		}
	}
	for _, want := range []string{"host memory: episode opened", "host memory: stopping a workspace", big.id} {
		if !strings.Contains(string(b), want) {
			t.Errorf("ctrl's log lacks %q", want)
		}
	}
}
