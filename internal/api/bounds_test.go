package api_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/reconciler"
	"github.com/kibotos/kibotos/internal/store"
)

// guestBound is the documented bound of a guest condition's message.
const guestBound = 1024

// checkBounded reads a Workspace through the API and from the store, and
// checks that neither carries more of a guest's message than its bound.
func checkBounded(t *testing.T, e *ctrltest.Env, c ctrltest.Clients, id string) {
	t.Helper()
	res, err := c.Workspace.GetWorkspace(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		t.Fatal(err)
	}
	msg := res.Msg.GetWorkspace().GetGuestObservation().GetMessage()
	if len(msg) > guestBound || !strings.HasSuffix(msg, "…") {
		t.Errorf("guest_observation.message: %d bytes (%.20q…), want at most %d ending in \"…\"", len(msg), msg, guestBound)
	}
	if n := proto.Size(res.Msg); n > 8<<10 {
		t.Errorf("GetWorkspace answered %d bytes", n)
	}
	err = e.Store.View(t.Context(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(t.Context(), id)
		if err == nil && len(w.Doc) > 8<<10 {
			t.Errorf("the stored Workspace is %d bytes", len(w.Doc))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGuestMessageBounded: a guest that reports a condition with a 5 MiB
// message (the runtime hands it to the agent as is) leaves at most the
// bound in the store and in GetWorkspace, and so does a start failure whose
// error quotes the guest at length.
func TestGuestMessageBounded(t *testing.T) {
	e, c, rt := wsEnv(t, ctrltest.Options{})
	w, _ := createWS(t, c, "ws-talk")
	waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	rt.GuestSays(w.GetWorkspaceId(), ctrlv1.GuestCondition_GUEST_CONDITION_DISK_PRESSURE, strings.Repeat("guest says ", 5<<20/11))
	deadline := time.Now().Add(10 * time.Second)
	for getWS(t, c, w.GetWorkspaceId()).GetGuestObservation().GetCondition() != ctrlv1.GuestCondition_GUEST_CONDITION_DISK_PRESSURE {
		if time.Now().After(deadline) {
			t.Fatal("the guest's condition never arrived")
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkBounded(t, e, c, w.GetWorkspaceId())

	// The Workspace's ID is not known before creation: hold every start
	// until its error is set.
	rt.Gate = make(chan struct{})
	w2, cmd := createWS(t, c, "ws-fail-talk")
	rt.StartError[w2.GetWorkspaceId()] = errors.New("start: the guest said " + strings.Repeat("é", 3<<20))
	close(rt.Gate)
	if done := waitCommand(t, c, cmd.GetCommandId()); done.GetError() == nil {
		t.Fatalf("the start did not fail: %v", done)
	}
	got := getWS(t, c, w2.GetWorkspaceId())
	if m := got.GetFailure().GetMessage(); len(m) > 2048+64 || !strings.HasSuffix(m, "…") {
		t.Errorf("failure.message: %d bytes, want the node's part within 2048", len(m))
	}
	cmdRes, err := c.Workspace.GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: cmd.GetCommandId()}))
	if err != nil {
		t.Fatal(err)
	}
	if n := proto.Size(cmdRes.Msg); n > 8<<10 {
		t.Errorf("GetWorkspaceCommand answered %d bytes", n)
	}
}

// rawNode is a node speaking NodeService by hand, so that it can send what
// the agent never would.
type rawNode struct {
	stream *connect.BidiStreamForClient[nodev1.ConnectRequest, nodev1.ConnectResponse]
	cancel context.CancelFunc
}

// openRawNode connects node id with a certificate issued by hand, sends its
// Hello and reads the full desired state.
func openRawNode(t *testing.T, e *ctrltest.Env, id string) *rawNode {
	t.Helper()
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	if err := pki.IssueClient(e.PKI.CA, e.PKI.CAKey, id, pki.RoleNode, time.Hour, cert, key); err != nil {
		t.Fatal(err)
	}
	hc := e.Client(t, cert, key)
	hc.Timeout = 0
	ctx, cancel := context.WithCancel(t.Context())
	n := &rawNode{stream: nodev1connect.NewNodeServiceClient(hc, e.URL).Connect(ctx), cancel: cancel}
	t.Cleanup(func() { cancel(); _ = n.stream.CloseResponse() })
	err := n.stream.Send(&nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Hello{Hello: &nodev1.Hello{NodeId: id,
		Capacity:  &nodev1.Capacity{MemoryMib: 8192, CpuMillis: 4000, StorageBytes: 100 << 30, StoragePool: "default"},
		Templates: []*nodev1.TemplateInfo{{TemplateId: "default", Version: "test-1"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.stream.Receive(); err != nil {
		t.Fatalf("%s: first answer = %v", id, err)
	}
	return n
}

// TestCtrlBoundsReports: ctrl cuts what a node sends before it stores it,
// even when the node did not (a report with a 5 MiB guest message).
func TestCtrlBoundsReports(t *testing.T) {
	e := ctrltest.New(t, ctrltest.Options{})
	c := e.Clients(e.HTTP)
	n := openRawNode(t, e, "node-raw")
	w, _ := createWS(t, c, "ws-raw")
	var d *nodev1.DesiredWorkspace
	for d == nil {
		msg, err := n.stream.Receive()
		if err != nil {
			t.Fatal(err)
		}
		for _, dw := range msg.GetDesired().GetWorkspaces() {
			if dw.GetWorkspaceId() == w.GetWorkspaceId() {
				d = dw
			}
		}
	}
	err := n.stream.Send(&nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Report{Report: &nodev1.ExecutionReport{
		WorkspaceId: d.GetWorkspaceId(), Generation: d.GetGeneration(), State: nodev1.ExecState_EXEC_STATE_RUNNING,
		HoldsExecution: true, LayerExists: true, GuestCondition: int32(ctrlv1.GuestCondition_GUEST_CONDITION_MEMORY_PRESSURE),
		GuestMessage: strings.Repeat("m", 5<<20)}}})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	checkBounded(t, e, c, w.GetWorkspaceId())
}

// TestOversizedNodeMessage: a NodeService message beyond
// reconciler.MaxNodeMessageBytes ends that node's stream with
// resource_exhausted, before ctrl decodes or stores any of it; another
// node's stream and its Workspaces go on.
func TestOversizedNodeMessage(t *testing.T) {
	e, c, rt := wsEnv(t, ctrltest.Options{})
	w, _ := createWS(t, c, "ws-before")
	waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)

	n := openRawNode(t, e, "node-big")
	_ = n.stream.Send(&nodev1.ConnectRequest{Body: &nodev1.ConnectRequest_Report{Report: &nodev1.ExecutionReport{
		WorkspaceId: w.GetWorkspaceId(), Generation: 1, GuestMessage: strings.Repeat("b", reconciler.MaxNodeMessageBytes)}}})
	var err error
	for err == nil {
		_, err = n.stream.Receive()
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("the oversized message's stream ended with %v, want resource_exhausted", err)
	}

	if got := getWS(t, c, w.GetWorkspaceId()); got.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || got.GetGuestObservation().GetMessage() != "" {
		t.Errorf("the other node's Workspace after the refusal: %v, message %d bytes", got.GetState(), len(got.GetGuestObservation().GetMessage()))
	}
	w2, _ := createWS(t, c, "ws-after")
	waitState(t, c, w2.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if !rt.Running(w2.GetWorkspaceId()) {
		t.Error("the Workspace created afterwards does not run on the other node")
	}
}
