package limits

import "testing"

func TestVCPUs(t *testing.T) {
	for in, want := range map[uint32]uint32{0: 0, 1: 1, 999: 1, 1000: 1, 1001: 2, 1500: 2, 2000: 2, 2001: 3, 1<<32 - 1: 4294968} {
		if got := VCPUs(in); got != want {
			t.Errorf("VCPUs(%d) = %d, want %d", in, got, want)
		}
	}
}

func TestCapacity(t *testing.T) {
	if MinCapacityBytes%MiB != 0 || DefaultCapacityBytes%MiB != 0 || DefaultCapacityBytes < MinCapacityBytes {
		t.Errorf("MinCapacityBytes %d, DefaultCapacityBytes %d: want whole MiB, default >= min", MinCapacityBytes, DefaultCapacityBytes)
	}
}
