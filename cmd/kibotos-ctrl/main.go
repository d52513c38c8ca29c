// Command kibotos-ctrl is the Kibotos control plane. See docs/operations.md.
package main

import (
	"os"

	"github.com/kibotos/kibotos/internal/ctrl"
)

func main() { os.Exit(ctrl.Main(os.Args[1:], os.Stdout, os.Stderr)) }
