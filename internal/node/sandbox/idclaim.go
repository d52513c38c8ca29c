package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Host-wide claims of ID ranges. Two nodes on one host (two Roots) draw
// their executions' ID ranges from the same host IDs (Config.IDBase), and
// two executions must never share a range, whichever node runs them: a
// range is claimed in Config.IDClaimDir (DefaultIDClaimDir, on the tmpfs
// /run, which a reboot empties together with the executions) by a file
// named after its first host ID, made with O_EXCL under an flock of the
// directory, holding the claiming Root and workspace and the claiming
// process (pid and start time). A claim is live while that process runs
// (it may not have recorded the execution yet) or while its Root records
// an execution of that workspace with that range; any other (a node that
// crashed between its claim and its record, or whose state was wiped) is
// stale and taken over.

// DefaultIDClaimDir is where the nodes of a host claim ID ranges.
const DefaultIDClaimDir = "/run/kibotos/id-ranges"

// idClaim is the content of a claim file.
type idClaim struct {
	Root        string `json:"root"`
	WorkspaceID string `json:"workspace_id"`
	PID         int    `json:"pid"`
	PIDStart    uint64 `json:"pid_start"`
}

// lockClaims takes the host-wide lock of the claim directory.
func (r *Runtime) lockClaims() (func(), error) {
	dir := r.cfg.IDClaimDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: ID range claims: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sandbox: ID range claims: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: ID range claims: %w", err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}

func (r *Runtime) claimPath(base uint32) string {
	return filepath.Join(r.cfg.IDClaimDir, strconv.FormatUint(uint64(base), 10))
}

// claimIDs claims the range from base for ws on the host; false when
// another live execution holds it. The caller holds lockClaims.
func (r *Runtime) claimIDs(base uint32, ws string) (bool, error) {
	p := r.claimPath(base)
	start, _ := procStartTime(os.Getpid())
	b, err := json.Marshal(idClaim{Root: r.root, WorkspaceID: ws, PID: os.Getpid(), PIDStart: start})
	if err != nil {
		return false, err
	}
	for attempt := 0; attempt < 2; attempt++ {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, werr := f.Write(b)
			cerr := f.Close()
			if err := errors.Join(werr, cerr); err != nil {
				_ = os.Remove(p)
				return false, err
			}
			return true, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return false, err
		}
		if r.claimLive(p, base) {
			return false, nil
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, err
		}
	}
	return false, nil
}

// claimLive reports whether the claim at p is live: its process runs, or
// its Root records an execution of its workspace with the range from
// base. A claim of this Root counts as live only through r.idUsed (the
// caller checked it is not there).
func (r *Runtime) claimLive(p string, base uint32) bool {
	b, err := os.ReadFile(p)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	var c idClaim
	if json.Unmarshal(b, &c) != nil || !filepath.IsAbs(c.Root) || checkWorkspaceID(c.WorkspaceID) != nil {
		return false
	}
	if c.Root == r.root {
		return false
	}
	if c.PID > 0 && c.PIDStart != 0 {
		if st, err := procStartTime(c.PID); err == nil && st == c.PIDStart {
			return true // the claiming process runs
		}
	}
	sb, err := os.ReadFile(filepath.Join(c.Root, "exec", c.WorkspaceID+".json"))
	if err != nil {
		// Unreadable for another reason than absence: keep out of it.
		return !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTDIR)
	}
	var st struct {
		IDBase uint32 `json:"id_base"`
	}
	if json.Unmarshal(sb, &st) != nil {
		return true
	}
	return st.IDBase == base
}

// unclaimIDs releases this Root's claim of the range from base for ws.
func (r *Runtime) unclaimIDs(base uint32, ws string) {
	unlock, err := r.lockClaims()
	if err != nil {
		r.log.Warn("release an ID range claim", "err", err)
		return
	}
	defer unlock()
	p := r.claimPath(base)
	b, err := os.ReadFile(p)
	if err != nil {
		return
	}
	var c idClaim
	if json.Unmarshal(b, &c) == nil && c.Root == r.root && c.WorkspaceID == ws {
		_ = os.Remove(p)
	}
}

// reclaimRecorded claims, on the host, the ranges of this Root's
// recorded executions (New, after a reboot emptied /run or an upgrade).
// A range another node holds meanwhile is reported: the execution that
// recorded it cannot be running any more after a reboot.
func (r *Runtime) reclaimRecorded() {
	unlock, err := r.lockClaims()
	if err != nil {
		r.log.Warn("claim recorded ID ranges", "err", err)
		return
	}
	defer unlock()
	for base, ws := range r.idUsed {
		var c idClaim
		if b, err := os.ReadFile(r.claimPath(base)); err == nil && json.Unmarshal(b, &c) == nil && c.Root == r.root && c.WorkspaceID == ws {
			continue
		}
		if ok, err := r.claimIDs(base, ws); err != nil || !ok {
			r.log.Warn("a recorded execution's ID range is claimed by another node", "workspace_id", ws, "id_base", base, "err", err)
		}
	}
}
