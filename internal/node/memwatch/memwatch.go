// Package memwatch measures the memory a node's workspaces use and judges
// it against the node's host memory budget: the MemoryCondition each
// heartbeat carries to ctrl, whose host-memory policy stops workspaces
// when the node says CRITICAL (docs/host-memory.md).
//
// What it reads, every Sample:
//
//   - the workspaces' parent cgroup (the sandbox runtime's
//     <cgroup parent>/<root tag>, named in the state directory's
//     runtime.json, see Locate): its usage less its inactive file cache,
//     which the kernel reclaims first (cgroup v1 memory.usage_in_bytes
//     less total_inactive_file of memory.stat; v2 memory.current less
//     inactive_file);
//   - each running workspace's cgroup below it, measured the same way,
//     largest first, at most MaxWorkspaces;
//   - PSI: the "some avg10" of the parent's memory.pressure on cgroup v2,
//     of the whole host (/proc/pressure/memory) on v1, where the kernel
//     has PSI.
//
// Level turns the measurement into a level with the thresholds below. The
// files are the kernel's (no workspace writes them), still every read is
// bounded and a malformed line is skipped.
package memwatch

import (
	"cmp"
	"log/slog"
	"math/bits"
	"slices"
	"sync"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// The thresholds of Level, against the host memory budget.
const (
	// ModeratePercent of the budget used is MODERATE: ctrl stops nothing
	// yet.
	ModeratePercent = 90
	// CriticalPercent of the budget used is CRITICAL: ctrl stops
	// workspaces on the node.
	CriticalPercent = 95
	// PSIModerate is the PSI some avg10 (hundredths of a percent: 10 %)
	// from which the node is MODERATE whatever its use.
	PSIModerate = 1000
	// PSICritical (20 %) makes a node that is past ModeratePercent
	// CRITICAL before CriticalPercent. PSI alone never makes a node
	// CRITICAL: on cgroup v1 it is the whole host's, which processes
	// other than workspaces may press.
	PSICritical = 2000
)

// MaxWorkspaces bounds the workspaces a condition lists (the largest).
const MaxWorkspaces = 256

// mib is a MiB in bytes.
const mib = 1 << 20

// Level judges a measurement: usedBytes of the workspaces' memory against
// budgetBytes, with psi the PSI some avg10 in hundredths of a percent (0
// when unknown). A zero budget is not measured (UNSPECIFIED).
func Level(usedBytes, budgetBytes uint64, psi uint32) nodev1.MemoryPressureLevel {
	if budgetBytes == 0 {
		return nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_UNSPECIFIED
	}
	past := func(percent uint64) bool {
		// usedBytes·100 ≥ budgetBytes·percent, in 128 bits.
		uh, ul := bits.Mul64(usedBytes, 100)
		bh, bl := bits.Mul64(budgetBytes, percent)
		return uh > bh || (uh == bh && ul >= bl)
	}
	switch {
	case past(CriticalPercent), past(ModeratePercent) && psi >= PSICritical:
		return nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_CRITICAL
	case past(ModeratePercent), psi >= PSIModerate:
		return nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_MODERATE
	}
	return nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_NONE
}

// Config configures a Watcher.
type Config struct {
	// Cgroup is the workspaces' parent cgroup (Locate).
	Cgroup Cgroup
	// BudgetMiB is the host memory budget: what the workspaces together
	// may really use (limit_mib).
	BudgetMiB uint64
	// Workspaces lists the workspaces running now; each one's cgroup is
	// Cgroup.Dir/<workspace ID>.
	Workspaces func() []string
	// Log receives read failures (once per distinct failure); nil
	// discards them.
	Log *slog.Logger
}

// Watcher samples a node's memory condition.
type Watcher struct {
	cfg Config

	mu      sync.Mutex
	lastErr string
}

// New returns a Watcher.
func New(cfg Config) *Watcher {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{cfg: cfg}
}

// Sample measures the condition now. A parent cgroup that does not exist
// (no workspace runs: the runtime removes it) uses nothing. A failure to
// read it is logged and the condition is nil (not measured).
func (w *Watcher) Sample() *nodev1.MemoryCondition {
	c, err := w.sample()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if msg := err.Error(); msg != w.lastErr {
			w.lastErr = msg
			w.cfg.Log.Warn("measure the workspaces' memory", "error", msg)
		}
		return nil
	}
	w.lastErr = ""
	return c
}

func (w *Watcher) sample() (*nodev1.MemoryCondition, error) {
	cg := w.cfg.Cgroup
	used, err := cg.used(cg.Dir)
	if err != nil {
		return nil, err
	}
	var list []*nodev1.WorkspaceMemory
	var sum uint64
	if w.cfg.Workspaces != nil {
		for _, id := range w.cfg.Workspaces() {
			if !safeName(id) {
				continue
			}
			u, err := cg.used(cg.Dir + "/" + id)
			if err != nil || u == 0 {
				continue // gone since it was listed, or nothing to say
			}
			sum += u
			list = append(list, &nodev1.WorkspaceMemory{WorkspaceId: id, UsedMib: u / mib})
		}
	}
	// Without a hierarchical parent (cgroup v1 with use_hierarchy 0, which
	// kernels since 5.16 no longer allow), the children count.
	used = max(used, sum)
	slices.SortFunc(list, func(a, b *nodev1.WorkspaceMemory) int {
		if c := cmp.Compare(b.GetUsedMib(), a.GetUsedMib()); c != 0 {
			return c
		}
		return cmp.Compare(a.GetWorkspaceId(), b.GetWorkspaceId())
	})
	if len(list) > MaxWorkspaces {
		list = list[:MaxWorkspaces]
	}
	psi := cg.psi()
	return &nodev1.MemoryCondition{
		Level:   Level(used, w.cfg.BudgetMiB*mib, psi),
		UsedMib: used / mib, LimitMib: w.cfg.BudgetMiB, PsiSomeAvg10: psi, Workspaces: list,
	}, nil
}

// safeName reports whether a workspace ID may name a directory below the
// parent: one path element, not "." or "..".
func safeName(id string) bool {
	if id == "" || id == "." || id == ".." || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] == '/' || id[i] == 0 {
			return false
		}
	}
	return true
}
