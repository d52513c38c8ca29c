// Package initshim is the sandbox runtime's init shim: the process that
// starts as PID 1 in an execution's new namespaces, sets up its mounts and
// root, and execs kibotos-guest. It is small on purpose (the standard
// library, x/sys/unix, the guest protocol and the seccomp filter only) so
// that kibotos-guest itself can be the shim: the runtime then starts a
// binary of a few MB instead of re-executing the whole node. Any binary whose main calls
// MaybeRun first (kibotos-guest, and through sandbox.MaybeRunInit the
// binaries that embed the runtime) can serve as the shim.
package initshim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/node/sandbox/seccomp"
)

// Arg0 is argv[0] of the init shim: the runtime executes its init binary
// (by default kibotos-guest) under this name inside the new namespaces.
const Arg0 = "kibotos-sandbox-init"

// File descriptors the runtime hands to the init shim.
const (
	ConfigFD = 3 // read end of a pipe: the Config JSON, then EOF
	StatusFD = 4 // write end of a pipe: an error message, or EOF at exec
	LoopFD   = 5 // the attached loop device of the writable layer
	// ReadyFD is the write end of the readiness pipe: the shim passes
	// it on to kibotos-guest (protocol.ReadyFDEnv), which writes to it once
	// it listens.
	ReadyFD = 6
)

// Config is what the runtime tells the init shim (JSON on ConfigFD). All
// paths are host paths except where noted.
type Config struct {
	WorkspaceID string `json:"workspace_id"`
	// Loop is the loop device (held open at LoopFD until mounted).
	Loop string `json:"loop"`
	// LayerMount and RootMount are empty host directories: the writable
	// layer and the overlay root are mounted there, in the execution's
	// private mount namespace only.
	LayerMount  string `json:"layer_mount"`
	RootMount   string `json:"root_mount"`
	TemplateDir string `json:"template_dir"`
	// SockDir is bind-mounted at protocol.SocketDir.
	SockDir string `json:"sock_dir"`
	// GuestBinary is bind-mounted read-only at protocol.GuestBinaryPath.
	GuestBinary   string `json:"guest_binary"`
	CgroupVersion int    `json:"cgroup_version"`
	// TmpfsBytes sizes /tmp and /dev/shm.
	TmpfsBytes uint64 `json:"tmpfs_bytes"`
}

// MaybeRun runs the sandbox init shim and never returns when this process
// is one (argv[0] is Arg0); otherwise it returns false at once. Every binary
// that may serve as the shim (kibotos-guest, and the binaries that embed
// the runtime through sandbox.MaybeRunInit) must call it first thing in
// main.
//
// The shim starts as PID 1 of new mount, PID, UTS, IPC and network
// namespaces (clone flags set by the node), in the execution's cgroup (born
// there, or placed there by the node before it sends the configuration),
// and waits for its configuration. It then enters a new cgroup namespace, mounts
// the writable layer and the overlay root, /proc, /sys (read-only), a
// minimal /dev, /tmp, /run with the guest socket directory and the guest
// binary, sets the hostname, brings up lo, pivots into the new root, drops
// capabilities from the bounding set and execs kibotos-guest, which stays
// PID 1.
func MaybeRun() bool {
	if len(os.Args) == 0 || os.Args[0] != Arg0 {
		return false
	}
	// Namespace and mount work below must stay on one thread: the cgroup
	// namespace is per thread until exec.
	runtime.LockOSThread()
	err := runInit()
	status := os.NewFile(StatusFD, "status")
	if status != nil {
		fmt.Fprintf(status, "%v", err)
	}
	os.Exit(1)
	return true
}

func runInit() error {
	unix.Umask(0)
	unix.CloseOnExec(StatusFD)
	cf := os.NewFile(ConfigFD, "config")
	if cf == nil {
		return errors.New("init: no configuration pipe")
	}
	b, err := io.ReadAll(cf)
	cf.Close()
	if err != nil {
		return fmt.Errorf("init: read configuration: %w", err)
	}
	if len(b) == 0 {
		return errors.New("init: the node went away before configuring the execution")
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("init: configuration: %w", err)
	}
	// The node has put this process into the execution's cgroup: a cgroup
	// namespace made now has that cgroup as its root.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("init: unshare cgroup namespace: %w", err)
	}
	if err := setupRoot(&cfg); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.WorkspaceID)); err != nil {
		return fmt.Errorf("init: sethostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return fmt.Errorf("init: lo up: %w", err)
	}
	if err := pivot(cfg.RootMount); err != nil {
		return err
	}
	// PID 1 protects itself from the OOM killer (its commands reset theirs
	// through the guest's exec trampoline).
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("-998"), 0)
	// The system call filter goes on while this process still holds
	// CAP_SYS_ADMIN (so no_new_privs is not needed), and stays across the
	// exec of the guest and in everything it starts.
	if err := seccomp.Install(); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := dropCapabilities(); err != nil {
		return err
	}
	env := []string{
		"PATH=" + workspacePath,
		"HOME=/root",
		"TERM=dumb",
		"container=kibotos",
		"KIBOTOS_WORKSPACE_ID=" + cfg.WorkspaceID,
	}
	if _, err := unix.FcntlInt(ReadyFD, unix.F_GETFD, 0); err == nil {
		env = append(env, protocol.ReadyFDEnv+"="+strconv.Itoa(ReadyFD))
	}
	err = unix.Exec(protocol.GuestBinaryPath, []string{"kibotos-guest"}, env)
	return fmt.Errorf("init: exec %s: %w", protocol.GuestBinaryPath, err)
}

// workspacePath is the PATH of the guest agent.
const workspacePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func mount(source, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("init: mount %s on %s (%s): %w", source, target, fstype, err)
	}
	return nil
}

// mountPoint makes sure root/name is a real directory, not a symlink that
// would take a mount somewhere else: the writable layer is the user's.
func mountPoint(root, name string, mode os.FileMode) (string, error) {
	p := filepath.Join(root, name)
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.Mkdir(p, mode); err != nil {
			return "", fmt.Errorf("init: %w", err)
		}
		return p, nil
	case err != nil:
		return "", fmt.Errorf("init: %w", err)
	case !fi.IsDir():
		return "", fmt.Errorf("init: /%s in the workspace is not a directory (%s); the workspace cannot start until it is one", name, fi.Mode().Type())
	}
	return p, nil
}

func setupRoot(cfg *Config) error {
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := mount(cfg.Loop, cfg.LayerMount, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return err
	}
	if f := os.NewFile(LoopFD, "loop"); f != nil {
		f.Close() // the mount holds the device now (autoclear)
	}
	upper := filepath.Join(cfg.LayerMount, "upper")
	work := filepath.Join(cfg.LayerMount, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("init: %w", err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off", cfg.TemplateDir, upper, work)
	if err := mount("overlay", cfg.RootMount, "overlay", unix.MS_NODEV, opts); err != nil {
		return err
	}
	root := cfg.RootMount
	const nosuidNodevNoexec = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

	// /proc, with the host-wide knobs read-only and the sensitive files masked.
	proc, err := mountPoint(root, "proc", 0o555)
	if err != nil {
		return err
	}
	if err := mount("proc", proc, "proc", nosuidNodevNoexec, ""); err != nil {
		return err
	}
	// /sys read-only, the cgroup of the execution visible (read-only) at
	// /sys/fs/cgroup through the cgroup namespace.
	sys, err := mountPoint(root, "sys", 0o555)
	if err != nil {
		return err
	}
	if err := mount("sysfs", sys, "sysfs", nosuidNodevNoexec|unix.MS_RDONLY, ""); err != nil {
		return err
	}
	mountCgroupFS(filepath.Join(sys, "fs/cgroup"), cfg.CgroupVersion)

	// /dev: a small tmpfs with the usual character devices and devpts.
	dev, err := mountPoint(root, "dev", 0o755)
	if err != nil {
		return err
	}
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=1m,nr_inodes=4096"); err != nil {
		return err
	}
	for _, d := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		if err := unix.Mknod(filepath.Join(dev, d.name), unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			return fmt.Errorf("init: mknod /dev/%s: %w", d.name, err)
		}
	}
	for _, l := range [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"}} {
		if err := os.Symlink(l[0], filepath.Join(dev, l[1])); err != nil {
			return fmt.Errorf("init: %w", err)
		}
	}
	if err := os.Mkdir(filepath.Join(dev, "pts"), 0o755); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dev, "shm"), os.ModeSticky|0o777); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	tmpfsSize := strconv.FormatUint(cfg.TmpfsBytes, 10)
	if err := mount("shm", filepath.Join(dev, "shm"), "tmpfs", nosuidNodevNoexec, "mode=1777,size="+tmpfsSize); err != nil {
		return err
	}
	if err := hardenProc(proc, dev); err != nil {
		return err
	}

	// /tmp: tmpfs (charged to the execution's memory).
	tmp, err := mountPoint(root, "tmp", os.ModeSticky|0o777)
	if err != nil {
		return err
	}
	if err := mount("tmpfs", tmp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size="+tmpfsSize); err != nil {
		return err
	}

	// /run: tmpfs with the guest's socket directory and binary.
	run, err := mountPoint(root, "run", 0o755)
	if err != nil {
		return err
	}
	if err := mount("tmpfs", run, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755,size=16m"); err != nil {
		return err
	}
	gdir := filepath.Join(root, protocol.GuestDir)
	if err := os.MkdirAll(gdir, 0o755); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	sock := filepath.Join(root, protocol.SocketDir)
	if err := os.Mkdir(sock, 0o700); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := mount(cfg.SockDir, sock, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	if err := mount("", sock, "", unix.MS_BIND|unix.MS_REMOUNT|nosuidNodevNoexec, ""); err != nil {
		return err
	}
	bin := filepath.Join(root, protocol.GuestBinaryPath)
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := mount(cfg.GuestBinary, bin, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return mount("", bin, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
}

// mountCgroupFS shows the execution's own cgroup (the cgroup namespace's
// root) read-only, so that the guest can measure memory pressure. Failure
// only costs that measurement.
func mountCgroupFS(target string, version int) {
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RDONLY
	if version == 2 {
		_ = unix.Mount("cgroup2", target, "cgroup2", flags, "")
		return
	}
	if err := unix.Mount("tmpfs", target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return
	}
	mem := filepath.Join(target, "memory")
	if err := os.Mkdir(mem, 0o555); err == nil {
		_ = unix.Mount("cgroup", mem, "cgroup", flags, "memory")
	}
	_ = unix.Mount("", target, "", unix.MS_REMOUNT|flags, "mode=755,size=64k")
}

// hardenProc makes the host-wide parts of /proc read-only and masks files
// that expose the host's kernel.
func hardenProc(proc, dev string) error {
	const ro = unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	for _, p := range []string{"sys", "sysrq-trigger", "irq", "bus", "fs"} {
		t := filepath.Join(proc, p)
		if _, err := os.Lstat(t); err != nil {
			continue
		}
		if err := mount(t, t, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
		if err := mount("", t, "", ro, ""); err != nil {
			return err
		}
	}
	for _, p := range []string{"kcore", "keys", "timer_list", "sched_debug", "kallsyms"} {
		t := filepath.Join(proc, p)
		if fi, err := os.Lstat(t); err != nil || fi.IsDir() {
			continue
		}
		if err := mount(filepath.Join(dev, "null"), t, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	return nil
}

// loopbackUp brings up lo, the only interface of the new network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// pivot makes root the root of the mount namespace and detaches the old
// one (pivot_root(".", ".") stacks the old root on the new one).
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("init: chdir %s: %w", root, err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("init: pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("init: detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("init: chdir /: %w", err)
	}
	return nil
}

// keptCapabilities is what processes of a workspace may have (the set
// container runtimes grant by default, without CAP_MKNOD since the
// runtime has no device cgroup): no mounts, no raw devices, no module
// loading, no ptrace, no open_by_handle_at.
var keptCapabilities = map[int]bool{
	unix.CAP_CHOWN: true, unix.CAP_DAC_OVERRIDE: true, unix.CAP_FOWNER: true,
	unix.CAP_FSETID: true, unix.CAP_KILL: true, unix.CAP_SETGID: true,
	unix.CAP_SETUID: true, unix.CAP_SETPCAP: true, unix.CAP_NET_BIND_SERVICE: true,
	unix.CAP_NET_RAW: true, unix.CAP_SYS_CHROOT: true, unix.CAP_AUDIT_WRITE: true,
	unix.CAP_SETFCAP: true,
}

func dropCapabilities() error {
	last := unix.CAP_LAST_CAP
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if keptCapabilities[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("init: drop capability %d: %w", c, err)
		}
	}
	_ = unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	// No inheritable capabilities: after exec, root has exactly the
	// bounding set.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("init: capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("init: capset: %w", err)
	}
	return nil
}
