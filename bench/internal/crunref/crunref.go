//go:build linux

// Package crunref is the crun reference of the benchmark harnesses under
// bench/: the same template rootfs, writable layer and kibotos-guest as PID 1
// as a Kibotos workspace, started by Debian's crun from an OCI bundle, so
// that a harness can compare a workspace with a plain container (a start, a
// `crun exec`).
package crunref

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

// The reference: the same template rootfs, the same kibotos-guest as PID 1
// and the same readiness check (the guest's first answer to a ping on its
// socket), started by Debian's crun from an OCI bundle whose rootfs is
// prepared the way the sandbox runtime prepares an execution's root:
//
//  1. layer: a sparse image of the same size, mkfs.ext4 with the runtime's
//     exact options, fsync'd and renamed in (as ensureLayer does);
//  2. mounts: a loop device attached with LOOP_CONFIGURE + autoclear, the
//     ext4 mounted (fsmount), upper/ and work/ made, the ext4 and the
//     template idmapped to the reference's ID range, overlayfs (index=off)
//     over them attached as the bundle's rootfs — the runtime's own code
//     (sandbox.MountIdmappedRoot);
//  3. cgroup + crun run --detach: a cgroup with the same limits (memory
//     without swap, whole vCPUs of CPU quota, 1024 pids) in the same
//     controllers, made by the harness, which crun starts in (as the
//     runtime's init shim does); crun makes a user namespace (OCI
//     uidMappings/gidMappings: 65536 IDs from sandbox.DefaultIDBase) and
//     new mount, PID, UTS, IPC, network and cgroup namespaces, mounts /proc, /sys (ro),
//     /sys/fs/cgroup (ro), /dev (tmpfs, devpts, shm), /tmp, /run, the
//     guest's socket directory (idmapped: crun's "idmap" option) and binary, sets the hostname, brings lo up,
//     pivots, keeps the runtime's capability set and execs the guest; then
//     the harness sets oom_score_adj -998 on PID 1 (crun 1.8.1 applies a
//     negative process.oomScoreAdj after dropping capabilities, and fails),
//     ignoring a failure as the runtime does;
//  4. ready: the harness pings the guest's socket every PingEvery until
//     it answers (a tight poll; the runtime's own readiness wait is part of
//     what is measured on our side).
//
// All of it runs on one OS thread that has its own mount namespace, so that
// (as with the runtime) nothing is mounted on the host and everything goes
// away with the thread. In that namespace a cgroup2 hierarchy mounted beside
// the v1 controllers (a "hybrid" host) is unmounted: crun refuses to run on
// a hybrid host whose cgroup2 hierarchy holds a controller, and the
// reference does not use it. crun's own cgroup manager is disabled (the
// harness made the cgroup); the harness's thread joins the cgroup just for
// the fork of crun (cgroup v2: CLONE_INTO_CGROUP), so that no extra process
// (a shell: several ms per exec on slow VMs) sits in the measurement.
//
// The reference has no control plane: no API, no store, no reconciler, no
// node stream, no state files.

// PingEvery is the readiness polling of the reference.
const PingEvery = time.Millisecond

// Spec is what a reference container is limited to, as a workspace is.
type Spec struct {
	MemoryMiB  uint32
	CPUMillis  uint32
	LayerBytes uint64
}

// Logf receives progress lines (installing crun); nothing by default.
var Logf = func(format string, args ...any) {}

// Env runs reference containers; New makes it, Cleanup releases it.
type Env struct {
	userns   int    // the user namespace of the idmapped mounts (idmapUserns)
	dir      string // TMP/ref: bundles, images, crun state
	crun     string
	crunRoot string
	rootfs   string // the template rootfs (lower layer)
	guest    string
	cgParent string // cgroup parent of the reference containers, in every hierarchy
	runID    string
	spec     Spec

	thread *nsThread
	// oomAdjErr is the last failure to set oom_score_adj (reported).
	oomAdjErr error
	// origCgroup is the v1 cgroup (per controller) the thread returns to
	// after forking crun.
	origCgroup map[string]string

	mu     sync.Mutex
	active map[string]*Container // containers not torn down yet
}

// nsThread is a goroutine locked to an OS thread that has its own mount
// namespace; do runs functions on it. The thread ends (and its mount
// namespace with it) when stop is called: the goroutine returns while
// locked.
type nsThread struct {
	ch chan func()
}

func startNSThread(prepare func() error) (*nsThread, error) {
	t := &nsThread{ch: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("unshare mount namespace: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errc <- fmt.Errorf("make / private: %w", err)
			return
		}
		if err := prepare(); err != nil {
			errc <- err
			return
		}
		errc <- nil
		for f := range t.ch {
			f()
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return t, nil
}

func (t *nsThread) do(f func()) {
	done := make(chan struct{})
	t.ch <- func() {
		defer close(done)
		f()
	}
	<-done
}

func (t *nsThread) stop() { close(t.ch) }

// Sample is one reference start.
type Sample struct {
	Layer    time.Duration // image + mkfs.ext4 + fsyncs
	Mounts   time.Duration // loop device, ext4 mount, overlay mount
	Crun     time.Duration // crun run --detach: namespaces, mounts, cgroup, exec of the guest
	Ready    time.Duration // from crun's return to the guest's first answer
	Total    time.Duration
	Teardown time.Duration // crun delete --force, unmounts, loop detach, removal (not part of Total)
	Err      error
}

// Container is one reference container.
type Container struct {
	id, base, img, rootfs, bundle, sock string
	mountedRoot, created, cgroup        bool
	loop                                string
}

// EnsureCrun returns the path of crun, installing Debian's package when it
// is missing and install is set.
func EnsureCrun(ctx context.Context, install bool) (string, string, error) {
	if p, err := exec.LookPath("crun"); err == nil {
		return p, crunVersion(ctx, p), nil
	}
	if !install {
		return "", "", errors.New("crun is not installed and -install-crun=false: apt-get install -y crun")
	}
	Logf("crun missing: apt-get install -y crun")
	try := func() error {
		cmd := exec.CommandContext(ctx, "apt-get", "install", "-y", "--no-install-recommends", "crun")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, tailBytes(out, 1500))
		}
		return nil
	}
	if err := try(); err != nil {
		Logf("apt-get install failed (%v); apt-get update and retry", err)
		upd := exec.CommandContext(ctx, "apt-get", "update")
		upd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		_ = upd.Run()
		if err := try(); err != nil {
			return "", "", fmt.Errorf("could not install crun (the reference runtime): %v; install it by hand (apt-get install -y crun) or run with -phases that exclude ref", err)
		}
	}
	p, err := exec.LookPath("crun")
	if err != nil {
		return "", "", fmt.Errorf("crun installed but not in PATH: %w", err)
	}
	return p, crunVersion(ctx, p), nil
}

func crunVersion(ctx context.Context, p string) string {
	out, err := benchkit.Output(ctx, "", p, "--version")
	if err != nil {
		return "unknown"
	}
	first, _, _ := strings.Cut(out, "\n")
	return first
}

// New prepares the reference in dir (its bundles, images and crun state):
// crun is the binary, rootfs the template rootfs (the lower layer), guest
// the kibotos-guest binary. Its containers are named "wsb-RUNID-NAME" and
// its cgroups live under "kibotos-" + harness + "-" + runID.
func New(dir, crun, rootfs, guest, harness, runID string, spec Spec) (*Env, error) {
	r := &Env{dir: dir, crun: crun, crunRoot: filepath.Join(dir, "crun-state"), rootfs: rootfs, guest: guest,
		cgParent: "kibotos-" + harness + "-" + runID, runID: runID, spec: spec, active: map[string]*Container{}}
	if err := os.MkdirAll(r.crunRoot, 0o700); err != nil {
		return nil, err
	}
	// The container's root, an unprivileged uid on the host, must reach
	// its bundle's rootfs (crun sets it up from within the user
	// namespace): search, not read, permission down to it.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, err
		}
	}
	t, err := startNSThread(func() error {
		if CgroupVersion() == 1 {
			if err := unix.Unmount("/sys/fs/cgroup/unified", unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("hide the cgroup2 hierarchy from crun: %w", err)
			}
			var err error
			r.origCgroup, err = threadCgroups()
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reference thread: %w", err)
	}
	r.thread = t
	return r, nil
}

// threadCgroups reads the calling thread's v1 cgroups: controller → path.
func threadCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			out[c] = f[2]
		}
	}
	for _, c := range refControllers {
		if _, ok := out[c]; !ok {
			return nil, fmt.Errorf("cgroup v1 controller %s not found in /proc/thread-self/cgroup", c)
		}
	}
	return out, nil
}

// refControllers are the controllers the runtime uses (v1 hierarchies).
var refControllers = []string{"memory", "cpu", "pids"}

// startInCgroup starts cmd inside cgroup rel: the calling (locked) thread
// joins it for the fork and returns to its own cgroups after (cgroup v1),
// or the child is cloned into it (cgroup v2).
func (r *Env) startInCgroup(cmd *exec.Cmd, rel string) error {
	if CgroupVersion() == 2 {
		fd, err := unix.Open(filepath.Join("/sys/fs/cgroup", rel), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		return cmd.Start()
	}
	tid := strconv.Itoa(unix.Gettid())
	var moved []string
	defer func() {
		for _, c := range moved {
			_ = writeFile(filepath.Join("/sys/fs/cgroup", c, r.origCgroup[c], "tasks"), tid)
		}
	}()
	for _, c := range refControllers {
		if err := writeFile(filepath.Join("/sys/fs/cgroup", c, rel, "tasks"), tid); err != nil {
			return err
		}
		moved = append(moved, c)
	}
	return cmd.Start()
}

// RunOnce starts one reference container, waits for its guest, and tears it
// down.
func (r *Env) RunOnce(ctx context.Context, name string) Sample {
	var s Sample
	r.thread.do(func() { s = r.runLocked(ctx, name) })
	return s
}

func (r *Env) runLocked(ctx context.Context, name string) (s Sample) {
	run := r.newContainer(name)
	defer func() {
		t := time.Now()
		if err := r.teardown(run); err != nil && s.Err == nil {
			s.Err = err
		}
		s.Teardown = time.Since(t)
	}()
	return r.startLocked(ctx, run)
}

// Start starts one reference container and waits for its guest; it runs
// until Stop (or Cleanup). On failure it is torn down already.
func (r *Env) Start(ctx context.Context, name string) (*Container, Sample) {
	var s Sample
	var run *Container
	r.thread.do(func() {
		run = r.newContainer(name)
		if s = r.startLocked(ctx, run); s.Err != nil {
			if err := r.teardown(run); err != nil {
				s.Err = errors.Join(s.Err, err)
			}
			run = nil
		}
	})
	return run, s
}

// Stop tears down a container of Start.
func (r *Env) Stop(c *Container) error {
	var err error
	r.thread.do(func() { err = r.teardown(c) })
	return err
}

// Exec runs `crun exec CONTAINER ARGV...` in the container's cgroup (the
// harness thread joins it for the fork, as for `crun run`) and returns the
// time from the fork of crun to its exit (crun waits for the process).
func (r *Env) Exec(ctx context.Context, c *Container, argv ...string) (time.Duration, error) {
	var d time.Duration
	var err error
	r.thread.do(func() {
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, r.crun, append([]string{"--cgroup-manager=disabled", "--root", r.crunRoot, "exec", c.id}, argv...)...)
		cmd.Stdout, cmd.Stderr = &out, &out
		t0 := time.Now()
		if err = r.startInCgroup(cmd, r.cgParent+"/"+c.id); err == nil {
			err = cmd.Wait()
		}
		d = time.Since(t0)
		if err != nil {
			err = fmt.Errorf("crun exec %s %v: %v: %s", c.id, argv, err, tailBytes(out.Bytes(), 500))
		}
	})
	return d, err
}

// OOMAdjErr is the last failure to set oom_score_adj -998 on a reference
// PID 1 (crun 1.8.1 cannot; see startLocked), nil when it worked.
func (r *Env) OOMAdjErr() error { return r.oomAdjErr }

func (r *Env) newContainer(name string) *Container {
	run := &Container{id: "wsb-" + r.runID + "-" + name}
	run.base = filepath.Join(r.dir, run.id)
	run.img = run.base + ".img"
	run.bundle = filepath.Join(run.base, "bundle")
	run.rootfs = filepath.Join(run.bundle, "rootfs")
	run.sock = filepath.Join(run.base, "sock")
	r.mu.Lock()
	r.active[run.id] = run
	r.mu.Unlock()
	return run
}

// startLocked starts run on the reference thread (no teardown).
func (r *Env) startLocked(ctx context.Context, run *Container) (s Sample) {
	t0 := time.Now()
	for _, d := range []string{run.rootfs, run.sock} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			s.Err = err
			return s
		}
	}
	// The layer is made by the runtime's own code (a clone of a formatted
	// seed, mkfs.ext4 the first time), so both sides do the same work.
	if err := sandbox.CreateLayerImage(ctx, filepath.Join(r.dir, "seeds"), run.img, r.spec.LayerBytes); err != nil {
		s.Err = err
		return s
	}
	t1 := time.Now()
	if err := r.mountRoot(run); err != nil {
		s.Err = err
		return s
	}
	t2 := time.Now()
	if err := r.writeConfig(run); err != nil {
		s.Err = err
		return s
	}
	logFile, err := os.OpenFile(run.base+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.Err = err
		return s
	}
	if err := r.makeCgroup(run); err != nil {
		logFile.Close()
		s.Err = err
		return s
	}
	pidFile := run.base + ".pid"
	cmd := exec.CommandContext(ctx, r.crun, "--cgroup-manager=disabled", "--root", r.crunRoot,
		"run", "--detach", "--pid-file", pidFile, "--bundle", run.bundle, run.id)
	// Files, not pipes: the detached container keeps them, and Wait must
	// not wait for it.
	cmd.Stdout, cmd.Stderr = logFile, logFile
	run.created = true
	err = r.startInCgroup(cmd, r.cgParent+"/"+run.id)
	if err == nil {
		err = cmd.Wait()
	}
	logFile.Close()
	if err != nil {
		s.Err = fmt.Errorf("crun run: %v: %s", err, benchkit.Tail(run.base+".log", 1500))
		return s
	}
	// PID 1 protects itself from the OOM killer as in the runtime. crun
	// 1.8.1 applies process.oomScoreAdj after dropping capabilities (EACCES
	// for a negative value), so the harness writes it; like the runtime's
	// init shim it ignores a failure (without CAP_SYS_RESOURCE).
	r.oomAdjErr = protectPID1(pidFile)
	t3 := time.Now()
	if err := pingUntilReady(ctx, filepath.Join(run.sock, protocol.SocketName), 30*time.Second); err != nil {
		s.Err = fmt.Errorf("reference guest: %v; log: %s", err, benchkit.Tail(run.base+".log", 1500))
		return s
	}
	t4 := time.Now()
	s.Layer, s.Mounts, s.Crun, s.Ready, s.Total = t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3), t4.Sub(t0)
	return s
}

func protectPID1(pidFile string) error {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return err
	}
	return os.WriteFile("/proc/"+strings.TrimSpace(string(b))+"/oom_score_adj", []byte("-998"), 0)
}

// refIDBase is the first host ID of the reference containers' user
// namespace (all of them share one range: crun does not care).
const refIDBase = sandbox.DefaultIDBase

// idmapUserns returns a user namespace with the reference's ID mapping,
// made once (a process that sleeps in it until the namespace is open).
func (r *Env) idmapUserns() (int, error) {
	if r.userns > 0 {
		return r.userns, nil
	}
	cmd := exec.Command("sleep", "60")
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: refIDBase, Size: sandbox.IDsPerExecution}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: m, GidMappings: m}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("a user namespace for the idmapped mounts: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	r.userns = fd
	return fd, nil
}

// mountRoot attaches the image to a loop device (autoclear) and mounts the
// overlay root of it and the template, both idmapped to the reference's
// ID range, as the runtime does (sandbox.MountIdmappedRoot).
func (r *Env) mountRoot(run *Container) error {
	loopf, dev, err := attachLoop(run.img)
	if err != nil {
		return err
	}
	defer loopf.Close() // the mount holds the device from here on (autoclear)
	run.loop = dev
	userns, err := r.idmapUserns()
	if err != nil {
		return err
	}
	m, err := sandbox.MountIdmappedRoot(r.rootfs, dev, userns, refIDBase)
	if err != nil {
		return err
	}
	defer unix.Close(m)
	if err := unix.MoveMount(m, "", unix.AT_FDCWD, run.rootfs, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the root on %s: %w", run.rootfs, err)
	}
	run.mountedRoot = true
	return nil
}

// attachLoop attaches image to a free loop device with autoclear, as the
// sandbox runtime does (LOOP_CTL_GET_FREE, then LOOP_CONFIGURE).
func attachLoop(image string) (*os.File, string, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", err
	}
	defer ctl.Close()
	back, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", err
	}
	defer back.Close()
	var last error
	for attempt := 0; attempt < 50; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, "", fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		var f *os.File
		for j := 0; j < 20; j++ {
			if f, err = os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0); err == nil || !errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err != nil {
			return nil, "", err
		}
		var cfg unix.LoopConfig
		cfg.Fd = uint32(back.Fd())
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
		err = unix.IoctlLoopConfigure(int(f.Fd()), &cfg)
		if err == nil {
			return f, dev, nil
		}
		f.Close()
		last = err
		if !errors.Is(err, unix.EBUSY) {
			return nil, "", fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
		}
		time.Sleep(time.Duration(attempt+1) * time.Millisecond)
	}
	return nil, "", fmt.Errorf("no free loop device: %w", last)
}

// keptCaps mirrors the sandbox runtime's capability set (init.go).
var keptCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
	"CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE", "CAP_SETFCAP"}

func (r *Env) writeConfig(run *Container) error {
	mem := int64(r.spec.MemoryMiB) << 20
	tmpfs := fmt.Sprintf("size=%d", mem/2)
	const nsn = "nosuid"
	cfg := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"terminal": false,
			"user":     map[string]any{"uid": 0, "gid": 0},
			"args":     []string{protocol.GuestBinaryPath},
			"env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=dumb",
				"container=kibotos", "KIBOTOS_WORKSPACE_ID=" + run.id},
			"cwd": "/",
			"capabilities": map[string]any{
				"bounding": keptCaps, "effective": keptCaps, "permitted": keptCaps,
			},
		},
		"root":     map[string]any{"path": run.rootfs, "readonly": false},
		"hostname": run.id,
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc", "options": []string{nsn, "nodev", "noexec"}},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{nsn, "nodev", "noexec", "ro"}},
			{"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": []string{nsn, "nodev", "noexec", "ro"}},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{nsn, "noexec", "mode=755", "size=1m", "nr_inodes=4096"}},
			{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{nsn, "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []string{nsn, "nodev", "noexec", "mode=1777", tmpfs}},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{nsn, "nodev", "mode=1777", tmpfs}},
			{"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": []string{nsn, "nodev", "mode=755", "size=16m"}},
			{"destination": protocol.SocketDir, "type": "bind", "source": run.sock, "options": []string{"bind", nsn, "nodev", "noexec", "idmap"}},
			{"destination": protocol.GuestBinaryPath, "type": "bind", "source": r.guest, "options": []string{"bind", "ro", nsn, "nodev"}},
		},
		"linux": map[string]any{
			"namespaces": []map[string]string{
				{"type": "user"}, {"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"},
			},
			"uidMappings":   []map[string]any{{"containerID": 0, "hostID": refIDBase, "size": sandbox.IDsPerExecution}},
			"gidMappings":   []map[string]any{{"containerID": 0, "hostID": refIDBase, "size": sandbox.IDsPerExecution}},
			"maskedPaths":   []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/kallsyms"},
			"readonlyPaths": []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"},
		},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(run.bundle, "config.json"), b, 0o600)
}

// pingUntilReady pings the guest's socket until it answers.
func pingUntilReady(ctx context.Context, sock string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if _, err := os.Stat(sock); err == nil {
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			_, err := protocol.Do(pctx, sock, protocol.Request{Op: protocol.OpPing})
			pcancel()
			if err == nil {
				return nil
			}
			last = err
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no answer within %v: %v", timeout, last)
		case <-time.After(PingEvery):
		}
	}
}

// teardown removes one reference container and everything it used.
func (r *Env) teardown(run *Container) error {
	var errs []error
	if run.created {
		out, err := exec.Command(r.crun, "--root", r.crunRoot, "delete", "--force", run.id).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "does not exist") {
			errs = append(errs, fmt.Errorf("crun delete %s: %v: %s", run.id, err, bytes.TrimSpace(out)))
		}
	}
	if run.cgroup {
		if err := removeCgroup(r.cgParent + "/" + run.id); err != nil {
			errs = append(errs, err)
		}
	}
	if run.mountedRoot {
		if err := unmountRetry(run.rootfs); err != nil {
			errs = append(errs, err)
		}
	}
	// The loop device detaches itself (autoclear) once the ext4 is gone.
	deadline := time.Now().Add(10 * time.Second)
	for {
		loops := LoopsUnder(run.img)
		if len(loops) == 0 {
			break
		}
		if time.Now().After(deadline) {
			errs = append(errs, fmt.Errorf("loop devices %v still attached to %s", loops, run.img))
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(errs) == 0 {
		for _, p := range []string{run.base, run.img, run.img + ".new", run.base + ".log", run.base + ".pid"} {
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, err)
			}
		}
		r.mu.Lock()
		delete(r.active, run.id)
		r.mu.Unlock()
	}
	return errors.Join(errs...)
}

func unmountRetry(target string) error {
	var err error
	for i := 0; i < 50; i++ {
		err = unix.Unmount(target, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Last resort: detach lazily so that nothing stays visible.
	if derr := unix.Unmount(target, unix.MNT_DETACH); derr == nil {
		return fmt.Errorf("unmount %s: %v (detached lazily)", target, err)
	}
	return fmt.Errorf("unmount %s: %w", target, err)
}

// cleanup tears down every container still active and removes the cgroup
// parents and the crun state.
func (r *Env) Cleanup() error {
	r.mu.Lock()
	var runs []*Container
	for _, run := range r.active {
		runs = append(runs, run)
	}
	r.mu.Unlock()
	var errs []error
	if r.thread != nil {
		r.thread.do(func() {
			for _, run := range runs {
				if err := r.teardown(run); err != nil {
					errs = append(errs, err)
				}
			}
		})
	}
	if r.thread != nil {
		r.thread.stop() // its mount namespace goes with it
		r.thread = nil
	}
	for _, d := range cgroupDirs(r.cgParent) {
		// Leaf cgroups are removed by teardown; the parent too.
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// leaks lists what the reference left on the host: mounts and loop devices
// under its directory, crun containers, cgroups.
func (r *Env) Leaks() []string {
	var out []string
	var b []byte
	var err error
	if r.thread != nil {
		// The reference's own mount namespace while its thread lives.
		r.thread.do(func() { b, err = os.ReadFile("/proc/thread-self/mountinfo") })
	} else {
		b, err = os.ReadFile("/proc/self/mountinfo")
	}
	if err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) > 4 && strings.HasPrefix(f[4], r.dir+"/") {
				out = append(out, "mount "+f[4])
			}
		}
	}
	for _, l := range LoopsUnder(r.dir + "/") {
		out = append(out, "loop device "+l)
	}
	if ents, err := os.ReadDir(r.crunRoot); err == nil {
		for _, e := range ents {
			out = append(out, "crun container "+e.Name())
		}
	}
	// The containers' cgroups; the parent itself once cleanup is done.
	for _, d := range cgroupDirs(r.cgParent) {
		if r.thread == nil {
			out = append(out, "cgroup "+d)
		}
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.IsDir() {
				out = append(out, "cgroup "+filepath.Join(d, e.Name()))
			}
		}
	}
	return out
}

// cgroupDirs lists the existing directories of cgroup rel in every mounted
// hierarchy under /sys/fs/cgroup (v2: the one).
func cgroupDirs(rel string) []string {
	var out []string
	if CgroupVersion() == 2 {
		d := filepath.Join("/sys/fs/cgroup", rel)
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			out = append(out, d)
		}
		return out
	}
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		d := filepath.Join("/sys/fs/cgroup", e.Name(), rel)
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			out = append(out, d)
		}
	}
	return out
}

// LoopsUnder lists the loop devices whose backing file is path, or lies
// under it when path ends in "/".
func LoopsUnder(path string) []string {
	ents, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err != nil {
			continue
		}
		back := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), " (deleted)")
		if back == path || (strings.HasSuffix(path, "/") && strings.HasPrefix(back, path)) {
			out = append(out, "/dev/"+e.Name()+" ("+back+")")
		}
	}
	return out
}

func tailBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// makeCgroup makes the reference container's cgroup with the runtime's
// limits (memory without swap, whole vCPUs of CPU quota, 1024 pids) and
// lets the caller join it.
func (r *Env) makeCgroup(run *Container) error {
	rel := r.cgParent + "/" + run.id
	mem := strconv.FormatUint(uint64(r.spec.MemoryMiB)<<20, 10)
	quota := strconv.FormatUint(uint64((r.spec.CPUMillis+999)/1000)*100000, 10)
	run.cgroup = true
	if CgroupVersion() == 2 {
		cur := "/sys/fs/cgroup"
		for _, part := range strings.Split(rel, "/") {
			for _, c := range []string{"+memory", "+cpu", "+pids"} {
				if err := writeFile(filepath.Join(cur, "cgroup.subtree_control"), c); err != nil {
					return err
				}
			}
			cur = filepath.Join(cur, part)
			if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		}
		for _, kv := range [][2]string{{"memory.max", mem}, {"memory.swap.max", "0"}, {"cpu.max", quota + " 100000"}, {"pids.max", "1024"}} {
			if err := writeFile(filepath.Join(cur, kv[0]), kv[1]); err != nil {
				return err
			}
		}
		return nil
	}
	for _, c := range refControllers {
		if err := os.MkdirAll(filepath.Join("/sys/fs/cgroup", c, rel), 0o755); err != nil {
			return err
		}
	}
	m := filepath.Join("/sys/fs/cgroup/memory", rel)
	for _, kv := range [][2]string{{"memory.limit_in_bytes", mem}, {"memory.memsw.limit_in_bytes", mem}} {
		if err := writeFile(filepath.Join(m, kv[0]), kv[1]); err != nil && !(kv[0] == "memory.memsw.limit_in_bytes" && errors.Is(err, os.ErrNotExist)) {
			return err
		}
	}
	c := filepath.Join("/sys/fs/cgroup/cpu", rel)
	if err := writeFile(filepath.Join(c, "cpu.cfs_period_us"), "100000"); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(c, "cpu.cfs_quota_us"), quota); err != nil {
		return err
	}
	return writeFile(filepath.Join("/sys/fs/cgroup/pids", rel, "pids.max"), "1024")
}

func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return nil
}

// removeCgroup removes cgroup rel from every hierarchy once it is empty.
func removeCgroup(rel string) error {
	deadline := time.Now().Add(5 * time.Second)
	for _, d := range cgroupDirs(rel) {
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("rmdir %s: %w", d, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// CgroupVersion reports 2 on a unified hierarchy, else 1.
func CgroupVersion() int {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return 2
	}
	return 1
}
