package kibotos_test

import (
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// TestWorkspacesAgainstServer runs the workspace layer against a real ctrl
// with a node (the runtime double), over every protocol.
func TestWorkspacesAgainstServer(t *testing.T) {
	e := ctrltest.New(t, ctrltest.Options{Runtime: agenttest.New()})
	if err := waitForCapability(e, capability.WorkspaceCreate); err != nil {
		t.Fatal(err)
	}
	for name, opts := range ctrltest.Protocols {
		t.Run(name, func(t *testing.T) {
			c, err := kibotos.NewClient(e.URL,
				kibotos.WithTLSFiles(e.PKI.CA, e.PKI.Operator, e.PKI.OperatorKey),
				kibotos.WithConnectOptions(opts...))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := t.Context()
			labels := map[string]string{"protocol": strings.ReplaceAll(name, "+", "-")}

			p, err := c.Workspaces().PrepareCreate(kibotos.WorkspaceSpec{MemoryMiB: 256, CPUMillis: 500, WritableLayerMiB: 64, Labels: labels})
			if err != nil {
				t.Fatal(err)
			}
			ws, err := p.Do(ctx)
			if err != nil {
				t.Fatalf("Do = %v", err)
			}
			if ws.CommandID() != p.CommandID() || ws.Command().GetCommandId() != p.CommandID() {
				t.Errorf("handle command %s / %v, want %s", ws.CommandID(), ws.Command(), p.CommandID())
			}
			if err := ws.Wait(ctx); err != nil {
				t.Fatalf("Wait = %v", err)
			}
			last := ws.Last()
			if last.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || last.GetWritableLayer().GetCapacityBytes() != 64<<20 {
				t.Fatalf("after Wait: %v", last)
			}

			// A stale revision is refused, settled; the SDK returns it.
			rev := last.GetExpiration().GetRevision()
			err = ws.Stop(ctx, kibotos.ExpectExpirationRevision(rev+1))
			var we *kibotos.WriteError
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !errors.As(err, &we) ||
				kibotos.Reason(err) != ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH || !kibotos.IsSettled(err) {
				t.Fatalf("Stop(stale revision) = %v, want a settled EXPIRATION_REVISION_MISMATCH", err)
			}
			if err := ws.Stop(ctx, kibotos.ExpectExpirationRevision(rev)); err != nil {
				t.Fatalf("Stop = %v", err)
			}
			if ws.Last().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
				t.Fatalf("after Stop: %v", ws.Last().GetState())
			}
			if err := ws.Start(ctx, kibotos.CurrentExpirationRevision()); err != nil {
				t.Fatalf("Start = %v", err)
			}
			if err := ws.Wait(ctx); err != nil || ws.Last().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
				t.Fatalf("Wait after Start = %v, state %v", err, ws.Last().GetState())
			}

			got, err := c.Workspaces().Get(ctx, ws.ID())
			if err != nil || got.Last().GetWorkspaceId() != ws.ID() {
				t.Fatalf("Get = %v, %v", got, err)
			}
			var listed []string
			for w, err := range c.Workspaces().List(ctx, &ctrlv1.ListWorkspacesRequest{LabelSelector: labels}) {
				if err != nil {
					t.Fatal(err)
				}
				listed = append(listed, w.ID())
			}
			if len(listed) != 1 || listed[0] != ws.ID() {
				t.Errorf("List = %v, want [%s]", listed, ws.ID())
			}

			if err := ws.Delete(ctx, kibotos.CurrentExpirationRevision(), kibotos.WithCommandID("delete-"+ws.ID())); err != nil {
				t.Fatalf("Delete = %v", err)
			}
			if ws.Last().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED || ws.CommandID() != "delete-"+ws.ID() {
				t.Errorf("after Delete: %v, command %s", ws.Last().GetState(), ws.CommandID())
			}
		})
	}
}
