//go:build !linux

// Command workspacebench measures Kibotos workspaces as real sandboxes; it
// runs on Linux only (see bench/README.md).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "workspacebench: Linux only (workspaces are namespaces, cgroups and loop devices)")
	os.Exit(1)
}
