package daemon

import (
	"math"
	"testing"
)

func TestOvercommit(t *testing.T) {
	for _, tc := range []struct {
		offered uint64
		ratio   float64
		want    uint64
	}{
		{1024, 0, 1024}, // unset is 1
		{1024, 1, 1024},
		{1024, 1.5, 1536},
		{1000, 1.33, 1330},
		{1001, 1.5, 1501}, // rounded down
		{512, 4, 2048},
		{512, 9, 2048}, // never past the maximum
	} {
		if got := overcommit(tc.offered, tc.ratio); got != tc.want {
			t.Errorf("overcommit(%d, %g) = %d, want %d", tc.offered, tc.ratio, got, tc.want)
		}
	}
}

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
