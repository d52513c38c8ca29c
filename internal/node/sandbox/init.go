package sandbox

import "github.com/kibotos/kibotos/internal/node/sandbox/initshim"

// initArg0 is argv[0] of the init shim (see package initshim).
const initArg0 = initshim.Arg0

// initConfig is what the runtime tells the init shim.
type initConfig = initshim.Config

// MaybeRunInit runs the sandbox init shim and never returns when this
// process is one (argv[0] is the shim's marker); otherwise it returns false
// at once. Every binary that embeds the runtime and may be
// Config.InitBinary (kibotos-node, kibotos-ctrl --dev, the tests' TestMain)
// must call it first thing in main. kibotos-guest, the default init binary,
// calls initshim.MaybeRun itself.
//
// The shim starts as PID 1 of a new user namespace (its ID maps written
// by the node) and new mount, PID, UTS, IPC and network namespaces that it
// owns (clone flags set by the node), in the execution's cgroup (born
// there, or placed there by the node before it sends the configuration),
// and waits for its configuration. It then enters a new cgroup namespace,
// moves the overlay root the node made into place, mounts /proc and /sys
// (masked and read-only paths), a minimal /dev (the host's devices bound), /tmp and /run, sets the hostname,
// brings up lo, pivots into the new root, installs the system call
// filter, sets no_new_privs, drops capabilities and execs kibotos-guest
// from the runtime's memfd, which stays PID 1 with descriptors 0 to 2 and
// the channel's only (see package initshim).
func MaybeRunInit() bool { return initshim.MaybeRun() }
