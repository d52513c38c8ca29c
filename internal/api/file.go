package api

import (
	"context"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/dataplane"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// Files serves the public data plane's FileService: each call is admitted
// as Processes' are, with scope filesystem, then forwarded to the guest's
// FileService, which resolves the paths inside the Workspace. The
// requests are the guest's twins with workspace_id (field 1) cleared; the
// answers are copied back (transcode). Streams (ReadFile, WatchDirectory,
// WriteFile) end with the refusal when the token is revoked or expires.
type Files struct {
	Verifier *dataplane.Verifier
	Store    store.Store
	// Guest returns a client of the FileService of workspaceID's guest on
	// node.
	Guest func(node, workspaceID string) guestv1connect.FileServiceClient
}

var _ ctrlv1connect.FileServiceHandler = (*Files)(nil)

// what names the files in errors.
const filesWhat = "files"

// admit admits a call to workspaceID (gate.admit, scope filesystem; the
// Workspace AVAILABLE) and returns the guest's client and the token.
func (h *Files) admit(ctx context.Context, hdr http.Header, workspaceID string) (guestv1connect.FileServiceClient, string, error) {
	w, tok, err := gate{Verifier: h.Verifier, Store: h.Store}.admit(ctx, hdr, workspaceID, dataplane.ScopeFilesystem)
	if err != nil {
		return nil, "", err
	}
	if err := w.available(filesWhat); err != nil {
		return nil, "", err
	}
	return h.Guest(w.node, workspaceID), tok, nil
}

// toGuest copies public request m into its guest twin to, without its
// workspace_id (field 1, reserved in the guest's messages).
func toGuest[T proto.Message](m proto.Message, to T) (T, error) {
	c := proto.Clone(m)
	r := c.ProtoReflect()
	r.Clear(r.Descriptor().Fields().ByNumber(1))
	return transcode(c, to)
}

// prepare admits a unary call whose request is m and returns the guest's
// client and the guest's request.
func prepare[T proto.Message](ctx context.Context, h *Files, hdr http.Header, m interface {
	proto.Message
	GetWorkspaceId() string
}, to T) (guestv1connect.FileServiceClient, T, error) {
	g, _, err := h.admit(ctx, hdr, m.GetWorkspaceId())
	if err != nil {
		return nil, to, err
	}
	in, err := toGuest(m, to)
	return g, in, err
}

func fileGuestError(err error) error { return guestErrorOf(filesWhat, err) }

// StatFile describes a file.
func (h *Files) StatFile(ctx context.Context, req *connect.Request[ctrlv1.StatFileRequest]) (*connect.Response[ctrlv1.StatFileResponse], error) {
	g, in, err := prepare(ctx, h, req.Header(), req.Msg, &guestv1.StatFileRequest{})
	if err != nil {
		return nil, err
	}
	res, err := g.StatFile(ctx, connect.NewRequest(in))
	if err != nil {
		return nil, fileGuestError(err)
	}
	return respond(transcode(res.Msg, &ctrlv1.StatFileResponse{}))
}

// ListDirectory lists a directory.
func (h *Files) ListDirectory(ctx context.Context, req *connect.Request[ctrlv1.ListDirectoryRequest]) (*connect.Response[ctrlv1.ListDirectoryResponse], error) {
	g, in, err := prepare(ctx, h, req.Header(), req.Msg, &guestv1.ListDirectoryRequest{})
	if err != nil {
		return nil, err
	}
	res, err := g.ListDirectory(ctx, connect.NewRequest(in))
	if err != nil {
		return nil, fileGuestError(err)
	}
	return respond(transcode(res.Msg, &ctrlv1.ListDirectoryResponse{}))
}

// MakeDirectory makes a directory.
func (h *Files) MakeDirectory(ctx context.Context, req *connect.Request[ctrlv1.MakeDirectoryRequest]) (*connect.Response[ctrlv1.MakeDirectoryResponse], error) {
	g, in, err := prepare(ctx, h, req.Header(), req.Msg, &guestv1.MakeDirectoryRequest{})
	if err != nil {
		return nil, err
	}
	res, err := g.MakeDirectory(ctx, connect.NewRequest(in))
	if err != nil {
		return nil, fileGuestError(err)
	}
	return respond(transcode(res.Msg, &ctrlv1.MakeDirectoryResponse{}))
}

// MoveFile renames a file.
func (h *Files) MoveFile(ctx context.Context, req *connect.Request[ctrlv1.MoveFileRequest]) (*connect.Response[ctrlv1.MoveFileResponse], error) {
	g, in, err := prepare(ctx, h, req.Header(), req.Msg, &guestv1.MoveFileRequest{})
	if err != nil {
		return nil, err
	}
	res, err := g.MoveFile(ctx, connect.NewRequest(in))
	if err != nil {
		return nil, fileGuestError(err)
	}
	return respond(transcode(res.Msg, &ctrlv1.MoveFileResponse{}))
}

// RemoveFile removes a file.
func (h *Files) RemoveFile(ctx context.Context, req *connect.Request[ctrlv1.RemoveFileRequest]) (*connect.Response[ctrlv1.RemoveFileResponse], error) {
	g, in, err := prepare(ctx, h, req.Header(), req.Msg, &guestv1.RemoveFileRequest{})
	if err != nil {
		return nil, err
	}
	res, err := g.RemoveFile(ctx, connect.NewRequest(in))
	if err != nil {
		return nil, fileGuestError(err)
	}
	return respond(transcode(res.Msg, &ctrlv1.RemoveFileResponse{}))
}

// WriteFileChunk writes one chunk of an upload; every chunk's header names
// the Workspace.
func (h *Files) WriteFileChunk(ctx context.Context, req *connect.Request[ctrlv1.WriteFileChunkRequest]) (*connect.Response[ctrlv1.WriteFileChunkResponse], error) {
	m := req.Msg
	if m.GetHeader().GetWorkspaceId() == "" {
		// The token is checked first, as for any call without a Workspace.
		if _, _, err := h.admit(ctx, req.Header(), ""); err != nil {
			if fe, ok := fault.As(err); ok && fe.Kind == fault.KindUnauthenticated {
				return nil, err
			}
		}
		return nil, fault.Invalid("header.workspace_id", "every chunk carries the header, whose workspace_id names the Workspace")
	}
	g, hdr, err := prepare(ctx, h, req.Header(), m.GetHeader(), &guestv1.WriteFileHeader{})
	if err != nil {
		return nil, err
	}
	in, err := transcode(m, &guestv1.WriteFileChunkRequest{})
	if err != nil {
		return nil, err
	}
	in.Header = hdr
	res, err := g.WriteFileChunk(ctx, connect.NewRequest(in))
	if err != nil {
		return nil, fileGuestError(err)
	}
	return respond(transcode(res.Msg, &ctrlv1.WriteFileChunkResponse{}))
}

// openStream admits a stream to workspaceID and starts watching its token:
// the context returned is canceled with the refusal when the token is
// revoked or expires (streamEndOf returns it); stop ends the watch.
func (h *Files) openStream(ctx context.Context, hdr http.Header, workspaceID string) (guestv1connect.FileServiceClient, context.Context, context.CancelCauseFunc, error) {
	// Subscribed before admit verifies the token: a change after that
	// verification is seen by watch.
	changed, release := h.Verifier.Watch(workspaceID)
	g, tok, err := h.admit(ctx, hdr, workspaceID)
	if err != nil {
		release()
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	go gate{Verifier: h.Verifier}.watch(ctx, cancel, tok, workspaceID, dataplane.ScopeFilesystem, changed, release)
	return g, ctx, cancel, nil
}

// ReadFile streams a file's description, then its bytes.
func (h *Files) ReadFile(ctx context.Context, req *connect.Request[ctrlv1.ReadFileRequest], out *connect.ServerStream[ctrlv1.ReadFileResponse]) error {
	g, ctx, cancel, err := h.openStream(ctx, req.Header(), req.Msg.GetWorkspaceId())
	if err != nil {
		return err
	}
	defer cancel(nil)
	in, err := toGuest(req.Msg, &guestv1.ReadFileRequest{})
	if err != nil {
		return err
	}
	s, err := g.ReadFile(ctx, connect.NewRequest(in))
	if err != nil {
		return streamEndOf(filesWhat, ctx, err)
	}
	defer s.Close()
	for s.Receive() {
		var m *ctrlv1.ReadFileResponse
		if g := s.Msg(); g.GetFile() == nil {
			// A chunk, the bulk of the stream: its data is shared, not
			// encoded and decoded again.
			m = &ctrlv1.ReadFileResponse{Offset: g.GetOffset(), Data: g.GetData()}
		} else if m, err = transcode(g, &ctrlv1.ReadFileResponse{}); err != nil {
			return err
		}
		if err := out.Send(m); err != nil {
			return streamEndOf(filesWhat, ctx, err)
		}
	}
	return streamEndOf(filesWhat, ctx, s.Err())
}

// WatchDirectory streams the changes in a directory. The response headers
// are sent once the guest's came: the watch is then in place.
func (h *Files) WatchDirectory(ctx context.Context, req *connect.Request[ctrlv1.WatchDirectoryRequest], out *connect.ServerStream[ctrlv1.WatchDirectoryResponse]) error {
	g, ctx, cancel, err := h.openStream(ctx, req.Header(), req.Msg.GetWorkspaceId())
	if err != nil {
		return err
	}
	defer cancel(nil)
	in, err := toGuest(req.Msg, &guestv1.WatchDirectoryRequest{})
	if err != nil {
		return err
	}
	s, err := g.WatchDirectory(ctx, connect.NewRequest(in))
	if err != nil {
		return streamEndOf(filesWhat, ctx, err)
	}
	defer s.Close()
	s.ResponseHeader() // waits for the guest's headers
	if err := s.Err(); err != nil {
		return streamEndOf(filesWhat, ctx, err)
	}
	if err := out.Send(nil); err != nil {
		return streamEndOf(filesWhat, ctx, err)
	}
	for s.Receive() {
		m, err := transcode(s.Msg(), &ctrlv1.WatchDirectoryResponse{})
		if err != nil {
			return err
		}
		if err := out.Send(m); err != nil {
			return streamEndOf(filesWhat, ctx, err)
		}
	}
	return streamEndOf(filesWhat, ctx, s.Err())
}

// WriteFile forwards a header, then the bytes, message by message (HTTP/2
// flow control holds a fast client back through ctrl and the node). The
// header names the Workspace; a revoked token ends the stream with the
// refusal, and the guest then discards what it wrote.
func (h *Files) WriteFile(ctx context.Context, in *connect.ClientStream[ctrlv1.WriteFileRequest]) (*connect.Response[ctrlv1.WriteFileResponse], error) {
	if !in.Receive() {
		if err := in.Err(); err != nil {
			return nil, err
		}
		return nil, fault.Invalid("header", "a WriteFile stream starts with a header naming the workspace and the path")
	}
	first := in.Msg().GetHeader()
	if first == nil {
		return nil, fault.Invalid("header", "a WriteFile stream starts with a header naming the workspace and the path")
	}
	g, ctx, cancel, err := h.openStream(ctx, in.RequestHeader(), first.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	defer cancel(nil)
	hdr, err := toGuest(first, &guestv1.WriteFileHeader{})
	if err != nil {
		return nil, err
	}
	out := g.WriteFile(ctx)
	m := &guestv1.WriteFileRequest{Part: &guestv1.WriteFileRequest_Header{Header: hdr}}
	for {
		if err := out.Send(m); err != nil {
			break // the guest's answer says why
		}
		if !in.Receive() {
			if err := in.Err(); err != nil {
				cancel(nil) // the guest discards the file
				_, _ = out.CloseAndReceive()
				return nil, streamEndOf(filesWhat, ctx, err)
			}
			break
		}
		if in.Msg().GetHeader() != nil {
			cancel(nil)
			_, _ = out.CloseAndReceive()
			return nil, fault.Invalid("header", "a WriteFile stream has one header, its first message")
		}
		m = &guestv1.WriteFileRequest{Part: &guestv1.WriteFileRequest_Data{Data: in.Msg().GetData()}}
	}
	res, err := out.CloseAndReceive()
	if err != nil {
		return nil, streamEndOf(filesWhat, ctx, err)
	}
	return respond(transcode(res.Msg, &ctrlv1.WriteFileResponse{}))
}
