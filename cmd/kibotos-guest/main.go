// Command kibotos-guest is the guest agent: PID 1 inside every workspace.
// It must be static: the runtime mounts it into any template. CGO_ENABLED=0
// (scripts/build.sh) makes it so; with cgo, static_cgo.go links it -static.
//
// It is also the sandbox runtime's default init shim: started under the
// shim's argv[0] (package initshim) it sets up the execution's namespaces
// and root, then execs itself (the copy mounted inside) as the agent.
package main

import (
	"os"

	"github.com/kibotos/kibotos/internal/guest"
	"github.com/kibotos/kibotos/internal/node/sandbox/initshim"
)

func main() {
	if initshim.MaybeRun() {
		return
	}
	os.Exit(guest.Main(os.Args))
}
