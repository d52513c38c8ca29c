package api

import (
	"context"
	"errors"
	"io"
	"net/http"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/dataplane"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// MaxPortChunk bounds the data of one ForwardPortRequest and of one
// ForwardPortResponse (what the guest sends is cut to it).
const MaxPortChunk = 64 << 10

// PortForwards serves the public data plane's PortForwardService: a TCP
// connection to a port of the Workspace's loopback, carried over one
// bidirectional stream to the Workspace's guest (Guest; ctrl routes it over
// the node's data tunnel). A call is admitted exactly as the
// ProcessService's are, with the EXEC scope: a process started with that
// scope can connect to any port of the Workspace's loopback, so a forward
// gives nothing that exec does not. Like ProcessEvents, an open forward is
// closed with the refusal when its token is revoked or expires.
type PortForwards struct {
	Verifier *dataplane.Verifier
	Store    store.Store
	// Guest returns a client of the PortService of workspaceID's guest on
	// node.
	Guest func(node, workspaceID string) guestv1connect.PortServiceClient
}

var _ ctrlv1connect.PortForwardServiceHandler = (*PortForwards)(nil)

// admit admits a call to workspaceID as the ProcessService's are (scope
// exec, then AVAILABLE on a node) and returns the Workspace's node and the
// token.
func (h *PortForwards) admit(ctx context.Context, hdr http.Header, workspaceID string) (node, tok string, err error) {
	w, tok, err := gate{Verifier: h.Verifier, Store: h.Store}.admit(ctx, hdr, workspaceID, dataplane.ScopeExec)
	if err != nil {
		return "", "", err
	}
	if err := w.available("ports"); err != nil {
		return "", "", err
	}
	return w.node, tok, nil
}

// ForwardPort forwards one connection until both halves are closed, the
// connection fails, the client goes, or the token is refused.
func (h *PortForwards) ForwardPort(ctx context.Context, stream *connect.BidiStream[ctrlv1.ForwardPortRequest, ctrlv1.ForwardPortResponse]) error {
	first, err := stream.Receive()
	if errors.Is(err, io.EOF) {
		return fault.Invalid("workspace_id", "the first message names the workspace_id and the port")
	}
	if err != nil {
		return err
	}
	ws := first.GetWorkspaceId()
	// Subscribed before admit verifies the token: a change after that
	// verification is seen by watch.
	changed, release := h.Verifier.Watch(ws)
	node, tok, err := h.admit(ctx, stream.RequestHeader(), ws)
	if err != nil {
		release()
		return err
	}
	if p := first.GetPort(); p < 1 || p > 65535 {
		release()
		return fault.Invalid("port", "port %d is not in 1–65535", p)
	}
	if err := checkPortChunk(first); err != nil {
		release()
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	go gate{Verifier: h.Verifier}.watch(ctx, cancel, tok, ws, dataplane.ScopeExec, changed, release)

	g := h.Guest(node, ws).Forward(ctx)
	defer func() {
		// Canceled first: the guest's stream is then done even while the
		// client's requests are still open.
		cancel(nil)
		_ = g.CloseResponse()
	}()
	// The transport to the guest does not see the context's end while it
	// waits for the next request to send: closing the requests makes it.
	stop := context.AfterFunc(ctx, func() { _ = g.CloseRequest() })
	defer stop()
	in := &guestv1.ForwardRequest{Port: first.GetPort(), Data: first.GetData(), CloseWrite: first.GetCloseWrite()}
	if err := g.Send(in); err != nil && !errors.Is(err, io.EOF) {
		return streamEndOf("ports", ctx, err)
	}
	go forwardPortUp(stream, g, first.GetCloseWrite(), cancel)
	for {
		m, err := g.Receive()
		if errors.Is(err, io.EOF) {
			return streamEndOf("ports", ctx, nil)
		}
		if err != nil {
			return streamEndOf("ports", ctx, err)
		}
		out, err := transcode(m, &ctrlv1.ForwardPortResponse{})
		if err != nil {
			return err
		}
		if d := out.GetData(); len(d) > MaxPortChunk {
			// A guest's chunk is cut to the public bound.
			for len(d) > 0 {
				n := min(len(d), MaxPortChunk)
				if err := stream.Send(&ctrlv1.ForwardPortResponse{Event: &ctrlv1.ForwardPortResponse_Data{Data: d[:n]}}); err != nil {
					return streamEndOf("ports", ctx, err)
				}
				d = d[n:]
			}
			continue
		}
		if err := stream.Send(out); err != nil {
			return streamEndOf("ports", ctx, err)
		}
	}
}

// checkPortChunk refuses a request whose data exceeds MaxPortChunk.
func checkPortChunk(m *ctrlv1.ForwardPortRequest) error {
	if n := len(m.GetData()); n > MaxPortChunk {
		return fault.Invalid("data", "a chunk of %d bytes exceeds %d", n, MaxPortChunk)
	}
	return nil
}

// forwardPortUp sends the client's requests after the first to the guest
// and closes the guest's requests at the client's end. A request refused
// (too large, data after close_write) ends the call with the refusal
// (cancel); a failure of either stream ends it with the call.
func forwardPortUp(stream *connect.BidiStream[ctrlv1.ForwardPortRequest, ctrlv1.ForwardPortResponse], g *connect.BidiStreamForClient[guestv1.ForwardRequest, guestv1.ForwardResponse], closed bool, cancel context.CancelCauseFunc) {
	for {
		m, err := stream.Receive()
		if err != nil {
			// The client's end (io.EOF), or the call's.
			_ = g.CloseRequest()
			return
		}
		if err := checkPortChunk(m); err != nil {
			cancel(err)
			return
		}
		if closed && len(m.GetData()) > 0 {
			cancel(fault.Invalid("data", "data after close_write"))
			return
		}
		closed = closed || m.GetCloseWrite()
		if err := g.Send(&guestv1.ForwardRequest{Data: m.GetData(), CloseWrite: m.GetCloseWrite()}); err != nil {
			return
		}
	}
}
