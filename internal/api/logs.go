package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/dataplane"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// MaxLogChunk bounds the data of one ReadWorkspaceLogResponse (what the
// node sends is cut to it).
const MaxLogChunk = 64 << 10

// WorkspaceLogs serves the public data plane's WorkspaceLogService: the
// log its node keeps of a Workspace's guest and PID 1, read by the node
// itself (Node; ctrl routes it over the node's data tunnel), not by the
// guest. A call is admitted as the ProcessService's are, with the EXEC
// scope (a process started with it can read what the guest prints
// anyway), in any state but DELETED: a stopped Workspace's last log is
// served while its node keeps it. A follower is closed with the refusal
// when its token is revoked or expires.
type WorkspaceLogs struct {
	Verifier *dataplane.Verifier
	Store    store.Store
	// Node returns a client of the WorkspaceLogService of node for
	// workspaceID.
	Node func(node, workspaceID string) nodev1connect.WorkspaceLogServiceClient
}

var _ ctrlv1connect.WorkspaceLogServiceHandler = (*WorkspaceLogs)(nil)

// ReadWorkspaceLog streams the log until its end (or, following, until the
// client goes or the token is refused).
func (h *WorkspaceLogs) ReadWorkspaceLog(ctx context.Context, req *connect.Request[ctrlv1.ReadWorkspaceLogRequest], out *connect.ServerStream[ctrlv1.ReadWorkspaceLogResponse]) error {
	m := req.Msg
	ws := m.GetWorkspaceId()
	// Subscribed before admit verifies the token: a change after that
	// verification is seen by watch.
	changed, release := h.Verifier.Watch(ws)
	g := gate{Verifier: h.Verifier, Store: h.Store}
	w, tok, err := g.admit(ctx, req.Header(), ws, dataplane.ScopeExec)
	if err != nil {
		release()
		return err
	}
	if w.node == "" {
		release()
		return &fault.Error{Kind: fault.KindNotFound, Reason: fault.ReasonNotFound,
			Message: "the workspace has no log: it has not run yet"}
	}
	if err := w.routable(); err != nil {
		release()
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go g.watch(ctx, cancel, tok, ws, dataplane.ScopeExec, changed, release)
	in, err := h.Node(w.node, ws).ReadLog(ctx, connect.NewRequest(&nodev1.ReadLogRequest{
		TailBytes: m.GetTailBytes(), Follow: m.GetFollow(), FromEnd: m.GetFromEnd()}))
	if err != nil {
		return streamEndOf("log", ctx, err)
	}
	defer in.Close()
	for in.Receive() {
		d := in.Msg().GetData()
		if len(d) == 0 {
			// A follower's stream opens with an empty chunk.
			if err := out.Send(&ctrlv1.ReadWorkspaceLogResponse{}); err != nil {
				return streamEndOf("log", ctx, err)
			}
		}
		for len(d) > 0 {
			n := min(len(d), MaxLogChunk)
			if err := out.Send(&ctrlv1.ReadWorkspaceLogResponse{Data: d[:n]}); err != nil {
				return streamEndOf("log", ctx, err)
			}
			d = d[n:]
		}
	}
	return streamEndOf("log", ctx, in.Err())
}
