package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kibotos/kibotos/internal/node/staticbin"
)

// The checks a node runs at start-up, before it reports ready, so that what
// no start could fix is refused once with a clear message instead of failing
// every start. Start and New run the same checks.

// CheckGuestBinary reports whether path can be PID 1 of every execution: a
// regular, statically linked ELF executable (the runtime mounts it into
// template root filesystems that have no dynamic loader).
func CheckGuestBinary(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("sandbox: guest binary: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("sandbox: guest binary %s is not a regular file", path)
	}
	err = staticbin.Check(path)
	var de *staticbin.DynamicError
	if errors.As(err, &de) {
		return fmt.Errorf("sandbox: kibotos-guest at %s is dynamically linked (needs %s); build it with CGO_ENABLED=0, e.g. scripts/build.sh", path, de.Needs())
	}
	if err != nil {
		return fmt.Errorf("sandbox: guest binary: %w", err)
	}
	return nil
}

// CheckTemplateDir reports whether dir can be the lower layer of an
// execution's overlay root: an absolute path without ',', ':' or newlines
// (overlayfs mount options) naming a directory. Its errors are ErrInvalidSpec.
func CheckTemplateDir(dir string) error {
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, ",:\n") {
		return fmt.Errorf("%w: template dir %q must be absolute without ',' or ':'", ErrInvalidSpec, dir)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("%w: template dir %q is not a directory", ErrInvalidSpec, dir)
	}
	return nil
}

// CheckRoot reports whether root can be a Runtime's Root: absolute, and
// without ',', ':' or newlines, which would break the overlayfs options of
// every execution (the layers and templates under it inherit the path).
func CheckRoot(root string) error {
	if !filepath.IsAbs(root) {
		return fmt.Errorf("sandbox: state directory %q must be an absolute path", root)
	}
	if strings.ContainsAny(root, ",:\n") {
		return fmt.Errorf("sandbox: state directory %q must not contain ',' ':' or newlines (overlayfs options)", root)
	}
	return nil
}

// CheckTools reports whether the tools the runtime runs are installed.
func CheckTools() error {
	_, err := findTool("mkfs.ext4")
	return err
}

// Permanent reports whether a Start error is one that no retry of the same
// Spec can fix: a malformed spec (including an unusable template directory),
// an invalid capacity, or a guest that does not speak the node's protocol.
// Other failures (mounts, cgroups, a guest that did not answer in time) may
// pass.
func Permanent(err error) bool {
	return errors.Is(err, ErrInvalidSpec) || errors.Is(err, ErrCapacity) || errors.Is(err, ErrGuestProtocol)
}
