// Command kibotos-ctrl is the Kibotos control plane. See docs/operations.md.
package main

import (
	"os"

	"github.com/kibotos/kibotos/internal/ctrl"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

func main() {
	// The embedded node re-executes this binary as the sandbox init shim.
	if sandbox.MaybeRunInit() {
		return
	}
	os.Exit(ctrl.Main(os.Args[1:], os.Stdout, os.Stderr))
}
