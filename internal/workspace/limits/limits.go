// Package limits holds the sizing rules of a Workspace that ctrl admits and
// a node enforces: the bounds of the writable layer and the rounding of
// millicores to whole vCPUs. It imports nothing, so that both sides (the
// admission in internal/workspace, the node's runtime) can share one
// definition.
package limits

// MiB is a mebibyte; a writable layer is a whole number of them.
const MiB = 1 << 20

// Writable layer sizes.
const (
	// DefaultCapacityBytes is the writable layer size when a create names
	// none.
	DefaultCapacityBytes = 1 << 30
	// MinCapacityBytes is the smallest writable layer (ext4 with a journal
	// needs room).
	MinCapacityBytes = 16 * MiB
)

// VCPUs is the number of whole vCPUs cpuMillis rounds up to: a Workspace's
// CPU quota.
func VCPUs(cpuMillis uint32) uint32 { return uint32((uint64(cpuMillis) + 999) / 1000) }
