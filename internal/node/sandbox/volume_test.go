package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/mountinfo"
)

func TestCheckMountPath(t *testing.T) {
	for p, ok := range map[string]bool{
		"/data": true, "/home/user/work": true, "/tmp/x": true, "/procfs": true, "/a b": true,
		"": false, "data": false, "/": false, "/data/": false, "/a//b": false, "/a/./b": false,
		"/a/../b": false, "/..": false, "/proc": false, "/proc/x": false, "/sys/fs": false, "/dev": false,
		"/dev/shm": false, "/a\x00b": false, "/" + strings.Repeat("a", 256): false,
		"/" + strings.Repeat("a/", 2048) + "a": false,
	} {
		err := CheckMountPath(p)
		if (err == nil) != ok {
			t.Errorf("CheckMountPath(%q) = %v, want ok=%v", p, err, ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("CheckMountPath(%q) = %v, not ErrInvalidSpec", p, err)
		}
	}
}

func FuzzCheckMountPath(f *testing.F) {
	for _, s := range []string{"/data", "/", "/proc", "/a/../b", "/tmp/x", "relative", "/a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if CheckMountPath(p) != nil {
			return
		}
		// What passes is absolute, clean, below / and outside the shim's
		// own mounts, with components the shim's walk accepts.
		if !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" || len(p) > 4095 {
			t.Fatalf("accepted %q", p)
		}
		for _, c := range strings.Split(p[1:], "/") {
			if c == "" || c == "." || c == ".." || len(c) > 255 || strings.ContainsRune(c, 0) {
				t.Fatalf("accepted %q (component %q)", p, c)
			}
		}
		for _, r := range reservedMountPaths {
			if under(p, r) {
				t.Fatalf("accepted %q under %s", p, r)
			}
		}
	})
}

func TestVolumeIDs(t *testing.T) {
	r, _ := newRuntime(t)
	ctx := context.Background()
	for _, id := range []string{"", "../x", "a/b", ".hidden", "vol-" + strings.Repeat("x", 70), "a\x00"} {
		if _, err := r.EnsureVolume(ctx, id, 16<<20); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("EnsureVolume(%q) = %v, want ErrInvalidSpec", id, err)
		}
		if err := r.DeleteVolume(ctx, id); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("DeleteVolume(%q) = %v, want ErrInvalidSpec", id, err)
		}
		s := testSpec("ws-badvol")
		s.Volume = &VolumeMount{VolumeID: id, MountPath: "/data"}
		if err := r.Start(ctx, s); !errors.Is(err, ErrInvalidSpec) || !Permanent(err) {
			t.Errorf("Start with volume %q = %v, want a permanent ErrInvalidSpec", id, err)
		}
	}
	for _, c := range []uint64{0, 1 << 20, 16<<20 + 1} {
		if _, err := r.EnsureVolume(ctx, "vol-c", c); !errors.Is(err, ErrCapacity) {
			t.Errorf("EnsureVolume(capacity %d) = %v, want ErrCapacity", c, err)
		}
	}
	if v := r.Volumes(); len(v) != 0 {
		t.Errorf("Volumes() = %+v after refusals", v)
	}
}

// volumeMounts lists the host's mounts whose source is a loop device
// backed by img (there must be none: the Volume is mounted inside the
// execution only).
func hostMountsOf(t *testing.T, img string) []string {
	t.Helper()
	loops, err := attachedLoops(img, false)
	if err != nil {
		t.Fatal(err)
	}
	mounts, err := mountinfo.ReadSelf()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range mounts {
		for _, l := range loops {
			if m.Source == l.Dev {
				out = append(out, m.MountPoint)
			}
		}
	}
	return out
}

func TestVolumeMountedWrittenBackGrownDeleted(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	const ws, vol = "ws-vol", "vol-data"

	st, err := r.EnsureVolume(ctx, vol, 32<<20)
	if err != nil || st.CapacityBytes != 32<<20 || st.MountedBy != "" {
		t.Fatalf("EnsureVolume: %+v %v", st, err)
	}
	if fi, err := os.Stat(r.VolumePath(vol)); err != nil || fi.Size() != 32<<20 {
		t.Fatalf("image: %v", err)
	}
	if fs, err := ext4Size(r.VolumePath(vol)); err != nil || fs != 32<<20 {
		t.Fatalf("filesystem: %d %v", fs, err)
	}
	if st, err := r.EnsureVolume(ctx, vol, 32<<20); err != nil || st.CapacityBytes != 32<<20 {
		t.Fatalf("EnsureVolume again: %+v %v", st, err)
	}
	if _, err := r.EnsureVolume(ctx, vol, 16<<20); !errors.Is(err, ErrCapacity) {
		t.Errorf("shrink = %v, want ErrCapacity", err)
	}

	s := testSpec(ws)
	s.Volume = &VolumeMount{VolumeID: vol, MountPath: "/srv/data"}
	start(t, r, s)
	sh(t, r, ws, "dd if=/dev/urandom of=/srv/data/blob bs=1M count=4 2>/dev/null && cd /srv/data && md5sum blob > blob.md5")
	if got := strings.TrimSpace(sh(t, r, ws, "stat -c %u:%g /srv/data /srv/data/blob")); got != "0:0\n0:0" {
		t.Errorf("owners in the Volume = %q, want root of the workspace", got)
	}
	mi := sh(t, r, ws, "cat /proc/self/mountinfo")
	if !strings.Contains(mi, " /srv/data ") || strings.Contains(mi, root) {
		t.Errorf("workspace mountinfo (no host path, the Volume at /srv/data):\n%s", mi)
	}
	if df := strings.Fields(sh(t, r, ws, "df -k /srv/data | tail -1")); len(df) < 2 || df[1] == "" || df[1][0] != '2' && df[1][0] != '3' {
		t.Errorf("df of the Volume: %v (about 32 MiB)", df)
	}
	if m := hostMountsOf(t, r.VolumePath(vol)); len(m) > 0 {
		t.Errorf("the Volume is mounted on the host at %v", m)
	}
	if v, ok := r.VolumeStatus(vol); !ok || v.MountedBy != ws {
		t.Errorf("VolumeStatus while mounted = %+v %v", v, ok)
	}
	if _, err := r.EnsureVolume(ctx, vol, 64<<20); !errors.Is(err, ErrVolumeInUse) {
		t.Errorf("grow while mounted = %v, want ErrVolumeInUse", err)
	}
	if err := r.DeleteVolume(ctx, vol); !errors.Is(err, ErrVolumeInUse) {
		t.Errorf("delete while mounted = %v, want ErrVolumeInUse", err)
	}
	// A second workspace cannot mount it meanwhile.
	s2 := testSpec("ws-vol-2")
	s2.Volume = &VolumeMount{VolumeID: vol, MountPath: "/data"}
	if err := r.Start(ctx, s2); !errors.Is(err, ErrVolumeInUse) || !errors.Is(err, ErrStart) {
		t.Errorf("second mount = %v, want ErrStart with ErrVolumeInUse", err)
	}
	if err := r.Delete(ctx, "ws-vol-2"); err != nil {
		t.Fatal(err)
	}

	// The guest's writeback flushes the Volume too.
	e := r.get(ws)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	resp, err := r.call(wctx, e, protocol.Request{Op: protocol.OpWriteback, TimeoutMillis: 5000})
	cancel()
	if err != nil || !resp.OK || !slices.Contains(resp.Synced, "/srv/data") {
		t.Errorf("writeback = %+v %v, want /srv/data synced", resp, err)
	}
	if err := r.Stop(ctx, ws, false); err != nil {
		t.Fatalf("normal stop: %v", err)
	}
	if m := hostMountsOf(t, r.VolumePath(vol)); len(m) > 0 {
		t.Errorf("the Volume is mounted on the host at %v after the stop", m)
	}
	if v, ok := r.VolumeStatus(vol); !ok || v.MountedBy != "" {
		t.Errorf("VolumeStatus after stop = %+v %v", v, ok)
	}

	// Grown while stopped: every byte kept, the new space usable.
	t0 := time.Now()
	if st, err := r.EnsureVolume(ctx, vol, 96<<20); err != nil || st.CapacityBytes != 96<<20 {
		t.Fatalf("grow: %+v %v", st, err)
	}
	t.Logf("Volume 32 → 96 MiB: %v", time.Since(t0))
	if fs, err := ext4Size(r.VolumePath(vol)); err != nil || fs != 96<<20 {
		t.Fatalf("filesystem after grow: %d %v", fs, err)
	}
	s.Generation = 2
	start(t, r, s)
	sh(t, r, ws, "cd /srv/data && md5sum -c blob.md5 >/dev/null")
	sh(t, r, ws, "dd if=/dev/zero of=/srv/data/big bs=1M count=48 2>/dev/null") // beyond the first 32 MiB
	if err := r.Stop(ctx, ws, false); err != nil {
		t.Fatal(err)
	}
	// Mounted by another workspace at another path: the bytes are there.
	s2.Generation = 2
	start(t, r, s2)
	sh(t, r, "ws-vol-2", "cd /data && md5sum -c blob.md5 >/dev/null")
	if err := r.Delete(ctx, "ws-vol-2"); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
	if v := r.Volumes(); len(v) != 1 || v[0].VolumeID != vol || v[0].CapacityBytes != 96<<20 {
		t.Errorf("Volumes() = %+v", v)
	}
	if err := r.DeleteVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
	if err := r.DeleteVolume(ctx, vol); err != nil {
		t.Errorf("second delete: %v", err)
	}
	if _, err := os.Stat(r.VolumePath(vol)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("image after delete: %v", err)
	}
	// A Volume that is not on the node: the start fails, not permanently.
	if err := r.Start(ctx, s); !errors.Is(err, ErrNoVolume) || Permanent(err) {
		t.Errorf("start without the image = %v", err)
	}
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, root)
}

// TestVolumeAdoptedAfterRestart: a restarted node knows which Volume its
// re-adopted execution mounts.
func TestVolumeAdoptedAfterRestart(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	const ws, vol = "ws-vol-adopt", "vol-adopt"
	if _, err := r.EnsureVolume(ctx, vol, 16<<20); err != nil {
		t.Fatal(err)
	}
	s := testSpec(ws)
	s.Volume = &VolumeMount{VolumeID: vol, MountPath: "/v"}
	start(t, r, s)
	sh(t, r, ws, "echo kept > /v/f")
	r.Close()
	r2, err := New(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if err := r2.Adopt(ctx); err != nil {
		t.Fatal(err)
	}
	if v, ok := r2.VolumeStatus(vol); !ok || v.MountedBy != ws {
		t.Errorf("after adoption: %+v %v", v, ok)
	}
	if err := r2.DeleteVolume(ctx, vol); !errors.Is(err, ErrVolumeInUse) {
		t.Errorf("delete after adoption = %v", err)
	}
	if err := r2.Stop(ctx, ws, false); err != nil {
		t.Fatal(err)
	}
	if err := r2.DeleteVolume(ctx, vol); err != nil {
		t.Errorf("delete after the stop: %v", err)
	}
	if err := r2.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, root)
}

// TestHostileVolumeMountPath: the workspace plants symbolic links in its
// writable layer where its Volume is to be mounted, pointing out of its
// root (/, ../../..), at its /proc, or at a parent of the mount path. The
// start is refused, nothing is made or mounted outside the root, and the
// workspace starts again without the Volume.
func TestHostileVolumeMountPath(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	const ws, vol = "ws-vol-hostile", "vol-hostile"
	if _, err := r.EnsureVolume(ctx, vol, 16<<20); err != nil {
		t.Fatal(err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	escape := "kibotos-volume-escape-" + hex.EncodeToString(rnd[:])
	start(t, r, testSpec(ws))
	sh(t, r, ws, `set -e
ln -s / /to-root
ln -s ../../../../.. /to-dotdot
ln -s /proc /to-proc
ln -s /proc/self/root /to-magic
mkdir -p /home/u && ln -s / /home/u/link
ln -s /etc /etc-link
echo x > /a-file
mkdir -p /ok/deep`)
	if err := r.Stop(ctx, ws, false); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		"/to-root",                   // the mount point itself a link to /
		"/to-root/" + escape,         // a parent a link to /
		"/to-dotdot/" + escape,       // ../../..
		"/to-dotdot",                 //
		"/to-proc",                   // the workspace's /proc
		"/to-proc/" + escape,         //
		"/to-magic/" + escape,        // a magic link
		"/home/u/link/" + escape,     // deeper
		"/home/u/link/tmp/" + escape, //
		"/etc-link/" + escape,        //
		"/a-file",                    // not a directory
		"/a-file/" + escape,          //
	} {
		s := testSpec(ws)
		s.Volume = &VolumeMount{VolumeID: vol, MountPath: p}
		err := r.Start(ctx, s)
		if err == nil || !errors.Is(err, ErrStart) {
			t.Errorf("start with the Volume at %s = %v, want refused", p, err)
			if err == nil {
				out, _ := run(t, r, ws, "sh", "-c", "grep ' ext4 ' /proc/self/mountinfo; ls -la /")
				t.Logf("mounts in the workspace:\n%s", out)
				_ = r.Stop(ctx, ws, true)
			}
			continue
		}
		t.Logf("%s: %v", p, err)
		if !strings.Contains(err.Error(), "symbolic link") && !strings.Contains(err.Error(), "not a directory") {
			t.Errorf("start with the Volume at %s: %v (no reason named)", p, err)
		}
		for _, host := range []string{"/" + escape, "/tmp/" + escape, "/proc/" + escape} {
			if _, err := os.Lstat(host); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("Volume at %s made %s on the host: %v", p, host, err)
				_ = os.Remove(host)
			}
		}
		if m := hostMountsOf(t, r.VolumePath(vol)); len(m) > 0 {
			t.Errorf("Volume at %s: mounted on the host at %v", p, m)
		}
		if v, _ := r.VolumeStatus(vol); v.MountedBy != "" {
			t.Errorf("Volume at %s: still claimed by %q after the failed start", p, v.MountedBy)
		}
	}
	assertNoLeaks(t, root)
	// A path through real directories works, and the links are as planted.
	s := testSpec(ws)
	s.Volume = &VolumeMount{VolumeID: vol, MountPath: "/ok/deep/vol"}
	start(t, r, s)
	sh(t, r, ws, "grep -q ' /ok/deep/vol ' /proc/self/mountinfo && test -L /to-root && touch /ok/deep/vol/f")
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
	if err := r.DeleteVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, root)
}

// TestStorageAccounting: the layers and Volumes together never exceed the
// pool; what does not fit is refused permanently, and nothing is made.
func TestStorageAccounting(t *testing.T) {
	r, root := newRuntime(t, func(c *Config) { c.StorageBytes = 100 << 20 })
	ctx := context.Background()
	if _, err := r.EnsureVolume(ctx, "vol-a", 64<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := r.EnsureVolume(ctx, "vol-b", 48<<20); !errors.Is(err, ErrNoStorage) || !Permanent(err) {
		t.Errorf("a Volume beyond the pool = %v, want a permanent ErrNoStorage", err)
	}
	if _, ok := r.VolumeStatus("vol-b"); ok {
		t.Error("the refused Volume exists")
	}
	s := testSpec("ws-stor")
	s.CapacityBytes = 48 << 20
	if err := r.Start(ctx, s); !errors.Is(err, ErrNoStorage) || !Permanent(err) {
		t.Errorf("a layer beyond the pool = %v, want a permanent ErrNoStorage", err)
	}
	if _, err := os.Stat(r.LayerPath("ws-stor")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused layer: %v", err)
	}
	s.CapacityBytes = 32 << 20
	start(t, r, s)
	if err := r.Stop(ctx, "ws-stor", false); err != nil {
		t.Fatal(err)
	}
	if err := r.Resize(ctx, "ws-stor", 48<<20); !errors.Is(err, ErrNoStorage) {
		t.Errorf("a layer grown beyond the pool = %v", err)
	}
	if _, err := r.EnsureVolume(ctx, "vol-a", 72<<20); !errors.Is(err, ErrNoStorage) {
		t.Errorf("a Volume grown beyond the pool = %v", err)
	}
	if _, err := r.EnsureVolume(ctx, "vol-a", 68<<20); err != nil {
		t.Errorf("a Volume grown to fill the pool: %v", err)
	}
	if got := r.StorageUsed(); got != 100<<20 {
		t.Errorf("StorageUsed = %d, want 100 MiB", got)
	}
	if err := r.DeleteVolume(ctx, "vol-a"); err != nil {
		t.Fatal(err)
	}
	if err := r.Resize(ctx, "ws-stor", 48<<20); err != nil {
		t.Errorf("grow after the Volume went: %v", err)
	}
	if err := r.Delete(ctx, "ws-stor"); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, root)
}
