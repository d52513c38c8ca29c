package kibotos_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"

	"github.com/kibotos/kibotos"
)

// Run a command in a Workspace, like os/exec: the SDK checks that the
// server offers workspace.exec, creates the data-plane session (scope
// EXEC) and renews it while the process runs.
func ExampleWorkspace_ExecCommand() {
	c, err := kibotos.NewClientFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	ws, err := c.Workspaces().Create(ctx, kibotos.WorkspaceSpec{MemoryMiB: 256, CPUMillis: 500})
	if err != nil {
		log.Fatal(err)
	}
	if err := ws.Wait(ctx); err != nil {
		log.Fatal(err)
	}

	out, err := ws.ExecCommand(ctx, "sh", "-c", "echo hi").Output()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s", out)

	// Stdin is copied to the process, then its input is closed.
	cmd := ws.ExecCommand(ctx, "cat")
	cmd.Stdin = strings.NewReader("from stdin\n")
	out, err = cmd.Output()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s", out)

	// A non-zero exit is an *ExitError.
	err = ws.ExecCommand(ctx, "sh", "-c", "exit 3").Run()
	if ee, ok := errors.AsType[*kibotos.ExitError](err); ok {
		fmt.Println("exit code:", ee.ExitCode())
	}
	// Output:
	// hi
	// from stdin
	// exit code: 3
}
