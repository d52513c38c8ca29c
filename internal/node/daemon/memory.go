package daemon

import (
	"fmt"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/node/memwatch"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

// MaxOvercommitRatio bounds --memory-overcommit-ratio: placement may admit
// at most four times the host memory budget. The node only reports its
// ratio (Capacity.memory_overcommit_ratio); ctrl applies it, unless the
// node's overcommit set through the Operator API overrides it.
const MaxOvercommitRatio = 4.0

// CheckOvercommitRatio validates a memory overcommit ratio: 1 to
// MaxOvercommitRatio, or 0 (not given).
func CheckOvercommitRatio(r float64) error {
	if r == 0 || (r >= 1 && r <= MaxOvercommitRatio) {
		return nil
	}
	return fmt.Errorf("--memory-overcommit-ratio must be from 1 to %g, not %g", MaxOvercommitRatio, r)
}

// memoryWatch makes the sampler of the heartbeats' memory condition: the
// workspaces' parent cgroup of rt, whose state directory is cfg.StateDir,
// against the host memory budget (cfg.MemoryBudgetMiB, else offeredMiB,
// the memory offered before overcommit). It fails when the runtime's
// cgroup cannot be found.
func memoryWatch(cfg Config, rt *sandbox.Runtime, offeredMiB uint64) (func() *nodev1.MemoryCondition, uint64, error) {
	cg, err := memwatch.Locate(cfg.StateDir)
	if err != nil {
		return nil, 0, err
	}
	budget := cfg.MemoryBudgetMiB
	if budget == 0 {
		budget = offeredMiB
	}
	w := memwatch.New(memwatch.Config{Cgroup: cg, BudgetMiB: budget, Log: cfg.Log, Workspaces: func() []string {
		var ids []string
		for _, st := range rt.Executions() {
			if st.Running {
				ids = append(ids, st.WorkspaceID)
			}
		}
		return ids
	}})
	return w.Sample, budget, nil
}
