package api_test

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/store"
)

// TestDataPlaneIsolatedNode: data-plane traffic to a Workspace whose node
// is ISOLATED is refused failed_precondition (STATE_CONFLICT, the message
// says the node is isolated, the Workspace observed) where ctrl routes it
// to the node — processes and logs alike —, a stream open when IsolateNode
// commits ends, and traffic flows again when the node is only draining.
// Both stores.
func TestDataPlaneIsolatedNode(t *testing.T) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			testDataPlaneIsolatedNode(t, pg)
		})
	}
}

func testDataPlaneIsolatedNode(t *testing.T, pg bool) {
	rt := agenttest.New()
	rt.Guest = fakeGuest{}
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Postgres: pg, Runtime: rt, DataPlane: true})
	c := e.Clients(e.HTTP)
	ctx := t.Context()
	w, _ := createWS(t, c, "iso-create")
	ws := w.GetWorkspaceId()
	waitCommand(t, c, "iso-create")
	got, err := c.Workspace.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: ws}))
	if err != nil {
		t.Fatal(err)
	}
	node := got.Msg.GetWorkspace().GetPlacement().GetNodeId()
	r, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("iso-s1", ws, time.Hour, scopeExec)))
	if err != nil {
		t.Fatal(err)
	}
	tok := r.Msg.GetSession().GetToken()
	p := ctrlv1connect.NewProcessServiceClient(e.Client(t, "", ""), e.URL)
	l := ctrlv1connect.NewWorkspaceLogServiceClient(e.Client(t, "", ""), e.URL)
	start := func() error {
		_, err := p.StartProcess(ctx, bearerReq(&ctrlv1.StartProcessRequest{WorkspaceId: ws, Argv: []string{"echo", "hi"}}, tok))
		return err
	}
	readLog := func() error {
		s, err := l.ReadWorkspaceLog(ctx, bearerReq(&ctrlv1.ReadWorkspaceLogRequest{WorkspaceId: ws}, tok))
		if err != nil {
			return err
		}
		defer s.Close()
		for s.Receive() {
		}
		return s.Err()
	}
	setState := func(st fleet.State) {
		t.Helper()
		if err := e.Store.InTx(ctx, func(tx store.Tx) error {
			r, rec, err := fleet.GetRecord(ctx, tx, node)
			if err != nil {
				return err
			}
			rec.State = st
			return fleet.PutRecord(ctx, tx, r, node, rec, r.UpdatedAt)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := start(); err != nil {
		t.Fatalf("StartProcess on an ACTIVE node = %v", err)
	}
	// A stream open when the node is isolated (IsolateNode) ends.
	sleep, err := p.ProcessEvents(ctx, bearerReq(&ctrlv1.ProcessEventsRequest{WorkspaceId: ws, ProcessId: "sleep"}, tok))
	if err != nil {
		t.Fatal(err)
	}
	defer sleep.Close()
	if !sleep.Receive() { // Started: the stream is up
		t.Fatalf("ProcessEvents(sleep) = %v", sleep.Err())
	}
	nodes := ctrlv1connect.NewNodeServiceClient(e.HTTP, e.URL)
	n, err := nodes.GetNode(ctx, connect.NewRequest(&ctrlv1.GetNodeRequest{NodeId: node}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.IsolateNode(ctx, connect.NewRequest(&ctrlv1.IsolateNodeRequest{CommandId: "iso-1", NodeId: node,
		ExpectedRegistrationVersion: n.Msg.GetNode().GetRegistrationVersion()})); err != nil {
		t.Fatalf("IsolateNode = %v", err)
	}
	ended := make(chan error, 1)
	go func() {
		for sleep.Receive() {
		}
		ended <- sleep.Err()
	}()
	select {
	case err := <-ended:
		if err == nil {
			t.Error("the open stream ended without an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream open to the isolated node did not end")
	}
	for what, call := range map[string]func() error{"StartProcess": start, "ReadWorkspaceLog": readLog} {
		d := wantErr(t, call(), connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, false)
		if !strings.Contains(d.GetMessage(), "isolated") || d.GetObservedWorkspace().GetWorkspaceId() != ws {
			t.Errorf("%s on an isolated node: %v; want the isolation said and the workspace observed", what, d)
		}
	}
	// A draining node still serves its Workspaces, once its agent has
	// dialled its data tunnels again.
	setState(fleet.StateDraining)
	deadline := time.Now().Add(15 * time.Second)
	for err := start(); err != nil; err = start() {
		if connect.CodeOf(err) != connect.CodeUnavailable || time.Now().After(deadline) {
			t.Fatalf("StartProcess on a DRAINING node = %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
