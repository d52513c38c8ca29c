// Command kibotos-guest is the guest agent: PID 1 inside every workspace.
// Build it static (CGO_ENABLED=0): the runtime mounts it into any template.
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
