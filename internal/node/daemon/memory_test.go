package daemon

import (
	"math"
	"testing"
)

func TestCheckOvercommitRatio(t *testing.T) {
	for _, r := range []float64{0, 1, 1.25, MaxOvercommitRatio} {
		if err := CheckOvercommitRatio(r); err != nil {
			t.Errorf("CheckOvercommitRatio(%g) = %v, want nil", r, err)
		}
	}
	for _, r := range []float64{-1, 0.5, 0.999, MaxOvercommitRatio + 0.01, math.Inf(1), math.NaN()} {
		if err := CheckOvercommitRatio(r); err == nil {
			t.Errorf("CheckOvercommitRatio(%g) = nil, want an error", r)
		}
	}
}

// Capacity.memory_mib is the memory offered, whatever the ratio; the ratio
// travels on its own (0 when --memory-overcommit-ratio was not given).
func TestCapacityReportsTheRatioApart(t *testing.T) {
	for _, ratio := range []float64{0, 1, 2.5} {
		c, err := measure(Config{MemoryMiB: 4096, CPUMillis: 2000, StorageBytes: 1 << 30, MemoryOvercommitRatio: ratio})
		if err != nil {
			t.Fatal(err)
		}
		if c.GetMemoryMib() != 4096 || c.GetMemoryOvercommitRatio() != ratio {
			t.Errorf("ratio %g: memory_mib %d, memory_overcommit_ratio %g", ratio, c.GetMemoryMib(), c.GetMemoryOvercommitRatio())
		}
	}
}
