//go:build linux

package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// asExecutionIDs runs fn on a thread of its own whose file system IDs are
// base (an execution's root on the host), capabilities kept.
func asExecutionIDs(base uint32, fn func() error) error {
	c := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if _, _, e := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(base), 0, 0); e != 0 {
			c <- e
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(base), 0, 0); e != 0 {
			c <- e
			return
		}
		if err := raiseEffective(); err != nil {
			c <- err
			return
		}
		c <- fn()
	}()
	return <-c
}

// statusIDs returns the Uid and Gid lines of /proc/<pid>/status on the host.
func statusIDs(t *testing.T, pid int) (uid, gid string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			uid = strings.Join(strings.Fields(v), " ")
		}
		if v, ok := strings.CutPrefix(l, "Gid:"); ok {
			gid = strings.Join(strings.Fields(v), " ")
		}
	}
	return uid, gid
}

// Each execution runs in a user namespace of its own: the range from
// Config.IDBase, root inside an unprivileged uid on the host, the user
// namespace owned by that uid; files keep the workspace's own IDs on the
// layer; two executions get disjoint ranges; a stop frees a range.
func TestUserNamespace(t *testing.T) {
	const base = 1_500_000_000
	r, _ := newRuntime(t, func(c *Config) { c.IDBase = base })
	ctx := context.Background()
	const ws, ws2 = "ws-userns", "ws-userns-2"
	start(t, r, testSpec(ws))
	start(t, r, testSpec(ws2))
	b1, b2 := r.get(ws).st.IDBase, r.get(ws2).st.IDBase
	if b1 != base || b2 != base+IDsPerExecution {
		t.Errorf("ID ranges %d and %d, want %d and %d", b1, b2, base, base+IDsPerExecution)
	}
	for _, c := range []struct {
		ws   string
		base uint32
	}{{ws, b1}, {ws2, b2}} {
		want := fmt.Sprintf("0 %d %d", c.base, IDsPerExecution)
		for _, f := range []string{"uid_map", "gid_map"} {
			if got := strings.Join(strings.Fields(sh(t, r, c.ws, "cat /proc/self/"+f)), " "); got != want {
				t.Errorf("%s: /proc/self/%s = %q, want %q", c.ws, f, got, want)
			}
		}
		st, _ := r.Status(c.ws)
		wantIDs := strings.Repeat(fmt.Sprint(c.base)+" ", 4)
		if uid, gid := statusIDs(t, st.PID); uid+" " != wantIDs || gid+" " != wantIDs {
			t.Errorf("%s: PID 1 on the host: Uid %q Gid %q, want %d", c.ws, uid, gid, c.base)
		}
		// The user namespace is the execution's uid's, not root's.
		nsf, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", st.PID))
		if err != nil {
			t.Fatal(err)
		}
		owner, err := unix.IoctlGetUint32(int(nsf.Fd()), unix.NS_GET_OWNER_UID)
		nsf.Close()
		if err != nil || owner != c.base {
			t.Errorf("%s: owner of the user namespace %d, %v; want %d", c.ws, owner, err, c.base)
		}
	}
	if got := sh(t, r, ws, "id -u; echo hi > /root/f; mkdir -p /home/u; echo u > /home/u/g; chown -R 1000:1001 /home/u; rm -rf /etc; mkdir /etc; echo new > /etc/x; ls -ln /root/f"); !strings.HasPrefix(got, "0\n") || !strings.Contains(got, " 0 ") {
		t.Errorf("inside: %q", got)
	}
	// Ports below 1024: root has CAP_NET_BIND_SERVICE in the network
	// namespace its user namespace owns.
	if got := sh(t, r, ws, "nc -l -p 80 </dev/null >/dev/null 2>/tmp/nc.err & p=$!; sleep 0.3; kill -0 $p && echo listening; kill $p; cat /tmp/nc.err"); got != "listening\n" {
		t.Errorf("listening on port 80 inside: %q", got)
	}
	if err := r.Stop(ctx, ws, false); err != nil {
		t.Fatal(err)
	}
	// The range is free again: a new execution takes it.
	if _, used := r.idUsed[b1]; used {
		t.Errorf("range %d still in use after the stop", b1)
	}
	start(t, r, testSpec("ws-userns-3"))
	if got := r.get("ws-userns-3").st.IDBase; got != b1 {
		t.Errorf("new execution's range %d, want the freed %d", got, b1)
	}

	// The layer, mounted plainly on the host, has the workspace's IDs.
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop,ro", r.layerPath(ws), mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount the layer: %v %s", err, out)
	}
	defer exec.Command("umount", mnt).Run()
	for f, want := range map[string][2]uint32{"upper/root/f": {0, 0}, "upper/home/u/g": {1000, 1001}, "upper/home/u": {1000, 1001}, "upper/etc/x": {0, 0}} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(mnt, f), &st); err != nil {
			t.Errorf("%s on the layer: %v", f, err)
			continue
		}
		if st.Uid != want[0] || st.Gid != want[1] {
			t.Errorf("%s on the layer: %d:%d, want %d:%d", f, st.Uid, st.Gid, want[0], want[1])
		}
	}
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount the layer: %v %s", err, out)
	}
	// The recreated /etc is opaque: the template's /etc is hidden (the
	// guest writes resolv.conf at every boot).
	start(t, r, testSpec(ws))
	if got := sh(t, r, ws, "ls /etc; cat /root/f"); got != "resolv.conf\nx\nhi\n" {
		t.Errorf("after a restart: %q", got)
	}
	for _, w := range []string{ws, ws2, "ws-userns-3"} {
		if err := r.Delete(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	if len(r.idUsed) != 0 {
		t.Errorf("ranges in use after every delete: %v", r.idUsed)
	}
}

// A node that restarts keeps each execution's range, and gives a new
// execution another.
func TestUserNamespaceAdopted(t *testing.T) {
	r1, root := newRuntime(t)
	ctx := context.Background()
	const ws = "ws-userns-adopt"
	start(t, r1, testSpec(ws))
	before := r1.get(ws).st.IDBase
	r1.Close()
	r2, err := New(Config{Root: root, GuestBinary: testGuest, Log: r1.cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if err := r2.Adopt(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r2.get(ws).st.IDBase; got != before {
		t.Errorf("adopted range %d, want %d", got, before)
	}
	want := fmt.Sprintf("0 %d %d", before, IDsPerExecution)
	if got := strings.Join(strings.Fields(sh(t, r2, ws, "cat /proc/self/uid_map")), " "); got != want {
		t.Errorf("uid_map after adoption %q, want %q", got, want)
	}
	start(t, r2, testSpec("ws-userns-new"))
	if got := r2.get("ws-userns-new").st.IDBase; got == before {
		t.Errorf("a new execution got the adopted one's range %d", got)
	}
	for _, w := range []string{ws, "ws-userns-new"} {
		if err := r2.Delete(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
}

// Per-user kernel limits are the execution's, not host root's: a
// workspace that opens inotify instances until it is refused leaves root
// on the host its own.
func TestHostileInotifyLimit(t *testing.T) {
	r, _, _, spec := hostileRuntime(t)
	ctx := context.Background()
	const ws = "ws-inotify"
	start(t, r, spec(ws))
	defer r.Delete(ctx, ws)
	sh(t, r, ws, "hostile inotify-hold /tmp/release > /tmp/inotify.out 2>&1 &")
	var out string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if out = sh(t, r, ws, "cat /tmp/inotify.out"); out != "" {
			break
		}
	}
	var n int
	var msg string
	if _, err := fmt.Sscanf(out, "%d %s", &n, &msg); err != nil || n == 0 || !strings.Contains(out, "too many open files") {
		t.Fatalf("the workspace's inotify instances: %q", out)
	}
	t.Logf("the workspace opened %d inotify instances: %s", n, strings.TrimSpace(out))
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Errorf("root on the host, the workspace holding %d inotify instances: %v", n, err)
	} else {
		unix.Close(fd)
	}
	sh(t, r, ws, "touch /tmp/release")
}
