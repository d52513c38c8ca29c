package api_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// streamGuest's every process writes streamBytes of output in 128 KiB
// chunks and exits.
type streamGuest struct {
	guestv1connect.UnimplementedProcessServiceHandler
}

const streamBytes = 256 << 20

func (streamGuest) Start(_ context.Context, req *connect.Request[guestv1.StartRequest]) (*connect.Response[guestv1.StartResponse], error) {
	return connect.NewResponse(&guestv1.StartResponse{ProcessId: "p", Pid: 7}), nil
}

func (streamGuest) Events(_ context.Context, _ *connect.Request[guestv1.EventsRequest], out *connect.ServerStream[guestv1.EventsResponse]) error {
	chunk := make([]byte, 128<<10)
	for off := 0; off < streamBytes; off += len(chunk) {
		if err := out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Output{Output: &guestv1.Output{
			Stream: guestv1.Stream_STREAM_STDOUT, Offset: uint64(off), Data: chunk}}}); err != nil {
			return err
		}
	}
	return out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Exited{Exited: &guestv1.Exited{EndOffset: streamBytes}}})
}

// BenchmarkProcessEventsStream: a process's output through the public
// ProcessService over TLS, ctrl, the node's tunnel and proxy (the guest
// is an in-process double): ctrl's and the node's share of streaming.
func BenchmarkProcessEventsStream(b *testing.B) {
	t := b
	rt := agenttest.New()
	rt.Guest = streamGuest{}
	defer rt.Close()
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt, DataPlane: true})
	c := e.Clients(e.HTTP)
	ctx := context.Background()
	w, _ := createWS(t, c, "bench-create")
	ws := w.GetWorkspaceId()
	waitCommand(t, c, "bench-create")
	r, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq("bench-s", ws, 3600e9, scopeExec)))
	if err != nil {
		b.Fatal(err)
	}
	tok := r.Msg.GetSession().GetToken()
	p := ctrlv1connect.NewProcessServiceClient(e.Client(t, "", ""), e.URL)
	b.SetBytes(streamBytes)
	for b.Loop() {
		s, err := p.ProcessEvents(ctx, bearerReq(&ctrlv1.ProcessEventsRequest{WorkspaceId: ws, ProcessId: "p"}, tok))
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for s.Receive() {
			n += len(s.Msg().GetOutput().GetData())
		}
		if err := s.Err(); err != nil || n != streamBytes {
			b.Fatalf("%d bytes, %v", n, err)
		}
		s.Close()
	}
}
