// Command kibotos-guest is the guest agent: PID 1 inside every workspace.
// It must be static: the runtime runs it in any template. CGO_ENABLED=0
// (scripts/build.sh) makes it so; with cgo, static_cgo.go links it -static.
//
// It is also the sandbox runtime's default init shim: started under the
// shim's argv[0] (package initshim) it sets up the execution's namespaces
// and root, then execs the node's copy of itself as the agent.
package main

import (
	"os"
	"runtime"

	"github.com/kibotos/kibotos/internal/guest"
	"github.com/kibotos/kibotos/internal/node/sandbox/initshim"
)

// The main goroutine stays on the main thread: the shim's namespace work
// is per thread, and the agent forks and reaps there, the thread that
// orphans are reparented to (see guest.Main).
func init() { runtime.LockOSThread() }

func main() {
	if initshim.MaybeRun() {
		return
	}
	os.Exit(guest.Main(os.Args))
}
