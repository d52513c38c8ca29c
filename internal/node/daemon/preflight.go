package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/node/template"
)

// Preflight checks, before anything starts, that this machine can run
// workspaces with cfg, and returns cfg with every path made absolute: the
// state directory (usable in overlayfs options), the static guest binary,
// a static busybox for the default template, mkfs.ext4, /dev/net/tun (the
// workspaces' TAP devices), and root. Each error
// says what to do. Run calls it; kibotos-ctrl --dev calls it before serving
// so that a machine that cannot run workspaces is refused at start-up.
func Preflight(cfg Config) (Config, error) {
	if cfg.StateDir == "" {
		return cfg, errors.New("no state directory configured")
	}
	if cfg.GuestBinary == "" {
		return cfg, errors.New("no guest binary (kibotos-guest) configured")
	}
	if err := AbsPaths(&cfg.StateDir, &cfg.GuestBinary, &cfg.Busybox); err != nil {
		return cfg, err
	}
	if err := sandbox.CheckRoot(cfg.StateDir); err != nil {
		return cfg, err
	}
	if err := sandbox.CheckGuestBinary(cfg.GuestBinary); err != nil {
		return cfg, err
	}
	if _, err := template.FindBusybox(cfg.Busybox); err != nil {
		return cfg, err
	}
	if err := sandbox.CheckTools(); err != nil {
		return cfg, err
	}
	if err := checkTUN(); err != nil {
		return cfg, err
	}
	if os.Geteuid() != 0 {
		return cfg, errors.New("the sandbox runtime needs root (namespaces, cgroups, loop devices)")
	}
	return cfg, nil
}

// AbsPaths makes each non-empty path absolute (filepath.Abs), so that a
// path given relative to the working directory at start-up keeps meaning the
// same file wherever it is used later (overlayfs options, for one, need
// absolute paths).
func AbsPaths(paths ...*string) error {
	for _, p := range paths {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("%s: %w", *p, err)
		}
		*p = abs
	}
	return nil
}
