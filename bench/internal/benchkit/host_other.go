//go:build !linux

package benchkit

import "time"

// FSType names the file system of path when it matters to a benchmark.
func FSType(string) string { return "unknown" }

// SampleCPU reads nothing off Linux.
func SampleCPU(int) CPUSample { return CPUSample{At: time.Now()} }
