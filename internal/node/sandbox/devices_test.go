package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/mountinfo"
)

func TestParseDeviceRule(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want deviceRule
	}{
		{"a *:* rwm", deviceRule{'a', anyDevice, anyDevice, "rwm"}},
		{"c 1:3 rw", deviceRule{'c', 1, 3, "rw"}},
		{"c 136:* mrw", deviceRule{'c', 136, anyDevice, "rwm"}},
		{"b 7:12 r", deviceRule{'b', 7, 12, "r"}},
	} {
		got, err := parseDeviceRule(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseDeviceRule(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "c 1:3", "x 1:3 rw", "c 1-3 rw", "c a:3 rw", "c 1:3 xyz"} {
		if d, err := parseDeviceRule(bad); err == nil {
			t.Errorf("parseDeviceRule(%q) = %+v, want an error", bad, d)
		}
	}
	if s := (deviceRule{'c', 136, anyDevice, "rw"}).String(); s != "c 136:* rw" {
		t.Errorf("String = %q", s)
	}
}

// TestV1DeviceWrites pins what cgroup v1 writes: a fresh cgroup is
// replaced, a list in use is narrowed in place.
func TestV1DeviceWrites(t *testing.T) {
	loop := unix.Mkdev(7, 4)
	all := []deviceRule{{'a', anyDevice, anyDevice, "rwm"}}
	fresh := v1DeviceWrites(all, setupDevices(loop))
	want := []cgroupWrite{{"devices.deny", "a"},
		{"devices.allow", "c 1:3 rwm"}, {"devices.allow", "c 1:5 rwm"}, {"devices.allow", "c 1:7 rwm"},
		{"devices.allow", "c 1:8 rwm"}, {"devices.allow", "c 1:9 rwm"}, {"devices.allow", "c 5:0 rwm"},
		{"devices.allow", "c 5:2 rwm"}, {"devices.allow", "c 136:* rwm"}, {"devices.allow", "b 7:4 rw"}}
	if fmt.Sprint(fresh) != fmt.Sprint(want) {
		t.Errorf("fresh cgroup:\n got %v\nwant %v", fresh, want)
	}
	narrow := v1DeviceWrites(setupDevices(loop), workspaceDevices)
	want = []cgroupWrite{
		{"devices.deny", "c 1:3 m"}, {"devices.deny", "c 1:5 m"}, {"devices.deny", "c 1:7 m"},
		{"devices.deny", "c 1:8 m"}, {"devices.deny", "c 1:9 m"}, {"devices.deny", "c 5:0 m"},
		{"devices.deny", "c 5:2 m"}, {"devices.deny", "c 136:* m"}, {"devices.deny", "b 7:4 rw"}}
	if fmt.Sprint(narrow) != fmt.Sprint(want) {
		t.Errorf("narrowing:\n got %v\nwant %v", narrow, want)
	}
	if w := v1DeviceWrites(workspaceDevices, workspaceDevices); len(w) != 0 {
		t.Errorf("same list: %v, want no write", w)
	}
	// Widening allows first, then denies.
	w := v1DeviceWrites([]deviceRule{{'c', 1, 3, "r"}, {'c', 1, 5, "rw"}}, []deviceRule{{'c', 1, 3, "rw"}})
	want = []cgroupWrite{{"devices.allow", "c 1:3 rw"}, {"devices.deny", "c 1:5 rw"}}
	if fmt.Sprint(w) != fmt.Sprint(want) {
		t.Errorf("widening:\n got %v\nwant %v", w, want)
	}
	if !sameDevices([]deviceRule{{'c', 1, 3, "wr"}, {'b', 7, 1, "r"}}, []deviceRule{{'b', 7, 1, "r"}, {'c', 1, 3, "rw"}}) {
		t.Error("sameDevices: order or letters matter")
	}
}

// TestCgroupV1DeviceList applies the setup list and then the workspace's
// to a real cgroup v1 devices hierarchy, and checks the kernel's list and
// that a process in the cgroup can open and make what it allows only.
func TestCgroupV1DeviceList(t *testing.T) {
	requireSandbox(t)
	mounts, err := v1Mounts()
	if err != nil {
		t.Fatal(err)
	}
	if mounts["devices"] == "" {
		t.Skip("no cgroup v1 devices hierarchy on this host")
	}
	c := &cgroupV1{mounts: map[string]string{"devices": mounts["devices"]}}
	rel := fmt.Sprintf("kibotos-test-devices-%d", os.Getpid())
	if err := os.Mkdir(c.dir("devices", rel), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.remove(rel) }()
	loop := unix.Mkdev(7, 200)
	if err := c.limitDevices(rel, setupDevices(loop)); err != nil {
		t.Fatal(err)
	}
	list := func() []deviceRule {
		l, err := readDevicesList(filepath.Join(c.dir("devices", rel), "devices.list"))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if got := list(); !sameDevices(got, setupDevices(loop)) {
		t.Errorf("setup list = %v", got)
	}
	dir := t.TempDir()
	inCgroup := func(script string) (string, error) {
		cmd := exec.Command("sh", "-c", `echo $$ > "$0" && `+script, filepath.Join(c.dir("devices", rel), "cgroup.procs"))
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := inCgroup("mknod null c 1 3 && echo x > null"); err != nil {
		t.Errorf("setup: mknod of a listed device: %v: %s", err, out)
	}
	if err := c.limitDevices(rel, workspaceDevices); err != nil {
		t.Fatal(err)
	}
	if got := list(); !sameDevices(got, workspaceDevices) {
		t.Errorf("workspace list = %v, want %v", got, workspaceDevices)
	}
	if out, err := inCgroup("head -c 4 /dev/urandom | wc -c && echo x > /dev/null && echo x > null"); err != nil || !strings.HasPrefix(out, "4") {
		t.Errorf("listed devices: %v: %q", err, out)
	}
	for _, script := range deniedScripts(t) {
		out, err := inCgroup(script)
		if err == nil || !strings.Contains(out, "not permitted") {
			t.Errorf("%s in the cgroup: %v, %q; want Operation not permitted", script, err, out)
		}
	}
}

// deniedScripts are shell commands that a workspace's device list refuses
// and that succeed on this host outside it (so that the refusal is the
// list's): mknod of a device the list has without mknod, and of a loop
// device; opening /dev/loop-control and /dev/net/tun.
func deniedScripts(t *testing.T) []string {
	t.Helper()
	out := []string{"mknod zero c 1 5", "mknod loop b 7 200"}
	for _, dev := range []string{"/dev/loop-control", "/dev/net/tun"} {
		script := "exec 3<>" + dev
		if b, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
			t.Logf("%s fails outside the cgroup too (%v: %s): not tried", script, err, b)
			continue
		}
		out = append(out, script)
	}
	return out
}

// cgroup2Root returns a cgroup v2 hierarchy of this host: the unified one
// (or the hybrid /sys/fs/cgroup/unified), else one the test mounts.
func cgroup2Root(t *testing.T) string {
	t.Helper()
	mounts, err := mountinfo.ReadSelf()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m.FSType == "cgroup2" && m.Root == "/" {
			return m.MountPoint
		}
	}
	dir := t.TempDir()
	if err := unix.Mount("none", dir, "cgroup2", 0, ""); err != nil {
		t.Skipf("no cgroup2 hierarchy, and the kernel refuses to mount one (%v): the v2 device program cannot be tried here", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestCgroupV2DeviceProgram attaches the device programs to a real cgroup
// v2 cgroup (on a v1 host, the hybrid hierarchy: BPF device programs act
// there without controllers) and checks what a process in it may open and
// make, and that narrowing leaves one program.
func TestCgroupV2DeviceProgram(t *testing.T) {
	requireSandbox(t)
	c := &cgroupV2{root: cgroup2Root(t)}
	rel := fmt.Sprintf("kibotos-test-devices-%d", os.Getpid())
	if err := os.Mkdir(c.dir(rel), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.remove(rel) }()
	loop := unix.Mkdev(7, 200)
	if err := c.limitDevices(rel, setupDevices(loop)); err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			t.Skipf("the kernel has no cgroup device programs: %v", err)
		}
		t.Fatal(err)
	}
	dir := t.TempDir()
	inCgroup := func(script string) (string, error) {
		cmd := exec.Command("sh", "-c", `echo $$ > "$0" && `+script, filepath.Join(c.dir(rel), "cgroup.procs"))
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := inCgroup("mknod null c 1 3 && echo x > null"); err != nil {
		t.Errorf("setup: mknod of a listed device: %v: %s", err, out)
	}
	if err := c.limitDevices(rel, workspaceDevices); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(c.dir(rel), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	q, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupDevice})
	unix.Close(fd)
	if err != nil || len(q.Programs) != 1 {
		t.Errorf("device programs of the cgroup after narrowing: %+v, %v; want one", q, err)
	}
	if out, err := inCgroup("head -c 4 /dev/urandom | wc -c && echo x > /dev/null && echo x > null"); err != nil || !strings.HasPrefix(out, "4") {
		t.Errorf("listed devices: %v: %q", err, out)
	}
	for _, script := range deniedScripts(t) {
		out, err := inCgroup(script)
		if err == nil || !strings.Contains(out, "not permitted") {
			t.Errorf("%s in the cgroup: %v, %q; want Operation not permitted", script, err, out)
		}
	}
}

// TestWorkspaceDevices: a workspace opens the devices of its /dev, and
// nothing else, even through device nodes planted in its /dev (a tmpfs
// that honours device nodes) from the host: one of /dev/net/tun's and one
// of its own writable layer's loop device. Leaks are checked after delete.
func TestWorkspaceDevices(t *testing.T) {
	r, root := newRuntime(t)
	const ws = "ws-devices"
	start(t, r, testSpec(ws))
	rel := r.cgroupRel(ws)
	if r.cg.version() == 1 {
		got, err := readDevicesList(filepath.Join(r.cg.(*cgroupV1).dir("devices", rel), "devices.list"))
		if err != nil || !sameDevices(got, workspaceDevices) {
			t.Errorf("devices.list of the execution = %v, %v; want %v", got, err, workspaceDevices)
		}
	}
	st, ok := r.Status(ws)
	if !ok {
		t.Fatal("no status")
	}
	out := sh(t, r, ws, "head -c 4 /dev/urandom | wc -c; head -c 4 /dev/zero | wc -c; echo x > /dev/null; ls /dev")
	if !strings.HasPrefix(out, "4\n4\n") {
		t.Errorf("listed devices inside: %q", out)
	}
	loop, err := blockDevice(r.get(ws).st.Loop)
	if err != nil {
		t.Fatal(err)
	}
	devDir := fmt.Sprintf("/proc/%d/root/dev", st.PID)
	for name, dev := range map[string]struct {
		mode uint32
		num  uint64
	}{
		"planted-loop": {unix.S_IFBLK, loop},
		"planted-tun":  {unix.S_IFCHR, unix.Mkdev(10, 200)},
	} {
		// /dev is the workspace's tmpfs, of its user namespace: the host
		// plants with the execution's IDs.
		if err := asExecutionIDs(r.get(ws).st.IDBase, func() error {
			return unix.Mknod(filepath.Join(devDir, name), dev.mode|0o666, int(dev.num))
		}); err != nil {
			t.Fatalf("plant /dev/%s: %v", name, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		stdout, stderr, code, err := r.Exec(ctx, ws, []string{"sh", "-c", "head -c 512 /dev/" + name + " | wc -c"})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		// Refused twice over: the device list, and before it the
		// workspace's tmpfs, nodev as every mount made in a user
		// namespace.
		if !strings.Contains(string(stderr), "not permitted") && !strings.Contains(string(stderr), "Permission denied") {
			t.Errorf("reading planted /dev/%s: exit %d, %q %q; want Operation not permitted or Permission denied", name, code, stdout, stderr)
		}
	}
	if _, stderr, code, _ := r.Exec(context.Background(), ws, []string{"mknod", "/dev/null2", "c", "1", "3"}); code == 0 {
		t.Errorf("mknod inside succeeded (%q)", stderr)
	}
	if err := r.Delete(context.Background(), ws); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, root)
}

// setupDevices is a wider list than the workspace's (its devices with
// mknod, and the loop device loop), which the tests narrow.
func setupDevices(loop uint64) []deviceRule {
	out := make([]deviceRule, 0, len(workspaceDevices)+1)
	for _, d := range workspaceDevices {
		d.Access = "rwm"
		out = append(out, d)
	}
	return append(out, deviceRule{'b', int64(unix.Major(loop)), int64(unix.Minor(loop)), "rw"})
}
