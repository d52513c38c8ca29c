package daemon

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/node/template"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// TestHostilePlatformGuest, as root with real workspaces: the Platform is
// the sandbox's hostile helper declaring the node's guest protocol, which
// as PID 1 answers the handshake as its workspace ID's last part says
// (the test chooses the IDs). A start whose Platform guest states another
// protocol version runs with the node's own guest; the Platform is no
// longer listed, the same DesiredPlatform does not bring it back, and a
// Platform of another digest is booted.
func TestHostilePlatformGuest(t *testing.T) {
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
	build := func(out, pkg string) []byte {
		t.Helper()
		cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, b)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	guestBin := filepath.Join(dir, "kibotos-guest")
	own := build(guestBin, "github.com/kibotos/kibotos/cmd/kibotos-guest")
	hostile := append(build(filepath.Join(dir, "hostile"), "github.com/kibotos/kibotos/internal/node/sandbox/testdata/hostile"),
		nodewire.GuestProtocolDeclaration...)
	tmplDir := filepath.Join(dir, "templates")
	if _, err := template.EnsureDefault(tmplDir, guestBin, bb); err != nil {
		t.Fatal(err)
	}

	root := filepath.Join(dir, "node")
	rt, err := sandbox.New(sandbox.Config{Root: root, GuestBinary: guestBin, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.Close()
		_ = sandbox.Cleanup(root)
	})
	r := NewRuntime(rt, tmplDir)
	var inUse []string
	a, c := newTestArtifacts(t, &inUse)
	a.templates, a.executions = tmplDir, r.executionRootfs
	a.changed = r.inventoryChanged
	r.art = a
	ctx := context.Background()
	desired := func(version string, b []byte) *nodev1.DesiredPlatform {
		return &nodev1.DesiredPlatform{PlatformId: "sandbox", Version: version, ProtocolVersion: nodewire.GuestProtocolVersion,
			Source: &nodev1.ArtifactSource{Digest: c.put(b), SizeBytes: uint64(len(b)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF}}
	}
	start := func(ws string) [32]byte {
		t.Helper()
		err := r.Start(ctx, agent.Spec{WorkspaceID: ws, Generation: 1, TemplateID: template.DefaultName,
			CapacityBytes: 64 << 20, MemoryMiB: 128, CPUMillis: 1000})
		if err != nil {
			t.Fatalf("start %s: %v", ws, err)
		}
		t.Cleanup(func() { _ = r.Delete(ctx, ws) })
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
	listed := func(digest string) bool {
		for _, p := range r.Platforms() {
			if p.GetDigest() == digest {
				return true
			}
		}
		return false
	}

	bad := desired("2", hostile)
	r.SetPlatform(bad)
	if pid1 := start("ws-plat-protoother"); pid1 != sha256.Sum256(own) {
		t.Error("PID 1 is not the node's own guest after the Platform failed the handshake")
	}
	if listed(bad.Source.Digest) {
		t.Error("the refused Platform is still listed")
	}
	r.SetPlatform(nil)
	r.SetPlatform(desired("2", hostile))
	if pid1 := start("ws-plat-again"); pid1 != sha256.Sum256(own) {
		t.Error("the refused Platform was booted again")
	}
	if listed(bad.Source.Digest) {
		t.Error("the refused Platform is listed again")
	}
	other := append(append([]byte(nil), hostile...), "another build"...)
	r.SetPlatform(desired("3", other))
	if pid1 := start("ws-plat-new"); pid1 != sha256.Sum256(other) {
		t.Error("the Platform of a new digest was not booted")
	}
	if !listed(desired("3", other).Source.Digest) {
		t.Error("the Platform of a new digest is not listed")
	}
}
