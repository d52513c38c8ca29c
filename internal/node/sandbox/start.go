package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/node/sandbox/initshim"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/workspace/limits"
)

// Start starts an execution for s and returns once its guest agent answers.
// It is idempotent: a workspace that already runs an execution is left
// alone (nil). A failed start is rolled back completely (the layer stays).
func (r *Runtime) Start(ctx context.Context, s Spec) error {
	if r.closed() {
		return ErrClosed
	}
	if err := r.validate(&s); err != nil {
		return err
	}
	ws := s.WorkspaceID
	unlock, err := r.lockWS(ctx, ws)
	if err != nil {
		return err
	}
	defer unlock()
	if e := r.get(ws); e != nil {
		if e.alive() {
			return nil
		}
		if err := r.killAndRelease(e); err != nil {
			return err
		}
	} else if st, err := r.readState(ws); err == nil {
		if e, _ := r.adoptLocked(st); e != nil {
			return nil
		}
	}
	if err := r.releaseLeftovers(ws); err != nil {
		return err
	}
	return r.start(ctx, s)
}

// start sets up an execution for s and starts it; Start has validated s,
// holds the workspace lock and has released whatever the workspace still
// held. The steps, in this order (it is tuned: each step's system calls
// and their order matter, see bench_test.go):
//
//  1. startLayer: the writable layer is made in the background meanwhile;
//  2. newExecState, allocIDs, writeState: the record, phase starting,
//     with the execution's ID range (userns.go);
//  3. createCgroup: the cgroup and its limits;
//  4. prepareRunDir: a fresh run directory (the mount points);
//  5. the layer (waited for) is attached to a loop device and mounted as
//     a detached mount (mountLayer); the cgroup's IO limits name it, and
//     its device list is the workspace's (limitLayerDevice); so is the
//     Volume's, when the spec has one (attachVolume; recordStart claimed
//     it with the first record);
//  6. openInitPipes, openGuestFiles, launchShim: the init shim starts in
//     a new user namespace and new namespaces it owns, born in the cgroup
//     when the host allows it, with the guest's channel and log pipe;
//  7. track, attachGuest: the shim is the execution now (pidfd, watcher,
//     channel, log copy); a shim not born in the cgroup is moved there;
//  8. applyNet: in mode PUBLIC_INTERNET, the TAP in the shim's network
//     namespace and the Network on it (network.go);
//  9. makeRoot, configureShim, waitShimSetup: the overlay root, its
//     layers idmapped through the shim's user namespace, goes to the shim
//     with its configuration (and the Volume's mount, idmapped too); the
//     shim moves it into place, mounts, pivots and execs the guest;
//  10. waitGuest: the guest's first answer, the protocol version handshake;
//  11. markRunning: the record, phase running; health pings start.
//
// On any error what was set up is released again (the layer stays).
func (r *Runtime) start(ctx context.Context, s Spec) (err error) {
	ws := s.WorkspaceID
	t0 := time.Now()
	layer := r.startLayer(ctx, ws, s.CapacityBytes)
	defer layer.wait()
	st := r.newExecState(s)
	if st.IDBase, err = r.allocIDs(ws); err != nil {
		return fmt.Errorf("%w: user namespace: %v", ErrStart, err)
	}
	if err := r.recordStart(ctx, st, s.Volume); err != nil {
		r.freeIDs(ws, st.IDBase)
		return err
	}
	var e *execution
	defer func() {
		if err == nil {
			return
		}
		var rerr error
		if e != nil {
			rerr = r.killAndRelease(e)
		} else {
			rerr = r.releaseResources(st)
		}
		if rerr != nil {
			r.log.Error("rollback of a failed start", "workspace_id", ws, "err", rerr)
		}
	}()

	if err := r.createCgroup(st.Cgroup, s); err != nil {
		return fmt.Errorf("%w: cgroup: %v", ErrStart, err)
	}
	if _, err := r.prepareRunDir(ws); err != nil {
		return fmt.Errorf("%w: %v", ErrStart, err)
	}
	lr := layer.wait()
	if errors.Is(lr.err, ErrNoStorage) {
		return fmt.Errorf("%w: writable layer: %w", ErrStart, lr.err)
	}
	if lr.err != nil {
		return fmt.Errorf("%w: writable layer: %v", ErrStart, lr.err)
	}
	loopf, dev, err := attachLoop(st.Layer)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrStart, err)
	}
	defer loopf.Close()
	st.Loop = dev
	layerMnt, err := mountLayer(dev)
	if err != nil {
		return fmt.Errorf("%w: writable layer: %v", ErrStart, err)
	}
	defer unix.Close(layerMnt)
	if err := r.limitLayerDevice(st.Cgroup, dev); err != nil {
		return fmt.Errorf("%w: cgroup: %v", ErrStart, err)
	}
	vol, err := r.attachVolume(st)
	defer vol.close()
	if err != nil {
		return fmt.Errorf("%w: volume: %v", ErrStart, err)
	}
	pipes, err := openInitPipes()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrStart, err)
	}
	defer pipes.closeNodeEnds()
	gf, err := openGuestFiles()
	if err != nil {
		return fmt.Errorf("%w: guest channel: %v", ErrStart, err)
	}
	defer gf.close()
	guest := r.guest
	if s.Guest != nil {
		guest = s.Guest
	}
	cmd, joined, startErr := r.launchShim(ws, st.Cgroup, func() *exec.Cmd { return r.shimCmd(gf, pipes, st.IDBase, guest) })
	pipes.closeShimEnds()
	gf.closeShimEnds()
	loopf.Close()   // the layer's mount holds the device (autoclear)
	vol.closeLoop() // so does the Volume's
	if startErr != nil {
		return fmt.Errorf("%w: init shim: %v", ErrStart, startErr)
	}
	st.ChannelInode, st.LogInode = gf.channelInode, gf.logInode
	e = r.track(ws, cmd, st)
	r.attachGuest(e, protocol.NewNodeChannel(gf.node), gf.logR)
	gf.node, gf.logR = nil, nil // the execution's now
	// No state file write here: until the guest answers, the record
	// written before the cgroup (phase starting) is all a restarted node
	// needs. It releases such a start through the cgroup, and the shim is
	// in the cgroup from before it is configured (born there, or migrated
	// just below); a shim the node never configured exits by itself when
	// the configuration pipe ends. The pid is recorded with the running
	// phase.
	if !joined {
		if err := r.cg.addProc(st.Cgroup, st.PID); err != nil {
			return fmt.Errorf("%w: cgroup: %v", ErrStart, err)
		}
	}
	// PID 1 protects itself from the OOM killer (the guest gives the
	// processes it starts a score of 0); root in its user namespace cannot
	// lower it. It takes CAP_SYS_RESOURCE, which some hosts withhold even
	// from root: then PID 1 keeps the score of 0 (said once).
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", st.PID), []byte("-998"), 0); err != nil {
		r.oomWarn.Do(func() {
			r.log.Warn("workspaces' PID 1 keeps an OOM score of 0 (the node lacks CAP_SYS_RESOURCE?)", "error", err)
		})
	}
	// The network before the guest: a workspace is available only with it.
	if err := r.applyNet(e, s.Network); err != nil {
		return fmt.Errorf("%w: network: %v", ErrStart, err)
	}
	rootMnt, err := r.makeRoot(st, layerMnt, vol.mnt)
	if err != nil {
		return fmt.Errorf("%w: root: %v", ErrStart, err)
	}
	err = r.configureShim(pipes.cfgW, s, rootMnt, vol.mnt)
	unix.Close(rootMnt)
	if err != nil {
		return fmt.Errorf("%w: configure init shim: %v", ErrStart, err)
	}
	if err := r.waitShimSetup(ctx, pipes.statR); err != nil {
		return err
	}
	tExec := time.Now()
	if err := r.waitGuest(ctx, e); err != nil {
		return err
	}
	if err := r.markRunning(e, st); err != nil {
		return fmt.Errorf("%w: state: %v", ErrStart, err)
	}
	r.startHealth(e)
	r.log.Info("execution started", "workspace_id", ws, "generation", s.Generation, "pid", st.PID,
		"loop", dev, "layer_created", lr.created, "setup", tExec.Sub(t0), "total", time.Since(t0))
	return nil
}

// pendingLayer is the writable layer that startLayer makes in the
// background.
type pendingLayer struct {
	c    chan layerResult
	res  layerResult
	done bool
}

// layerResult is the outcome of ensureLayer.
type layerResult struct {
	created bool
	err     error
}

// startLayer makes the writable layer (ensureLayer) in the background. A
// first start makes it while the record, the cgroup and the run directory
// are set up: both end in fsyncs, which the filesystem may then commit
// together. start waits for it on every return, so that no layer appears
// after Start returned (a Delete may follow).
func (r *Runtime) startLayer(ctx context.Context, ws string, capacity uint64) pendingLayer {
	c := make(chan layerResult, 1)
	go func() {
		created, err := r.ensureLayer(ctx, ws, capacity)
		c <- layerResult{created, err}
	}()
	return pendingLayer{c: c}
}

// wait waits for the layer; later calls return the same result.
func (l *pendingLayer) wait() layerResult {
	if !l.done {
		l.res, l.done = <-l.c, true
	}
	return l.res
}

// newExecState is the record of a start of s, in phase starting.
func (r *Runtime) newExecState(s Spec) *execState {
	return &execState{
		WorkspaceID:   s.WorkspaceID,
		Generation:    s.Generation,
		Phase:         phaseStarting,
		Cgroup:        r.cgroupRel(s.WorkspaceID),
		Layer:         r.layerPath(s.WorkspaceID),
		TemplateDir:   s.TemplateDir,
		CapacityBytes: s.CapacityBytes,
		MemoryMiB:     s.MemoryMiB,
		CPUMillis:     s.CPUMillis,
		PidsMax:       s.PidsMax,
		StartedAt:     time.Now().UTC(),
		BootID:        bootID,
		DNSVersion:    nodewire.DNSConfigVersion,
	}
}

// createCgroup creates the execution's cgroup rel with the limits of s.
// cgMu keeps pruneCgroupBase from removing the runtime's cgroup, the
// parent, in between.
func (r *Runtime) createCgroup(rel string, s Spec) error {
	r.cgMu.Lock()
	err := r.cg.create(rel, cgroupLimits{
		MemoryBytes: uint64(s.MemoryMiB) * limits.MiB,
		VCPUs:       limits.VCPUs(s.CPUMillis),
		PidsMax:     s.PidsMax,
	})
	r.cgMu.Unlock()
	return err
}

// prepareRunDir makes the run directory of ws afresh, with the mount
// points the shim uses (layer, root), and returns it. Nothing is mounted
// there on the host, and nothing of it is visible in the workspace.
func (r *Runtime) prepareRunDir(ws string) (string, error) {
	run := r.runDir(ws)
	if err := r.removeRunDir(ws); err != nil {
		return "", err
	}
	for _, d := range []string{"layer", "root"} {
		if err := os.MkdirAll(filepath.Join(run, d), 0o700); err != nil {
			return "", err
		}
	}
	return run, nil
}

// initPipes connect the node and the init shim during its setup. The shim
// inherits its ends as initshim.ConfigFD (cfgR) and initshim.StatusFD
// (statW).
type initPipes struct {
	cfgR, cfgW   *os.File // the shim's configuration (initConfig, JSON, and the root): a SOCK_SEQPACKET pair
	statR, statW *os.File // a setup error of the shim; its exec of the guest closes it empty
}

// openInitPipes opens the pipes; on error none is left open.
func openInitPipes() (initPipes, error) {
	var p initPipes
	var err error
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return initPipes{}, err
	}
	p.cfgR, p.cfgW = os.NewFile(uintptr(fds[0]), "config"), os.NewFile(uintptr(fds[1]), "config")
	if p.statR, p.statW, err = os.Pipe(); err != nil {
		p.cfgR.Close()
		p.cfgW.Close()
		return initPipes{}, err
	}
	return p, nil
}

// closeShimEnds closes the shim's ends once it has them (or failed to
// start).
func (p initPipes) closeShimEnds() {
	p.cfgR.Close()
	p.statW.Close()
}

// closeNodeEnds closes the node's ends (cfgW may be closed already).
func (p initPipes) closeNodeEnds() {
	p.statR.Close()
	p.cfgW.Close()
}

// shimCmd is the command of the init shim: its own session and new
// namespaces, a user namespace among them whose IDs are the range from
// idBase (userns.go; the uid and gid maps are written before the shim
// runs), its output into the log pipe, and as fds 3 to 9 the guest's
// channel and what PID 1 keeps of the node's (initshim.ChannelFD,
// NodeChannelFD, LogReadFD), the configuration socket, the status pipe,
// nothing (8) and the guest binary guest, a sealed memfd (initshim.ConfigFD,
// StatusFD, GuestFD). The default shim, the guest itself, is executed from
// that memfd: root of the user namespace may not search the directories of
// the host's.
func (r *Runtime) shimCmd(g *guestFiles, p initPipes, idBase uint32, guest *os.File) *exec.Cmd {
	path := r.cfg.InitBinary
	if path == r.cfg.GuestBinary {
		path = "/proc/self/fd/" + strconv.Itoa(initshim.GuestFD)
	}
	return &exec.Cmd{
		Path:       path,
		Args:       []string{initArg0},
		Env:        []string{},
		Dir:        "/",
		Stdout:     g.logW,
		Stderr:     g.logW,
		ExtraFiles: append(g.shimFiles(), p.cfgR, p.statW, nil, guest),
		SysProcAttr: &syscall.SysProcAttr{
			// Own session and no parent-death signal: the execution
			// outlives the node agent.
			Setsid: true,
			Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS |
				unix.CLONE_NEWIPC | unix.CLONE_NEWNET,
			UidMappings:                idMappings(idBase),
			GidMappings:                idMappings(idBase),
			GidMappingsEnableSetgroups: true,
			// The shim's IDs become 0 of its user namespace (the host
			// IDs idBase), and with them its capabilities there.
			Credential: &syscall.Credential{Uid: 0, Gid: 0},
		},
	}
}

// makeRoot makes the overlay root of the execution st from its layer's
// detached mount, idmapped through the shim's user namespace; the Volume's
// detached mount (volMnt, -1 for none) is idmapped the same way.
func (r *Runtime) makeRoot(st *execState, layerMnt, volMnt int) (int, error) {
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", st.PID), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("the shim's user namespace: %w", err)
	}
	defer unix.Close(ns)
	if volMnt >= 0 {
		idmap := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns)}
		if err := unix.MountSetattr(volMnt, "", unix.AT_EMPTY_PATH, idmap); err != nil {
			return -1, fmt.Errorf("idmap the volume: %w", err)
		}
	}
	return rootMount(st.TemplateDir, layerMnt, ns, st.IDBase)
}

// launchShim starts the init shim from mk. It is born in its cgroup rel
// when the host allows it (see cgroups.startIn; joined is true); otherwise
// a fresh command is started outside, and the caller moves it in with
// addProc before it configures it.
func (r *Runtime) launchShim(ws, rel string, mk func() *exec.Cmd) (cmd *exec.Cmd, joined bool, err error) {
	cmd, why := r.cg.startIn(rel, mk)
	joined = cmd != nil
	switch {
	case why != nil && joined:
		r.log.Warn("init shim started inside its cgroup, but", "workspace_id", ws, "err", why)
	case why != nil:
		r.log.Debug("init shim not started inside its cgroup; migrating it", "workspace_id", ws, "why", why)
	}
	if !joined {
		cmd = mk()
		err = startCmd(cmd)
	}
	return cmd, joined, err
}

// track makes the started shim the execution of ws: its pid and start
// time go into st, its pidfd and a watcher of its end (watch) into the
// execution, which the runtime holds from now on.
func (r *Runtime) track(ws string, cmd *exec.Cmd, st *execState) *execution {
	pid := cmd.Process.Pid
	e := &execution{ws: ws, child: cmd, done: make(chan struct{}), cond: GuestBooting}
	st.PID = pid
	if fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK); err == nil {
		e.pidf = os.NewFile(uintptr(fd), "pidfd")
	}
	st.PIDStart, _ = procStartTime(pid)
	e.st = *st
	r.mu.Lock()
	r.execs[ws] = e
	r.mu.Unlock()
	go r.watch(e)
	return e
}

// userLimits are the per-user-namespace limits of every execution
// (/proc/sys/user in its user namespace).
var userLimits = map[string]uint64{
	"max_inotify_instances": 128,
	"max_inotify_watches":   65536,
}

// configureShim sends the shim its configuration, the overlay root
// (rootMnt) and the Volume's mount (volMnt, -1 for none) on w and closes w.
func (r *Runtime) configureShim(w *os.File, s Spec, rootMnt, volMnt int) error {
	cfg := initConfig{
		WorkspaceID:   s.WorkspaceID,
		CgroupVersion: r.cg.version(),
		TmpfsBytes:    uint64(s.MemoryMiB) * limits.MiB / 2,
		UserLimits:    userLimits,
	}
	fds := []int{rootMnt}
	if volMnt >= 0 {
		cfg.VolumePath = s.Volume.MountPath
		fds = append(fds, volMnt)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	defer w.Close()
	rc, err := w.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.Sendmsg(int(fd), b, unix.UnixRights(fds...), nil, 0)
	}); err != nil {
		return err
	}
	return serr
}

// waitShimSetup waits for the shim's setup (at most StartTimeout). The
// shim reports a setup error on the status pipe; a successful exec of the
// guest closes it empty.
func (r *Runtime) waitShimSetup(ctx context.Context, status *os.File) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.StartTimeout)
	defer cancel()
	msgc := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(status, 64<<10))
		msgc <- b
	}()
	var msg []byte
	select {
	case msg = <-msgc:
	case <-ctx.Done():
		return fmt.Errorf("%w: init shim: %v", ErrStart, ctx.Err())
	}
	if len(msg) > 0 {
		return fmt.Errorf("%w: %s", ErrStart, msg)
	}
	return nil
}

// markRunning records that the guest answered: phase running, in e and in
// the state file.
func (r *Runtime) markRunning(e *execution, st *execState) error {
	st.Phase = phaseRunning
	e.mu.Lock()
	e.st.Phase = phaseRunning
	e.mu.Unlock()
	return r.writeState(st)
}

// logTail returns the end of e's guest log for error messages, once the
// log of an ended execution is copied (at most 500 ms).
func (r *Runtime) logTail(e *execution) string {
	e.mu.Lock()
	done := e.logDone
	e.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-time.After(500 * time.Millisecond):
		}
	}
	f, err := os.Open(r.logPath(e.ws))
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := fi.Size() - 2048
	if off < 0 {
		off = 0
	}
	b := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(b, off)
	return strings.TrimSpace(string(b[:n]))
}

// waitGuest waits for the guest's first answer (at most StartTimeout): a
// ping on the channel, which waits in the channel until the guest serves
// it. The execution's end cuts the wait short. The answer is the protocol
// version handshake: a guest that does not state the node's version
// (ErrGuestProtocol, Permanent) fails the start, which is then rolled back.
func (r *Runtime) waitGuest(ctx context.Context, e *execution) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.StartTimeout)
	defer cancel()
	go func() {
		select {
		case <-e.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	cond, msg, err := r.ping(ctx, e)
	if err == nil {
		e.mu.Lock()
		e.cond, e.msg = cond, msg
		e.mu.Unlock()
		return nil
	}
	if errors.Is(err, ErrGuestProtocol) {
		return err
	}
	if !e.alive() {
		return fmt.Errorf("%w: the execution exited before its guest answered: %s", ErrStart, r.logTail(e))
	}
	return fmt.Errorf("%w: %v", ErrGuestNotReady, err)
}

// recordStart writes the first record of the execution st (phase
// starting). With a Volume v it first claims it under the Volume's lock
// (claimVolume) and records it with the execution before unlocking, so that
// no other start mounts it and nothing grows or deletes it meanwhile.
func (r *Runtime) recordStart(ctx context.Context, st *execState, v *VolumeMount) error {
	if v != nil {
		unlock, err := r.lockVolume(ctx, v.VolumeID)
		if err != nil {
			return err
		}
		defer unlock()
		if st.Volume, err = r.claimVolume(st.WorkspaceID, v); err != nil {
			return fmt.Errorf("%w: %w", ErrStart, err)
		}
	}
	if err := r.writeState(st); err != nil {
		return fmt.Errorf("%w: state: %v", ErrStart, err)
	}
	return nil
}

// startVolume is the Volume of a start being set up: its loop device (held
// until the shim's mount holds it) and its detached mount.
type startVolume struct {
	loop *os.File
	mnt  int
}

// attachVolume attaches the Volume st records to a loop device (recorded in
// st), mounts it as a detached mount and applies the execution's IO limits
// to the device. Without a Volume it returns mnt -1.
func (r *Runtime) attachVolume(st *execState) (*startVolume, error) {
	v := &startVolume{mnt: -1}
	if st.Volume == nil {
		return v, nil
	}
	f, dev, err := attachLoop(st.Volume.Image)
	if err != nil {
		return v, err
	}
	v.loop = f
	st.Volume.Loop = dev
	if v.mnt, err = mountVolume(dev); err != nil {
		return v, err
	}
	num, err := blockDevice(dev)
	if err != nil {
		return v, err
	}
	if err := r.cg.limitIO(st.Cgroup, num, r.ioLimits()); err != nil {
		return v, fmt.Errorf("cgroup: %w", err)
	}
	return v, nil
}

// closeLoop closes the node's hold on the loop device (the mount holds it).
func (v *startVolume) closeLoop() {
	if v.loop != nil {
		v.loop.Close()
		v.loop = nil
	}
}

// close closes what the node still holds of the Volume.
func (v *startVolume) close() {
	v.closeLoop()
	if v.mnt >= 0 {
		unix.Close(v.mnt)
		v.mnt = -1
	}
}
