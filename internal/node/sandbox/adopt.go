package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Adopt takes over what an earlier Runtime on the same Root left: every
// recorded execution whose PID 1 still runs (same pid, same start time, same
// boot) is re-adopted untouched, whatever its guest answers, and the node
// takes its ends of the guest channel and log back from PID 1 (channel.go).
// A guest that powered off while no runtime watched waits for this: it is
// ended, released and reported (EventGuestExited). Executions that ended
// while no runtime watched are released and reported (EventExited);
// half-started ones (the agent died during Start) and
// resources without a record (cgroups, loop devices of this Root's layers,
// run directories) are released. A state file that cannot be read is
// reported as an error and its execution left alone.
func (r *Runtime) Adopt(ctx context.Context) error {
	if r.closed() {
		return ErrClosed
	}
	var errs []error
	ents, err := os.ReadDir(r.execDir())
	if err != nil {
		return err
	}
	for _, ent := range ents {
		name := ent.Name()
		ws, ok := strings.CutSuffix(name, ".json")
		if !ok || strings.HasPrefix(name, ".") || !workspaceIDRe.MatchString(ws) {
			continue
		}
		if err := r.adoptOne(ctx, ws); err != nil {
			errs = append(errs, err)
		}
	}

	// Resources no record accounts for.
	orphans := map[string]bool{}
	if names, err := r.cg.children(r.cgBase); err == nil {
		for _, n := range names {
			orphans[n] = true
		}
	}
	if loops, err := attachedLoops(r.layersDir(), true); err == nil {
		for _, l := range loops {
			if ws, ok := strings.CutSuffix(filepath.Base(l.Backing), ".img"); ok {
				orphans[ws] = true
			}
		}
	}
	if runs, err := os.ReadDir(r.runsDir()); err == nil {
		for _, d := range runs {
			orphans[d.Name()] = true
		}
	}
	for ws := range orphans {
		if !workspaceIDRe.MatchString(ws) {
			continue
		}
		if err := r.releaseOrphan(ctx, ws); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *Runtime) adoptOne(ctx context.Context, ws string) error {
	unlock, err := r.lockWS(ctx, ws)
	if err != nil {
		return err
	}
	defer unlock()
	if r.get(ws) != nil {
		return nil
	}
	st, err := r.readState(ws)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if e, ended := r.adoptLocked(st); e != nil || ended {
		return nil
	}
	wasRunning := st.Phase == phaseRunning
	kind, msg := EventExited, "the execution exited while the node agent was away"
	rerr := r.releaseLeftovers(ws)
	if wasRunning {
		r.log.Info("recorded execution has ended", "workspace_id", ws, "kind", kind)
		r.emit(Event{Kind: kind, WorkspaceID: ws, Generation: st.Generation, Message: msg, Err: rerr})
	} else {
		r.log.Info("released a half-started execution", "workspace_id", ws, "err", rerr)
	}
	return rerr
}

// adoptLocked re-adopts a recorded execution whose PID 1 still runs. It
// returns nil when there is nothing to adopt; ended reports that the guest
// had powered off meanwhile, and that its execution has been ended,
// released and reported.
func (r *Runtime) adoptLocked(st *execState) (e *execution, ended bool) {
	if st.Phase != phaseRunning || st.BootID != bootID || r.closed() {
		return nil, false
	}
	fd, err := openProcess(st.PID, st.PIDStart)
	if err != nil || fd < 0 {
		return nil, false
	}
	e = &execution{ws: st.WorkspaceID, st: *st, pidf: os.NewFile(uintptr(fd), "pidfd"), done: make(chan struct{}), cond: GuestBooting}
	ch, logR, terr := takeBack(e.pidf, st)
	r.mu.Lock()
	r.execs[e.ws] = e
	r.mu.Unlock()
	go r.watch(e)
	if ch != nil && r.drainNotices(e, ch) {
		r.attachGuest(e, ch, logR)
		rerr := r.killAndRelease(e)
		msg := "the guest powered off while the node agent was away: " + e.poweroff
		r.log.Info("recorded execution had powered off", "workspace_id", e.ws, "release_err", rerr)
		r.emit(Event{Kind: EventGuestExited, WorkspaceID: e.ws, Generation: st.Generation, Message: msg, Err: rerr})
		return nil, true
	}
	r.attachGuest(e, ch, logR)
	if terr != nil {
		// The guest closed or replaced what PID 1 kept for the node: it
		// is unreachable (a forced stop still ends it).
		e.mu.Lock()
		e.cond, e.msg = GuestUnresponsive, "no channel to the guest after the node agent restarted"
		e.mu.Unlock()
		r.log.Warn("re-adopted without the guest's channel or log", "workspace_id", e.ws, "err", terr)
	} else {
		pctx, cancel := context.WithTimeout(r.ctx, r.cfg.HealthTimeout)
		cond, msg, err := r.ping(pctx, e)
		cancel()
		if err == nil {
			e.mu.Lock()
			e.cond, e.msg = cond, msg
			e.mu.Unlock()
		}
	}
	r.startHealth(e)
	r.log.Info("execution re-adopted", "workspace_id", e.ws, "generation", st.Generation, "pid", st.PID, "guest", e.cond)
	return e, false
}

// releaseOrphan releases the resources of ws when no execution of it is
// held or recorded.
func (r *Runtime) releaseOrphan(ctx context.Context, ws string) error {
	unlock, err := r.lockWS(ctx, ws)
	if err != nil {
		return err
	}
	defer unlock()
	if r.get(ws) != nil {
		return nil
	}
	if _, err := os.Stat(r.statePath(ws)); err == nil {
		return nil
	}
	r.log.Info("releasing unrecorded resources", "workspace_id", ws)
	return r.releaseLeftovers(ws)
}

// signalRecorded kills a recorded process if it is still the recorded one.
func signalRecorded(st *execState, sig unix.Signal) {
	if fd, _ := openProcess(st.PID, st.PIDStart); fd >= 0 {
		_ = unix.PidfdSendSignal(fd, sig, nil, 0)
		unix.Close(fd)
	}
}
