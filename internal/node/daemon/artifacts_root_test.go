package daemon

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/node/template"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// TestPublishedTemplateAndPlatform, as root with real workspaces: a start
// of a published template version the node lacks fetches the archive from
// ctrl (a tar.gz of a rootfs), extracts it and runs from it; with a
// desired Platform, new executions boot with the Platform's guest (PID 1's
// bytes are the Platform's), the execution started before keeps the
// node's own; the version reclaimed while an execution runs from it stays
// until the execution is gone.
func TestPublishedTemplateAndPlatform(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
	bb, err := template.FindBusybox("")
	if err != nil {
		t.Skipf("needs busybox-static: %v", err)
	}
	dir := t.TempDir()
	build := func(out string, args ...string) {
		cmd := exec.Command("go", append(append([]string{"build"}, args...), "-o", out, "github.com/kibotos/kibotos/cmd/kibotos-guest")...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build kibotos-guest: %v\n%s", err, b)
		}
	}
	guestBin := filepath.Join(dir, "kibotos-guest")
	build(guestBin, "-trimpath")
	// The Platform: the same guest built otherwise, so its bytes differ.
	platBin := filepath.Join(dir, "platform-guest")
	build(platBin, "-trimpath", "-ldflags=-s -w")
	defRoot, err := template.EnsureDefault(filepath.Join(dir, "build-templates"), guestBin, bb)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "rootfs.tar.gz")
	if out, err := exec.Command("tar", "--numeric-owner", "-C", defRoot, "-czf", archive, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	tarGz, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	plat, err := os.ReadFile(platBin)
	if err != nil {
		t.Fatal(err)
	}

	root := filepath.Join(dir, "node")
	rt, err := sandbox.New(sandbox.Config{Root: root, GuestBinary: guestBin, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.Close()
		_ = sandbox.Cleanup(root)
	})
	tmplDir := filepath.Join(dir, "templates")
	r := NewRuntime(rt, tmplDir)
	var inUse []string
	a, c := newTestArtifacts(t, &inUse)
	a.templates, a.executions = tmplDir, r.executionRootfs
	r.art = a
	ctx := context.Background()
	src := &nodev1.ArtifactSource{Digest: c.put(tarGz), SizeBytes: uint64(len(tarGz)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR_GZIP}
	spec := func(ws string) agent.Spec {
		return agent.Spec{WorkspaceID: ws, Generation: 1, TemplateID: "busybox", TemplateVersion: "1", TemplateSource: src,
			CapacityBytes: 64 << 20, MemoryMiB: 128, CPUMillis: 1000}
	}
	pid1 := func(ws string) [32]byte {
		t.Helper()
		st, ok := rt.Status(ws)
		if !ok {
			t.Fatalf("%s does not run", ws)
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(st.PID) + "/exe")
		if err != nil {
			t.Fatal(err)
		}
		return sha256.Sum256(b)
	}
	if err := r.Start(ctx, spec("ws-pub-1")); err != nil {
		t.Fatal(err)
	}
	defer r.Delete(ctx, "ws-pub-1")
	out, _, code, err := rt.Exec(ctx, "ws-pub-1", []string{"cat", "/etc/kibotos-template"})
	if err != nil || code != 0 {
		t.Fatalf("exec: %v %d", err, code)
	}
	t.Logf("the published rootfs says: %s", out)
	own, _ := os.ReadFile(guestBin)
	if pid1("ws-pub-1") != sha256.Sum256(own) {
		t.Error("PID 1 is not the node's own guest")
	}

	a.SetPlatform(&nodev1.DesiredPlatform{PlatformId: "sandbox", Version: "2", ProtocolVersion: nodewire.GuestProtocolVersion,
		Source: &nodev1.ArtifactSource{Digest: c.put(plat), SizeBytes: uint64(len(plat)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF}})
	if err := r.Start(ctx, spec("ws-pub-2")); err != nil {
		t.Fatal(err)
	}
	defer r.Delete(ctx, "ws-pub-2")
	if pid1("ws-pub-2") != sha256.Sum256(plat) {
		t.Error("PID 1 of a new execution is not the Platform's guest")
	}
	if pid1("ws-pub-1") != sha256.Sum256(own) {
		t.Error("the running execution changed guest")
	}

	a.Reclaim([]string{src.Digest})
	a.reclaimPending()
	rootfs := template.Path(tmplDir, "busybox", "1")
	if _, err := os.Stat(rootfs); err != nil {
		t.Fatalf("reclaimed under running executions: %v", err)
	}
	for _, ws := range []string{"ws-pub-1", "ws-pub-2"} {
		if err := r.Stop(ctx, ws, true); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.reclaimPending(); time.Now().Before(deadline); a.reclaimPending() {
		if _, err := os.Stat(rootfs); os.IsNotExist(err) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("the reclaimed version outlived its executions")
}
