// Command kibotos-guest is the guest agent: PID 1 inside every workspace.
// Build it static (CGO_ENABLED=0): the runtime mounts it into any template.
package main

import (
	"os"

	"github.com/kibotos/kibotos/internal/guest"
)

func main() {
	os.Exit(guest.Main(os.Args))
}
