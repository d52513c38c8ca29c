// Command ctrlprof is kibotos-ctrl (the same ctrl.Main as cmd/kibotos-ctrl)
// with a CPU profile of its whole lifetime written to the file named by
// $CTRLBENCH_CPUPROFILE, when set. ctrlbench builds it instead of
// cmd/kibotos-ctrl when given -server-cpuprofile; the profile is complete
// once the server has stopped (ctrl.Main returns on SIGTERM).
package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/kibotos/kibotos/internal/ctrl"
)

func main() {
	path := os.Getenv("CTRLBENCH_CPUPROFILE")
	if path == "" {
		os.Exit(ctrl.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ctrlprof: %v\n", err)
		os.Exit(1)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "ctrlprof: %v\n", err)
		os.Exit(1)
	}
	code := ctrl.Main(os.Args[1:], os.Stdout, os.Stderr)
	pprof.StopCPUProfile()
	if err := f.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "ctrlprof: %v\n", err)
		code = 1
	}
	os.Exit(code)
}
