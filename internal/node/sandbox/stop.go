package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/mountinfo"
)

// Stopping an execution, and its end: Stop writes back (normal or
// best-effort) and kills; watch notices an execution that ends on its own
// (onExit); either way the release follows: the loop device has detached,
// the cgroup, the run directory and the record are removed. The layer stays.

// Stop stops the workspace's execution. Normal (force=false): the guest must
// confirm writeback first, otherwise ErrWritebackFailed and the execution
// keeps running. Forced: a best-effort writeback of at most
// ForceWritebackTimeout, then the execution is killed; a forced stop
// supersedes a normal stop in flight (which returns ErrStopSuperseded) and
// releases what an execution that already ended still holds (so does a
// normal stop: nothing is left to write back). Without any execution a
// normal stop returns ErrNotRunning, a forced one nil. The writable layer is
// always kept.
func (r *Runtime) Stop(ctx context.Context, workspaceID string, force bool) error {
	if r.closed() {
		return ErrClosed
	}
	if err := checkWorkspaceID(workspaceID); err != nil {
		return err
	}
	if force {
		r.supersede(workspaceID)
	}
	unlock, err := r.lockWS(ctx, workspaceID)
	if err != nil {
		return err
	}
	defer unlock()
	return r.stopLocked(ctx, workspaceID, force)
}

// supersede cancels a normal stop that waits for the guest.
func (r *Runtime) supersede(ws string) {
	if e := r.get(ws); e != nil {
		e.mu.Lock()
		e.forcePending = true
		if e.stopCancel != nil {
			e.stopCancel()
		}
		e.mu.Unlock()
	}
}

// stopLocked is Stop under the workspace lock.
func (r *Runtime) stopLocked(ctx context.Context, ws string, force bool) error {
	e := r.get(ws)
	if e == nil {
		if st, err := r.readState(ws); err == nil {
			e, _ = r.adoptLocked(st)
		}
	}
	if e == nil {
		if !force {
			return ErrNotRunning
		}
		return r.releaseLeftovers(ws)
	}
	if !e.alive() {
		// It ended but is still held (its release failed or is pending):
		// nothing can be written back any more, so either mode releases.
		return r.killAndRelease(e)
	}
	t0 := time.Now()
	if !force {
		if err := r.writeback(ctx, e); err != nil {
			return err
		}
	} else {
		r.writebackBestEffort(ctx, e)
	}
	tKill := time.Now()
	err := r.killAndRelease(e)
	r.log.Info("execution stopped", "workspace_id", ws, "force", force, "writeback", tKill.Sub(t0), "kill_release", time.Since(tKill), "err", err)
	return err
}

// writeback is a normal stop's writeback: the guest must confirm it within
// WritebackTimeout. A forced stop that arrives meanwhile (supersede) cancels
// the wait, and the normal stop returns ErrStopSuperseded.
func (r *Runtime) writeback(ctx context.Context, e *execution) error {
	ws := e.ws
	wctx, cancel := context.WithTimeout(ctx, r.cfg.WritebackTimeout)
	defer cancel()
	e.mu.Lock()
	if e.forcePending {
		e.mu.Unlock()
		return ErrStopSuperseded
	}
	e.stopCancel = cancel
	e.mu.Unlock()
	_, err := r.call(wctx, e, protocol.Request{
		Op: protocol.OpWriteback, TimeoutMillis: r.cfg.WritebackTimeout.Milliseconds(),
	})
	e.mu.Lock()
	e.stopCancel = nil
	superseded := e.forcePending
	e.mu.Unlock()
	if superseded {
		return ErrStopSuperseded
	}
	if err != nil {
		r.log.Warn("normal stop: no writeback confirmation; execution kept", "workspace_id", ws, "err", err)
		return &WritebackError{WorkspaceID: ws, Err: err}
	}
	return nil
}

// writebackBestEffort is a forced stop's writeback: at most
// ForceWritebackTimeout, and a failure is only logged.
func (r *Runtime) writebackBestEffort(ctx context.Context, e *execution) {
	wctx, cancel := context.WithTimeout(ctx, r.cfg.ForceWritebackTimeout)
	_, err := r.call(wctx, e, protocol.Request{
		Op: protocol.OpWriteback, TimeoutMillis: r.cfg.ForceWritebackTimeout.Milliseconds(),
	})
	cancel()
	if err != nil {
		r.log.Info("forced stop: best-effort writeback failed", "workspace_id", e.ws, "err", err)
	}
}

// killAndRelease ends every process of e and releases what it holds.
func (r *Runtime) killAndRelease(e *execution) error {
	e.mu.Lock()
	e.stopping = true
	e.mu.Unlock()
	r.stopHealth(e)
	deadline := time.Now().Add(15 * time.Second)
	for {
		e.signal(unix.SIGKILL)
		_ = r.cg.kill(e.st.Cgroup)
		select {
		case <-e.done:
		case <-time.After(100 * time.Millisecond):
			if time.Now().Before(deadline) {
				continue
			}
			return fmt.Errorf("%w: PID 1 of %s (%d) does not exit", ErrRelease, e.ws, e.st.PID)
		}
		break
	}
	if err := r.waitCgroupEmpty(e.st.Cgroup, 5*time.Second); err != nil {
		return err
	}
	return r.releaseLocked(e)
}

// waitCgroupEmpty waits until the cgroup rel lists no process, killing
// what it lists meanwhile; after timeout it returns ErrRelease.
func (r *Runtime) waitCgroupEmpty(rel string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := r.cg.procs(rel)
		if err == nil && len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: processes %v remain in cgroup %s", ErrRelease, pids, rel)
		}
		_ = r.cg.kill(rel)
		time.Sleep(10 * time.Millisecond)
	}
}

// watch waits for PID 1 to end.
func (r *Runtime) watch(e *execution) {
	if e.child != nil {
		_ = e.child.Wait()
	} else if e.pidf != nil {
		if rc, err := e.pidf.SyscallConn(); err == nil {
			_ = rc.Read(func(fd uintptr) bool {
				n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
				return n > 0
			})
		}
	}
	close(e.done)
	r.onExit(e)
}

// onExit releases an execution that ended on its own and reports it.
func (r *Runtime) onExit(e *execution) {
	if r.closed() || e.isStopping() {
		return
	}
	unlock, err := r.lockWS(r.ctx, e.ws)
	if err != nil {
		return
	}
	defer unlock()
	if r.get(e.ws) != e || e.isStopping() {
		return
	}
	kind, msg := EventExited, "the execution exited"
	if e.child != nil && e.child.ProcessState != nil {
		msg = "the execution exited: " + e.child.ProcessState.String()
	}
	// A power-off notice may still be queued (the guest sent it just
	// before it ended): the channel is the node's and outlives PID 1.
	if ch, err := e.channel(); err == nil {
		r.drainNotices(e, ch)
	}
	e.mu.Lock()
	if e.poweroff != "" {
		kind, msg = EventGuestExited, "the guest powered off: "+e.poweroff
	}
	e.mu.Unlock()
	e.mu.Lock()
	e.stopping = true // nothing else acts on it now
	e.mu.Unlock()
	r.stopHealth(e)
	r.cg.kill(e.st.Cgroup) // stragglers (cannot exist outside its PID namespace, but cheap)
	rerr := r.releaseLocked(e)
	r.log.Info("execution ended on its own", "workspace_id", e.ws, "kind", kind, "msg", msg, "release_err", rerr)
	r.emit(Event{Kind: kind, WorkspaceID: e.ws, Generation: e.st.Generation, Message: msg, Err: rerr})
}

// releaseLocked releases an ended execution and forgets it.
func (r *Runtime) releaseLocked(e *execution) error {
	e.closeNet() // PID 1 is gone: so is its network namespace
	if err := r.releaseResources(&e.st); err != nil {
		return err
	}
	r.mu.Lock()
	if r.execs[e.ws] == e {
		delete(r.execs, e.ws)
	}
	r.mu.Unlock()
	if e.pidf != nil {
		e.pidf.Close()
	}
	e.detachGuest()
	return nil
}

// releaseResources releases what a recorded execution holds once its
// processes are gone: its loop devices, the layer's and the Volume's (which
// detach themselves when the execution's mount namespace goes), its cgroup,
// its run directory and its state file. The layer and the Volume stay.
func (r *Runtime) releaseResources(st *execState) error {
	var errs []error
	t0 := time.Now()
	if err := waitLoopsDetached(st.Layer, 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	if st.Volume != nil && st.Volume.Image != "" {
		if err := waitLoopsDetached(st.Volume.Image, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	t1 := time.Now()
	if err := r.removeCgroup(st.Cgroup); err != nil {
		errs = append(errs, err)
	}
	r.log.Debug("release", "loop", t1.Sub(t0), "cgroup", time.Since(t1))
	if err := r.removeRunDir(st.WorkspaceID); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %v", ErrRelease, errors.Join(errs...))
	}
	if err := r.removeState(st.WorkspaceID); err != nil {
		return err
	}
	r.freeIDs(st.WorkspaceID, st.IDBase)
	return nil
}

// removeCgroup removes the cgroup rel (killing what it still lists, for at
// most 5s) and then, when it was the last, the runtime's own cgroup.
func (r *Runtime) removeCgroup(rel string) error {
	if !r.cg.exists(rel) {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := r.cg.remove(rel)
		if err == nil {
			r.pruneCgroupBase()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		_ = r.cg.kill(rel)
		time.Sleep(20 * time.Millisecond)
	}
}

// pruneCgroupBase removes this runtime's cgroup (CgroupParent/<root tag>)
// once the last execution cgroup under it is gone, so that a runtime that
// runs nothing leaves nothing in the cgroup tree. The tag is this Root's
// alone; CgroupParent itself may be shared with other runtimes (or made by
// the operator) and is left alone. cgMu keeps a concurrent start from
// creating an execution cgroup in between.
func (r *Runtime) pruneCgroupBase() {
	r.cgMu.Lock()
	defer r.cgMu.Unlock()
	if names, err := r.cg.children(r.cgBase); err != nil || len(names) > 0 {
		return
	}
	if err := r.cg.remove(r.cgBase); err != nil {
		r.log.Debug("remove the runtime's empty cgroup", "cgroup", r.cgBase, "err", err)
	}
}

// removeRunDir removes Root/run/<ws>. Nothing is mounted there on the host
// by design; should something be, it is detached first so that RemoveAll
// never walks into a mount.
func (r *Runtime) removeRunDir(ws string) error {
	dir := r.runDir(ws)
	if mounts, err := mountinfo.ReadSelf(); err == nil {
		for i := len(mounts) - 1; i >= 0; i-- {
			if under(mounts[i].MountPoint, dir) {
				if err := unix.Unmount(mounts[i].MountPoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("unmount %s: %w", mounts[i].MountPoint, err)
				}
			}
		}
	}
	return os.RemoveAll(dir)
}

// releaseLeftovers releases what a workspace may still hold without a
// known execution (a crashed start, a lost state file).
func (r *Runtime) releaseLeftovers(ws string) error {
	rel := r.cgroupRel(ws)
	st := &execState{WorkspaceID: ws, Cgroup: rel, Layer: r.layerPath(ws)}
	if old, err := r.readState(ws); err == nil {
		signalRecorded(old, unix.SIGKILL)
		// Its ID range is freed with the record (here and host-wide).
		st.IDBase = old.IDBase
		if v := old.Volume; v != nil && checkVolumeID(v.ID) == nil {
			// The image's path is the runtime's own, never the record's.
			st.Volume = &execVolume{ID: v.ID, Image: r.volumePath(v.ID)}
		}
	}
	if r.cg.exists(rel) {
		_ = r.cg.kill(rel)
		if err := r.waitCgroupEmpty(rel, 5*time.Second); err != nil {
			return err
		}
	}
	return r.releaseResources(st)
}
