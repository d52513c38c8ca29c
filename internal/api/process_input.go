package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/internal/fault"
)

// WriteInput forwards a stream of input to the guest, message by message:
// the guest takes each only once the process's input buffer has, so HTTP/2
// flow control holds a fast client back through ctrl and the node. The
// stream ends with the refusal when the token is revoked or expires.
func (h *Processes) WriteInput(ctx context.Context, in *connect.ClientStream[ctrlv1.WriteInputRequest]) (*connect.Response[ctrlv1.WriteInputResponse], error) {
	if !in.Receive() {
		if err := in.Err(); err != nil {
			return nil, err
		}
		return nil, fault.Invalid("process_id", "a WriteInput stream starts with a message naming the workspace and the process")
	}
	first := in.Msg()
	wsID := first.GetWorkspaceId()
	changed, release := h.Verifier.Watch(wsID)
	g, tok, err := h.admit(ctx, in.RequestHeader(), wsID)
	if err != nil {
		release()
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go h.watch(ctx, cancel, tok, wsID, changed, release)
	out := g.WriteInput(ctx)
	m := first
	for {
		if id := m.GetWorkspaceId(); id != "" && id != wsID {
			_, _ = out.CloseAndReceive()
			return nil, fault.Invalid("workspace_id", "a WriteInput stream names one workspace")
		}
		if err := out.Send(&guestv1.WriteInputRequest{ProcessId: m.GetProcessId(), Offset: m.GetOffset(), Data: m.GetData(), CloseInput: m.GetCloseInput()}); err != nil {
			break // the guest's answer says why
		}
		if !in.Receive() {
			if err := in.Err(); err != nil {
				_, _ = out.CloseAndReceive()
				return nil, h.streamEnd(ctx, err)
			}
			break
		}
		m = in.Msg()
	}
	res, err := out.CloseAndReceive()
	if err != nil {
		return nil, h.streamEnd(ctx, err)
	}
	return respond(transcode(res.Msg, &ctrlv1.WriteInputResponse{}))
}
