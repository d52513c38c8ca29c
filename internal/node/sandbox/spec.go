package sandbox

import (
	"fmt"
	"os"
	"regexp"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// Spec is what one execution is started with.
type Spec struct {
	// WorkspaceID names the workspace ("ws-..."): [A-Za-z0-9][A-Za-z0-9._-],
	// at most 63 characters. One execution per workspace at a time.
	WorkspaceID string
	// Generation is the desired generation this execution was started
	// for; recorded and reported back in Status and Events.
	Generation uint64
	// TemplateDir is the read-only rootfs directory (the lower layer).
	TemplateDir string
	// CapacityBytes is the writable layer's size when it is created, a
	// whole number of MiB, at least limits.MinCapacityBytes. An existing layer
	// keeps its size (Resize grows it).
	CapacityBytes uint64
	// MemoryMiB is the memory limit.
	MemoryMiB uint32
	// CPUMillis: the quota is ceil(CPUMillis/1000) whole vCPUs.
	CPUMillis uint32
	// PidsMax limits the number of tasks; 0 selects Config.DefaultPidsMax.
	PidsMax int
	// Network is the network configuration from the start: mode
	// PUBLIC_INTERNET attaches a TAP before the guest starts (it needs
	// Config.Network); anything else, nil included, is lo only.
	Network *nodev1.NetworkConfig
	// Volume is the Volume the execution mounts (volume.go); nil: none.
	Volume *VolumeMount
	// Guest is the guest binary the execution boots as PID 1 (and as its
	// init shim when Config.InitBinary is the guest): a sealed in-memory
	// copy made by SealGuest, for example a Platform's; nil is the
	// runtime's own copy of Config.GuestBinary. The runtime does not
	// close it.
	Guest *os.File
}

var workspaceIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// checkWorkspaceID reports a malformed workspace id as ErrInvalidSpec.
func checkWorkspaceID(ws string) error {
	if !workspaceIDRe.MatchString(ws) {
		return fmt.Errorf("%w: workspace id %q", ErrInvalidSpec, ws)
	}
	return nil
}

// validate checks s before a start and fills in its defaults (PidsMax).
// Its errors are ErrInvalidSpec or ErrCapacity (Permanent).
func (r *Runtime) validate(s *Spec) error {
	if err := checkWorkspaceID(s.WorkspaceID); err != nil {
		return err
	}
	if err := CheckTemplateDir(s.TemplateDir); err != nil {
		return err
	}
	if err := checkCapacity(s.CapacityBytes); err != nil {
		return err
	}
	if s.MemoryMiB < 16 {
		return fmt.Errorf("%w: memory %d MiB is below 16 MiB", ErrInvalidSpec, s.MemoryMiB)
	}
	if s.CPUMillis == 0 {
		return fmt.Errorf("%w: cpu_millis must be greater than zero", ErrInvalidSpec)
	}
	if s.PidsMax < 0 {
		return fmt.Errorf("%w: pids max %d", ErrInvalidSpec, s.PidsMax)
	}
	if s.PidsMax == 0 {
		s.PidsMax = r.cfg.DefaultPidsMax
	}
	if err := checkVolumeMount(s.Volume); err != nil {
		return err
	}
	return r.checkNetwork(s.Network)
}
