package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/node/template"
	"github.com/kibotos/kibotos/internal/pki"
)

// fleet is a ctrl with its embedded node "local" and a second kibotos-node
// ("second", its own state directory and capacity flags) enrolled through
// the Operator API, as an operator with two machines has them.
type fleet struct {
	t         *testing.T
	ctrl      *ctrlProc
	dataDir   string
	nodes     ctrlv1connect.NodeServiceClient
	artifacts ctrlv1connect.ArtifactServiceClient
	ws        ctrlv1connect.WorkspaceServiceClient
	second    *exited
	secondLog *bytes.Buffer
	startNode func(extra ...string) (*exited, *bytes.Buffer)
}

func startFleet(t *testing.T) *fleet {
	requireRoot(t)
	dataDir := t.TempDir()
	p := startCtrl(t, dataDir, "--guest-binary", filepath.Join(binDir, "kibotos-guest"))
	hc := operatorClient(t, dataDir)
	hc.Timeout = 2 * time.Minute
	f := &fleet{t: t, ctrl: p, dataDir: dataDir,
		nodes:     ctrlv1connect.NewNodeServiceClient(hc, p.url),
		artifacts: ctrlv1connect.NewArtifactServiceClient(hc, p.url),
		ws:        ctrlv1connect.NewWorkspaceServiceClient(hc, p.url)}
	enr := ctrlv1connect.NewEnrollmentServiceClient(hc, p.url)
	ctx := t.Context()
	cr, err := enr.CreateEnrollment(ctx, connect.NewRequest(&ctrlv1.CreateEnrollmentRequest{
		CommandId: "fleet-enroll-second", NodeId: "second", Ttl: durationpb.New(10 * time.Minute)}))
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
	paths := pki.DevPathsIn(dataDir)
	f.startNode = func(extra ...string) (*exited, *bytes.Buffer) {
		args := append([]string{"--ctrl", p.url, "--ca", paths.CA, "--state-dir", stateDir,
			"--guest-binary", filepath.Join(binDir, "kibotos-guest"), "--memory-mib", "2048", "--cpu-millis", "2000"}, extra...)
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
	f.second, f.secondLog = f.startNode("--enroll-token-file", tokenFile)
	f.waitConnected("local", "second")
	return f
}

// waitConnected waits until every node named is connected.
func (f *fleet) waitConnected(ids ...string) {
	f.t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		missing := ""
		for _, id := range ids {
			n, err := f.nodes.GetNode(f.t.Context(), connect.NewRequest(&ctrlv1.GetNodeRequest{NodeId: id}))
			if err != nil || !n.Msg.GetNode().GetConnected() {
				missing = id
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("node %s never connected; second's log:\n%s\nctrl stderr:\n%s", missing, f.secondLog, f.ctrl.stderr)
		}
	}
}

func (f *fleet) node(id string) *ctrlv1.Node {
	f.t.Helper()
	n, err := f.nodes.GetNode(f.t.Context(), connect.NewRequest(&ctrlv1.GetNodeRequest{NodeId: id}))
	if err != nil {
		f.t.Fatal(err)
	}
	return n.Msg.GetNode()
}

func (f *fleet) drain(cid, id string) {
	f.t.Helper()
	if _, err := f.nodes.DrainNode(f.t.Context(), connect.NewRequest(&ctrlv1.DrainNodeRequest{CommandId: cid, NodeId: id,
		ExpectedRegistrationVersion: f.node(id).GetRegistrationVersion()})); err != nil {
		f.t.Fatalf("DrainNode %s: %v", id, err)
	}
}

func (f *fleet) cancelDrain(cid, id string) {
	f.t.Helper()
	if _, err := f.nodes.CancelNodeDrain(f.t.Context(), connect.NewRequest(&ctrlv1.CancelNodeDrainRequest{CommandId: cid, NodeId: id,
		ExpectedRegistrationVersion: f.node(id).GetRegistrationVersion()})); err != nil {
		f.t.Fatalf("CancelNodeDrain %s: %v", id, err)
	}
}

// create creates a Workspace and waits until it is AVAILABLE.
func (f *fleet) create(cid, tmpl, version string) *ctrlv1.Workspace {
	f.t.Helper()
	ctx := f.t.Context()
	cr, err := f.ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md(cid), TemplateId: tmpl, TemplateVersion: version,
		Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}, WritableLayerCapacityBytes: 32 << 20}))
	if err != nil {
		f.t.Fatalf("CreateWorkspace %s: %v", cid, err)
	}
	id := cr.Msg.GetWorkspace().GetWorkspaceId()
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		g, err := f.ws.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			f.t.Fatal(err)
		}
		w := g.Msg.GetWorkspace()
		if w.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			return w
		}
		if w.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED || time.Now().After(deadline) {
			f.t.Fatalf("workspace %s: %v; second's log:\n%s\nctrl stderr:\n%s", cid, w, f.secondLog, f.ctrl.stderr)
		}
	}
}

func (f *fleet) stop(cid string, w *ctrlv1.Workspace) {
	f.t.Helper()
	if _, err := f.ws.StopWorkspace(f.t.Context(), connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Metadata: md(cid),
		WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: w.GetExpiration().GetRevision()})); err != nil {
		f.t.Fatalf("StopWorkspace: %v", err)
	}
}

func (f *fleet) delete(cid string, w *ctrlv1.Workspace) {
	f.t.Helper()
	if _, err := f.ws.DeleteWorkspace(f.t.Context(), connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md(cid),
		WorkspaceId: w.GetWorkspaceId(), ExpectedExpirationRevision: w.GetExpiration().GetRevision()})); err != nil {
		f.t.Fatalf("DeleteWorkspace: %v", err)
	}
}

// publish publishes content as a version of Template tmpl and returns it.
func (f *fleet) publish(cid, tmpl string, content []byte) *ctrlv1.ArtifactVersion {
	f.t.Helper()
	ctx := f.t.Context()
	sum := sha256.Sum256(content)
	ref := &ctrlv1.ArtifactRef{Kind: ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE, ArtifactId: tmpl}
	if _, err := f.artifacts.BeginArtifactPublication(ctx, connect.NewRequest(&ctrlv1.BeginArtifactPublicationRequest{CommandId: cid,
		Artifact: ref, Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR, SizeBytes: uint64(len(content)),
		Digest: "sha256:" + hex.EncodeToString(sum[:])})); err != nil {
		f.t.Fatalf("BeginArtifactPublication: %v", err)
	}
	for off := 0; off < len(content); off += 4 << 20 {
		end := min(off+4<<20, len(content))
		if _, err := f.artifacts.UploadArtifactContent(ctx, connect.NewRequest(&ctrlv1.UploadArtifactContentRequest{CommandId: cid,
			Offset: uint64(off), Data: content[off:end]})); err != nil {
			f.t.Fatalf("UploadArtifactContent: %v", err)
		}
	}
	c, err := f.artifacts.CommitArtifactPublication(ctx, connect.NewRequest(&ctrlv1.CommitArtifactPublicationRequest{CommandId: cid}))
	if err != nil || c.Msg.GetPublication().GetState() != ctrlv1.PublicationState_PUBLICATION_STATE_COMMITTED {
		f.t.Fatalf("CommitArtifactPublication: %v, %v", c, err)
	}
	return c.Msg.GetVersion()
}

// tinyRootfs is a root filesystem tarball: a static busybox as /bin/sh and
// a marker file that tells the version apart.
func tinyRootfs(t *testing.T, marker string) []byte {
	t.Helper()
	bb, err := template.FindBusybox("")
	if err != nil {
		t.Skipf("no static busybox: %v", err)
	}
	bin, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, data []byte) {
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"bin/", "etc/", "tmp/", "root/"} {
		add(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}, nil)
	}
	add(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin))}, bin)
	for _, applet := range []string{"sh", "cat", "echo", "true", "sync", "sleep"} {
		add(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777}, nil)
	}
	for name, body := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n", "etc/group": "root:x:0:\n", "etc/marker": marker + "\n"} {
		add(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}, []byte(body))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// kibo runs the kibo binary against the fleet's ctrl, for 2 minutes at
// most (then it is killed, and the error says so).
func (f *fleet) kibo(args ...string) (string, error) {
	paths := pki.DevPathsIn(f.dataDir)
	ctx, cancel := context.WithTimeout(f.t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, buildBinary(f.t, "kibo"), args...)
	cmd.Env = append(os.Environ(), "KIBO_ENDPOINT="+f.ctrl.url, "KIBO_CA="+paths.CA, "KIBO_CERT="+paths.Operator, "KIBO_KEY="+paths.OperatorKey)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("kibo %q did not end within 2 minutes: %w", args, err)
	}
	return string(out), err
}

// TestFleetOperations: two nodes on this machine. A drained node gets no
// placements; a published Template, made the default, runs on both nodes; a
// version a stopped Workspace still needs is not reclaimed, an unused one
// is; a drained, empty node is retired and its certificate refused.
func TestFleetOperations(t *testing.T) {
	f := startFleet(t)
	ctx := t.Context()

	// Drain "local": placements go to "second".
	f.drain("fleet-drain-local", "local")
	if s := f.node("local").GetState(); s != ctrlv1.NodeState_NODE_STATE_DRAINING {
		t.Fatalf("local after DrainNode: %v", s)
	}
	a := f.create("fleet-ws-a", "", "")
	if got := a.GetPlacement().GetNodeId(); got != "second" {
		t.Fatalf("with local drained, a workspace went to %q", got)
	}

	// A stale registration version is aborted and changes nothing.
	_, err := f.nodes.CancelNodeDrain(ctx, connect.NewRequest(&ctrlv1.CancelNodeDrainRequest{CommandId: "fleet-cancel-stale",
		NodeId: "local", ExpectedRegistrationVersion: f.node("local").GetRegistrationVersion() + 1}))
	if connect.CodeOf(err) != connect.CodeAborted {
		t.Fatalf("CancelNodeDrain with a stale version: %v", err)
	}
	f.cancelDrain("fleet-cancel-local", "local")

	// Publish a Template, make it the default, run it on both nodes.
	v1 := f.publish("fleet:tiny-1", "tiny", tinyRootfs(t, "tiny-1"))
	if _, err := f.artifacts.SetTemplateDefault(ctx, connect.NewRequest(&ctrlv1.SetTemplateDefaultRequest{CommandId: "fleet-default-1",
		TemplateId: "tiny", Revision: v1.GetRevision(), ExpectNoDefault: true})); err != nil {
		t.Fatalf("SetTemplateDefault: %v", err)
	}
	onNode := map[string]*ctrlv1.Workspace{}
	for _, pin := range []struct{ drain, cid string }{{"local", "fleet-tiny-on-second"}, {"second", "fleet-tiny-on-local"}} {
		f.drain("fleet-drain-for-"+pin.cid, pin.drain)
		w := f.create(pin.cid, "tiny", "")
		f.cancelDrain("fleet-cancel-for-"+pin.cid, pin.drain)
		if w.GetTemplate().GetVersion() != "1" {
			t.Errorf("workspace from tiny's default runs version %q", w.GetTemplate().GetVersion())
		}
		out, err := f.kibo("workspace", "exec", w.GetWorkspaceId(), "--", "cat", "/etc/marker")
		if err != nil || strings.TrimSpace(out) != "tiny-1" {
			t.Errorf("cat /etc/marker on %s: %q, %v", w.GetPlacement().GetNodeId(), out, err)
		}
		onNode[w.GetPlacement().GetNodeId()] = w
	}
	if onNode["local"] == nil || onNode["second"] == nil {
		t.Fatalf("tiny ran on %v, not on both nodes", onNode)
	}
	// "second" fetched tiny version 1 for its Workspace, after its Hello:
	// GetNode lists it within seconds (the node's Inventory), no reconnect.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := f.node("second")
		held := false
		for _, a := range n.GetTemplates() {
			held = held || (a.GetArtifactId() == "tiny" && a.GetVersion() == "1")
		}
		if held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetNode(second).templates = %v, without tiny version 1", n.GetTemplates())
		}
	}

	// Version 2 becomes the default; version 1 is still needed by a
	// stopped Workspace.
	v2 := f.publish("fleet:tiny-2", "tiny", tinyRootfs(t, "tiny-2"))
	if _, err := f.artifacts.SetTemplateDefault(ctx, connect.NewRequest(&ctrlv1.SetTemplateDefaultRequest{CommandId: "fleet-default-2",
		TemplateId: "tiny", Revision: v2.GetRevision(), ExpectedRevision: v1.GetRevision()})); err != nil {
		t.Fatalf("SetTemplateDefault 2: %v", err)
	}
	f.stop("fleet-stop-on-local", onNode["local"])
	f.delete("fleet-del-on-second", onNode["second"])
	reclaim := func(cid string, rev uint64) error {
		_, err := f.artifacts.ApplyArtifactReclamation(ctx, connect.NewRequest(&ctrlv1.ApplyArtifactReclamationRequest{CommandId: cid,
			Artifact: &ctrlv1.ArtifactRef{Kind: ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE, ArtifactId: "tiny"}, Revision: rev}))
		return err
	}
	if err := reclaim("fleet-reclaim-1-early", v1.GetRevision()); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("reclaiming a version a stopped workspace needs: %v", err)
	}
	if err := reclaim("fleet-reclaim-2", v2.GetRevision()); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("reclaiming the default: %v", err)
	}
	f.delete("fleet-del-on-local", onNode["local"])
	if err := reclaim("fleet-reclaim-1", v1.GetRevision()); err != nil {
		t.Fatalf("reclaiming a version no workspace uses: %v", err)
	}

	// A corrupted publication is refused and never reaches a node.
	bad := tinyRootfs(t, "bad")
	sum := sha256.Sum256(append([]byte("other"), bad...))
	ref := &ctrlv1.ArtifactRef{Kind: ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE, ArtifactId: "tiny"}
	if _, err := f.artifacts.BeginArtifactPublication(ctx, connect.NewRequest(&ctrlv1.BeginArtifactPublicationRequest{CommandId: "fleet:bad",
		Artifact: ref, Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR, SizeBytes: uint64(len(bad)), Digest: "sha256:" + hex.EncodeToString(sum[:])})); err != nil {
		t.Fatal(err)
	}
	if _, err := f.artifacts.UploadArtifactContent(ctx, connect.NewRequest(&ctrlv1.UploadArtifactContentRequest{CommandId: "fleet:bad", Data: bad})); err != nil {
		t.Fatal(err)
	}
	c, err := f.artifacts.CommitArtifactPublication(ctx, connect.NewRequest(&ctrlv1.CommitArtifactPublicationRequest{CommandId: "fleet:bad"}))
	if err == nil && c.Msg.GetPublication().GetState() != ctrlv1.PublicationState_PUBLICATION_STATE_FAILED {
		t.Fatalf("a publication with the wrong digest: %v", c.Msg)
	}

	// Retire "second": drained and empty; its certificate is refused.
	f.delete("fleet-del-a", a)
	f.drain("fleet-drain-second", "second")
	if _, err := f.nodes.RetireNode(ctx, connect.NewRequest(&ctrlv1.RetireNodeRequest{CommandId: "fleet-retire-second",
		NodeId: "second", ExpectedRegistrationVersion: f.node("second").GetRegistrationVersion()})); err != nil {
		t.Fatalf("RetireNode: %v", err)
	}
	_ = f.second.cmd.Process.Signal(os.Interrupt)
	select {
	case <-f.second.done:
	case <-time.After(20 * time.Second):
		_ = f.second.cmd.Process.Kill()
	}
	again, log := f.startNode()
	select {
	case <-again.done:
		var ee *exec.ExitError
		if err := again.err; !errors.As(err, &ee) {
			t.Fatalf("the retired node exited with %v; log:\n%s", err, log)
		}
	case <-time.After(10 * time.Second):
		if n := f.node("second"); n.GetConnected() {
			t.Fatalf("the retired node connected again; log:\n%s", log)
		}
	}
	if s := f.node("second").GetState(); s != ctrlv1.NodeState_NODE_STATE_RETIRED {
		t.Fatalf("second after RetireNode: %v", s)
	}
}

// exited is a started process's end: one goroutine calls its Wait, once, for
// every caller (two Waits of one exec.Cmd at once race, and one can block
// forever: a test's and its clean-up's hung CI).
type exited struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when Wait returned
	err  error         // Wait's error, once done is closed
}

// waitExit starts the one Wait of cmd, which has started.
func waitExit(cmd *exec.Cmd) *exited {
	e := &exited{cmd: cmd, done: make(chan struct{})}
	go func() {
		e.err = cmd.Wait()
		close(e.done)
	}()
	return e
}
