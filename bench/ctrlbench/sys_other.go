//go:build !linux

package main

import "time"

// fsType names the file system of path when it matters to the benchmark.
func fsType(string) string { return "unknown" }

type cpuSample struct {
	ok                                        bool
	client, server, machineBusy, machineTotal time.Duration
	serverMissing                             bool
}

func sampleCPU(int) cpuSample { return cpuSample{} }
