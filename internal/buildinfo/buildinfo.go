// Package buildinfo reports the source revision a binary was built from.
package buildinfo

import "runtime/debug"

// revision may be set at link time:
// -ldflags "-X github.com/kibotos/kibotos/internal/buildinfo.revision=<sha>".
var revision string

// Revision returns the VCS revision of the build: the link-time value, else
// the one the Go toolchain stamped (with "-dirty" for modified trees), else
// "unknown".
func Revision() string {
	if revision != "" {
		return revision
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return Of(info)
}

// Of returns the VCS revision the Go toolchain stamped into the build
// described by info, with "-dirty" when the tree had uncommitted changes,
// or "unknown": for this binary (Revision) or another one
// (debug/buildinfo.ReadFile).
func Of(info *debug.BuildInfo) string {
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return "unknown"
	}
	return rev + dirty
}
