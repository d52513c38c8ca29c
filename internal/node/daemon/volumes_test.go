package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/node/template"
)

// TestNodeStorage: the node's storage through the adapter the agent uses,
// as root with a real workspace: a Volume made, mounted at its path from
// the start and written; the workspace stopped, its layer grown in place
// (Resize) with a checksum of what it held kept and the new size in its
// status; the Volume grown and read back after the next start; what no
// retry can fix (a smaller capacity, beyond the node's pool) marked
// permanent for the agent; a Volume refused while mounted, not
// permanently.
func TestNodeStorage(t *testing.T) {
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
	guestBin := filepath.Join(dir, "kibotos-guest")
	build := exec.Command("go", "build", "-trimpath", "-o", guestBin, "github.com/kibotos/kibotos/cmd/kibotos-guest")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build kibotos-guest: %v\n%s", err, out)
	}
	tmplDir := filepath.Join(dir, "templates")
	if _, err := template.EnsureDefault(tmplDir, guestBin, bb); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "node")
	rt, err := sandbox.New(sandbox.Config{Root: root, GuestBinary: guestBin, StorageBytes: 512 << 20,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.Close()
		_ = sandbox.Cleanup(root)
	})
	r := NewRuntime(rt, tmplDir)
	var _ agent.VolumeRuntime = r
	ctx := context.Background()
	const ws, vol = "ws-daemon-storage", "vol-daemon"
	sh := func(script string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, serr, code, err := rt.Exec(ctx, ws, []string{"sh", "-c", script})
		if err != nil || code != 0 {
			t.Fatalf("%q: exit %d %v: %s%s", script, code, err, out, serr)
		}
		return string(out)
	}

	if err := r.EnsureVolume(ctx, vol, 32<<20); err != nil {
		t.Fatal(err)
	}
	if st := r.VolumeStatus(vol); !st.Exists || st.CapacityBytes != 32<<20 || st.Mounted {
		t.Fatalf("VolumeStatus = %+v", st)
	}
	spec := agent.Spec{WorkspaceID: ws, Generation: 1, TemplateID: "default", CapacityBytes: 64 << 20, MemoryMiB: 128, CPUMillis: 1000,
		Volume: &agent.VolumeMount{VolumeID: vol, MountPath: "/mnt/vol"}}
	if err := r.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if st := r.Status(ws); !st.Running || !st.LayerExists || st.LayerCapacityBytes != 64<<20 {
		t.Errorf("status while running: %+v", st)
	}
	sh("dd if=/dev/urandom of=/root/blob bs=1M count=8 2>/dev/null && md5sum /root/blob > /root/blob.md5 && " +
		"cp /root/blob /mnt/vol/blob && cd /mnt/vol && md5sum blob > blob.md5")
	if st := r.VolumeStatus(vol); !st.Mounted {
		t.Errorf("VolumeStatus while mounted = %+v", st)
	}
	if l := r.Volumes(); len(l) != 1 || l[0].VolumeID != vol || !l[0].Mounted || l[0].CapacityBytes != 32<<20 {
		t.Errorf("Volumes() = %+v", l)
	}
	for what, err := range map[string]error{
		"grow while mounted":   r.EnsureVolume(ctx, vol, 64<<20),
		"delete while mounted": r.DeleteVolume(ctx, vol),
	} {
		if err == nil || errors.Is(err, agent.ErrPermanent) {
			t.Errorf("%s = %v, want a failure a later retry may pass", what, err)
		}
	}
	if err := r.Stop(ctx, ws, false); err != nil {
		t.Fatal(err)
	}

	// The layer grows in place.
	t0 := time.Now()
	if err := r.Resize(ctx, ws, 192<<20); err != nil {
		t.Fatal(err)
	}
	t.Logf("layer 64 → 192 MiB holding 8 MiB: %v", time.Since(t0))
	if st := r.Status(ws); st.Running || !st.LayerExists || st.LayerCapacityBytes != 192<<20 {
		t.Errorf("status after the resize: %+v", st)
	}
	for what, err := range map[string]error{
		"a smaller layer":             r.Resize(ctx, ws, 128<<20),
		"a layer beyond the pool":     r.Resize(ctx, ws, 512<<20),
		"a smaller Volume":            r.EnsureVolume(ctx, vol, 16<<20),
		"a Volume beyond the pool":    r.EnsureVolume(ctx, "vol-big", 400<<20),
		"a Volume id that is no name": r.EnsureVolume(ctx, "../etc", 16<<20),
	} {
		if !errors.Is(err, agent.ErrPermanent) {
			t.Errorf("%s = %v, want permanent", what, err)
		}
	}
	if err := r.EnsureVolume(ctx, vol, 64<<20); err != nil {
		t.Fatal(err)
	}
	spec.Generation = 2
	if err := r.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	sh("md5sum -c /root/blob.md5 >/dev/null && cd /mnt/vol && md5sum -c blob.md5 >/dev/null")
	kib := func(s string) int { n, _ := strconv.Atoi(s); return n }
	if got := strings.Fields(sh("df -k / /mnt/vol | tail -2")); len(got) < 8 || kib(got[1]) < 150000 || kib(got[7]) < 50000 {
		t.Errorf("df after the growths (KiB): %v", got)
	}
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
	if err := r.DeleteVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
	if st := r.VolumeStatus(vol); st.Exists {
		t.Errorf("after delete: %+v", st)
	}
	if leaks, err := sandbox.Leaks(root); err != nil || len(leaks) > 0 {
		t.Errorf("leaks: %v %v", leaks, err)
	}
}
