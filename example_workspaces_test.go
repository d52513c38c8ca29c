package kibotos_test

// These examples run against the in-process server TestMain starts; the
// KIBO_* variables point at it, as scripts/dev.sh's export line does.

import (
	"context"
	"fmt"
	"log"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

func ExampleNewClientFromEnv() {
	// KIBO_ENDPOINT, KIBO_CA, KIBO_CERT and KIBO_KEY, or a kibo profile.
	c, err := kibotos.NewClientFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	info, err := c.ServerInfo(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("workspace.create:", kibotos.HasCapability(info, "workspace.create"))
	// Output:
	// workspace.create: true
}

func ExampleWorkspaces_Create() {
	c, err := kibotos.NewClientFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	ws, err := c.Workspaces().Create(ctx, kibotos.WorkspaceSpec{
		MemoryMiB: 256, CPUMillis: 500,
		Labels: map[string]string{"example": "create"},
	})
	if err != nil {
		log.Fatal(err) // a *kibotos.WriteError names the command ID once it was sent
	}
	fmt.Println("accepted:", ws.Last().GetState())
	// Create returns on acceptance; Wait waits for the command to complete.
	if err := ws.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("created:", ws.Last().GetState())
	// Output:
	// accepted: WORKSPACE_STATE_CREATING
	// created: WORKSPACE_STATE_AVAILABLE
}

func ExampleWorkspaces_PrepareCreate() {
	c, err := kibotos.NewClientFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	spec := kibotos.WorkspaceSpec{MemoryMiB: 256, CPUMillis: 500, Labels: map[string]string{"example": "prepare"}}

	p, err := c.Workspaces().PrepareCreate(spec)
	if err != nil {
		log.Fatal(err)
	}
	// Save the command ID before anything is sent: with it, a lost answer
	// is recovered and the Workspace is never created twice.
	log.Printf("creating a workspace with command ID %s", p.CommandID())

	ws, err := p.Do(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// Later, or in another process: the same spec with the saved ID
	// replays the acceptance instead of creating a second Workspace.
	again, err := c.Workspaces().Create(ctx, spec, kibotos.WithCommandID(p.CommandID()))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("same workspace:", again.ID() == ws.ID())
	// Output:
	// same workspace: true
}

func ExampleWorkspace_Stop() {
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

	// Stop, start and delete require the expected expiration revision,
	// even when no expiration is armed. Here: the revision last seen.
	rev := ws.Last().GetExpiration().GetRevision()
	err = ws.Stop(ctx, kibotos.ExpectExpirationRevision(rev))
	if kibotos.Reason(err) == ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH {
		// The expiration changed since we read it. The SDK does not read it
		// again: read the Workspace, look at its expiration, then decide.
		if err := ws.Refresh(ctx); err != nil {
			log.Fatal(err)
		}
		log.Fatalf("expiration is now %v; not stopping", ws.Last().GetExpiration())
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stopped:", ws.Last().GetState())

	// CurrentExpirationRevision reads the revision once, before sending,
	// and accepts whatever expiration is armed then.
	if err := ws.Start(ctx, kibotos.CurrentExpirationRevision()); err != nil {
		log.Fatal(err)
	}
	if err := ws.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("started:", ws.Last().GetState())

	if err := ws.Delete(ctx, kibotos.ExpectExpirationRevision(ws.Last().GetExpiration().GetRevision())); err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted:", ws.Last().GetState())
	// Output:
	// stopped: WORKSPACE_STATE_STOPPED
	// started: WORKSPACE_STATE_AVAILABLE
	// deleted: WORKSPACE_STATE_DELETED
}

func ExampleWorkspaces_List() {
	c, err := kibotos.NewClientFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for range 3 {
		if _, err := c.Workspaces().Create(ctx, kibotos.WorkspaceSpec{MemoryMiB: 128, CPUMillis: 100, Labels: map[string]string{"example": "list"}}); err != nil {
			log.Fatal(err)
		}
	}

	// List reads the pages as the loop asks for them.
	n := 0
	for ws, err := range c.Workspaces().List(ctx, &ctrlv1.ListWorkspacesRequest{
		LabelSelector: map[string]string{"example": "list"},
		PageSize:      2,
	}) {
		if err != nil {
			log.Fatal(err)
		}
		log.Println(ws.ID(), ws.Last().GetState())
		n++
	}
	fmt.Println(n, "workspaces")
	// Output:
	// 3 workspaces
}
