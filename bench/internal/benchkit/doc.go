// Package benchkit holds what the benchmark harnesses under bench/ share:
// a kibotos-ctrl --dev subprocess and its client, readings of the host
// (CPU time, load, file system type) and small helpers for reports.
package benchkit
