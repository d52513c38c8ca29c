// Command kibotos-node is the Kibotos node agent. See docs/operations.md.
package main

import (
	"os"

	"github.com/kibotos/kibotos/internal/node/daemon"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

func main() {
	// The runtime re-executes this binary as the sandbox init shim.
	if sandbox.MaybeRunInit() {
		return
	}
	os.Exit(daemon.Main(os.Args[1:], os.Stderr))
}
