package reconciler

import (
	"fmt"
	"testing"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/workspace"
)

// BenchmarkHelloReports is what a node's Hello costs ctrl per execution it
// carries, on SQLite: 100 AVAILABLE Workspaces reported RUNNING again, as
// after a restart of ctrl, where every node sends its full state at once
// (bench/hollow: 1,000 nodes and 100,000 Workspaces).
func BenchmarkHelloReports(b *testing.B) {
	r, st, _ := newTest(b, Config{})
	nc := connectNode(b, r, hello("n1", 65536, 32000, "pool-a", workspace.DefaultTemplate))
	const n = 100
	reps := make([]*nodev1.ExecutionReport, n)
	for i := range reps {
		id := fmt.Sprintf("ws-%03d", i)
		seed(b, st, t0, row{id: id, node: "n1", power: running, generation: 1, observed: 1, exec: 1, state: wsAvail})
		reps[i] = &nodev1.ExecutionReport{WorkspaceId: id, Generation: 1, State: nodev1.ExecState_EXEC_STATE_RUNNING,
			HoldsExecution: true, LayerExists: true}
	}
	for b.Loop() {
		if err := r.helloReports(b.Context(), nc, reps); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/execution")
}
