package api_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/guest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/pki"
)

// writeFile writes content through the public WriteFile stream, 256 KiB a
// message.
func writeFile(ctx context.Context, f ctrlv1connect.FileServiceClient, tok string, h *ctrlv1.WriteFileHeader, content []byte) (*ctrlv1.FileInfo, error) {
	s := f.WriteFile(ctx)
	s.RequestHeader().Set("Authorization", "Bearer "+tok)
	if err := s.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Header{Header: h}}); err == nil {
		for len(content) > 0 {
			n := min(len(content), 256<<10)
			if err := s.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Data{Data: content[:n]}}); err != nil {
				break
			}
			content = content[n:]
		}
	}
	r, err := s.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return r.Msg.GetFile(), nil
}

// readFile reads a file through the public ReadFile stream.
func readFile(ctx context.Context, f ctrlv1connect.FileServiceClient, tok string, req *ctrlv1.ReadFileRequest) (*ctrlv1.FileInfo, []byte, error) {
	s, err := f.ReadFile(ctx, bearerReq(req, tok))
	if err != nil {
		return nil, nil, err
	}
	defer s.Close()
	var fi *ctrlv1.FileInfo
	var data []byte
	for s.Receive() {
		if s.Msg().GetFile() != nil {
			fi = s.Msg().GetFile()
		}
		data = append(data, s.Msg().GetData()...)
	}
	return fi, data, s.Err()
}

// TestFileService: the public FileService over a filesystem token and no
// client certificate, forwarded over the node's data tunnel to a guest
// FileService (the real one, on a temporary directory as the workspace's
// root); the refusals of the token; a revocation ends open streams.
func TestFileService(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	rt := agenttest.New()
	path, h := guestv1connect.NewFileServiceHandler(guest.NewFileService(root))
	rt.GuestServices = map[string]http.Handler{path: h}
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt})
	c := e.Clients(e.HTTP)
	ctx := t.Context()
	w, _ := createWS(t, c, "file-create")
	ws := w.GetWorkspaceId()
	waitCommand(t, c, "file-create")
	session := func(id string, scopes ...ctrlv1.DataPlaneScope) string {
		r, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(sessionReq(id, ws, time.Hour, scopes...)))
		if err != nil {
			t.Fatalf("CreateDataPlaneSession(%s) = %v", id, err)
		}
		return r.Msg.GetSession().GetToken()
	}
	tok := session("file-s1", scopeFS)
	f := ctrlv1connect.NewFileServiceClient(e.Client(t, "", ""), e.URL)

	// A round trip.
	content := bytes.Repeat([]byte("0123456789abcdef"), 50000) // 800000 bytes
	fi, err := writeFile(ctx, f, tok, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/d/f", Mode: 0o600, MakeParents: true}, content)
	if err != nil || fi.GetSize() != uint64(len(content)) || fi.GetMode() != 0o600 || fi.GetPath() != "/d/f" {
		t.Fatalf("WriteFile = %v, %v", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "d/f")); !bytes.Equal(b, content) {
		t.Errorf("the file written has %d bytes", len(b))
	}
	fi, data, err := readFile(ctx, f, tok, &ctrlv1.ReadFileRequest{WorkspaceId: ws, Path: "/d/f", Offset: 10, Length: 300000})
	if err != nil || !bytes.Equal(data, content[10:300010]) || fi.GetSize() != uint64(len(content)) {
		t.Errorf("ReadFile = %v, %d bytes, %v", fi, len(data), err)
	}
	st, err := f.StatFile(ctx, bearerReq(&ctrlv1.StatFileRequest{WorkspaceId: ws, Path: "/d"}, tok))
	if err != nil || st.Msg.GetFile().GetType() != ctrlv1.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("StatFile = %v, %v", st, err)
	}
	mk, err := f.MakeDirectory(ctx, bearerReq(&ctrlv1.MakeDirectoryRequest{WorkspaceId: ws, Path: "/d/sub"}, tok))
	if err != nil || !mk.Msg.GetCreated() {
		t.Errorf("MakeDirectory = %v, %v", mk, err)
	}
	mv, err := f.MoveFile(ctx, bearerReq(&ctrlv1.MoveFileRequest{WorkspaceId: ws, Source: "/d/f", Destination: "/d/sub/g"}, tok))
	if err != nil || mv.Msg.GetFile().GetPath() != "/d/sub/g" {
		t.Errorf("MoveFile = %v, %v", mv, err)
	}
	ls, err := f.ListDirectory(ctx, bearerReq(&ctrlv1.ListDirectoryRequest{WorkspaceId: ws, Path: "/d", Depth: 2}, tok))
	if err != nil || len(ls.Msg.GetEntries()) != 2 || ls.Msg.GetEntries()[1].GetPath() != "/d/sub/g" {
		t.Errorf("ListDirectory = %v, %v", ls, err)
	}
	for i, chunk := range []string{"ab", "cd"} {
		r, err := f.WriteFileChunk(ctx, bearerReq(&ctrlv1.WriteFileChunkRequest{Header: &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/c"},
			UploadId: "up-1", Offset: uint64(2 * i), Data: []byte(chunk), Commit: i == 1}, tok))
		if err != nil || r.Msg.GetWrittenBytes() != uint64(2*i+2) {
			t.Fatalf("WriteFileChunk %d = %v, %v", i, r, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "c")); string(b) != "abcd" {
		t.Errorf("chunked upload = %q", b)
	}
	// An HTTP/1.1 client (the Connect protocol, JSON): the unary chunks and
	// the server-streamed read.
	tlsc, err := pki.ClientConfig(e.PKI.CA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	tlsc.NextProtos = []string{"http/1.1"}
	h1 := ctrlv1connect.NewFileServiceClient(&http.Client{Transport: &http.Transport{TLSClientConfig: tlsc}}, e.URL, connect.WithProtoJSON())
	if _, err := h1.WriteFileChunk(ctx, bearerReq(&ctrlv1.WriteFileChunkRequest{Header: &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/h1"},
		UploadId: "h1", Data: []byte("over HTTP/1.1"), Commit: true}, tok)); err != nil {
		t.Errorf("WriteFileChunk over HTTP/1.1 = %v", err)
	}
	if _, data, err := readFile(ctx, h1, tok, &ctrlv1.ReadFileRequest{WorkspaceId: ws, Path: "/h1"}); err != nil || string(data) != "over HTTP/1.1" {
		t.Errorf("ReadFile over HTTP/1.1 = %q, %v", data, err)
	}
	_, err = f.WriteFileChunk(ctx, bearerReq(&ctrlv1.WriteFileChunkRequest{UploadId: "up-2", Data: []byte("x")}, tok))
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
	rm, err := f.RemoveFile(ctx, bearerReq(&ctrlv1.RemoveFileRequest{WorkspaceId: ws, Path: "/d", Recursive: true}, tok))
	if err != nil || !rm.Msg.GetExisted() {
		t.Errorf("RemoveFile = %v, %v", rm, err)
	}
	// The guest's refusals keep their code.
	_, err = f.StatFile(ctx, bearerReq(&ctrlv1.StatFileRequest{WorkspaceId: ws, Path: "/d"}, tok))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("StatFile(removed) = %v, want not_found", err)
	}
	_, err = f.StatFile(ctx, bearerReq(&ctrlv1.StatFileRequest{WorkspaceId: ws, Path: "../etc"}, tok))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("StatFile(relative) = %v, want invalid_argument", err)
	}
	// WriteFile starts with a header.
	s := f.WriteFile(ctx)
	s.RequestHeader().Set("Authorization", "Bearer "+tok)
	_ = s.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Data{Data: []byte("x")}})
	_, err = s.CloseAndReceive()
	wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)

	// Refusals.
	other, _ := createWS(t, c, "file-create-other")
	execTok := session("file-s-exec", scopeExec)
	for _, tc := range []struct {
		name, ws, tok string
		code          connect.Code
	}{
		{"no token", ws, "", connect.CodeUnauthenticated},
		{"forged token", ws, tok[:len(tok)-4] + "AAAA", connect.CodeUnauthenticated},
		{"another workspace", other.GetWorkspaceId(), tok, connect.CodePermissionDenied},
		{"exec scope", ws, execTok, connect.CodePermissionDenied},
	} {
		_, err := f.StatFile(ctx, bearerReq(&ctrlv1.StatFileRequest{WorkspaceId: tc.ws, Path: "/"}, tc.tok))
		wantErr(t, err, tc.code, ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, false)
		if err != nil && containsRoute(err.Error()) {
			t.Errorf("%s: %v names the route", tc.name, err)
		}
		_, err = writeFile(ctx, f, tc.tok, &ctrlv1.WriteFileHeader{WorkspaceId: tc.ws, Path: "/refused"}, []byte("x"))
		if connect.CodeOf(err) != tc.code {
			t.Errorf("%s: WriteFile = %v, want %v", tc.name, err, tc.code)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "refused")); err == nil {
		t.Error("a refused WriteFile wrote")
	}

	// Revocation ends open streams: a watch, a read held by flow control,
	// a write in progress (whose file is then not written).
	if err := os.WriteFile(filepath.Join(root, "big"), bytes.Repeat([]byte("z"), 32<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	watch, err := f.WatchDirectory(ctx, bearerReq(&ctrlv1.WatchDirectoryRequest{WorkspaceId: ws, Path: "/"}, tok))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	watch.ResponseHeader() // the watch is in place
	if err := os.WriteFile(filepath.Join(root, "seen"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !watch.Receive() || watch.Msg().GetPath() != "/seen" || watch.Msg().GetChange() != ctrlv1.FileChange_FILE_CHANGE_CREATED {
		t.Fatalf("first change = %v, %v", watch.Msg(), watch.Err())
	}
	read, err := f.ReadFile(ctx, bearerReq(&ctrlv1.ReadFileRequest{WorkspaceId: ws, Path: "/big"}, tok))
	if err != nil {
		t.Fatal(err)
	}
	defer read.Close()
	if !read.Receive() || read.Msg().GetFile().GetSize() != 32<<20 {
		t.Fatalf("first read message = %v, %v", read.Msg(), read.Err())
	}
	write := f.WriteFile(ctx)
	write.RequestHeader().Set("Authorization", "Bearer "+tok)
	if err := write.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Header{Header: &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/revoked"}}}); err != nil {
		t.Fatal(err)
	}
	_ = write.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Data{Data: []byte("before")}})
	if _, err := c.Workspace.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(revokeReq("file-revoke", ws))); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 3)
	go func() {
		for watch.Receive() {
		}
		ended <- watch.Err()
	}()
	go func() {
		for read.Receive() {
		}
		ended <- read.Err()
	}()
	go func() {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if err := write.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Data{Data: []byte("after")}}); err != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		_, err := write.CloseAndReceive()
		ended <- err
	}()
	for range 3 {
		select {
		case err := <-ended:
			wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED, false)
		case <-time.After(10 * time.Second):
			t.Fatal("a stream of a revoked token is still open after 10s")
		}
	}
	if _, err := os.Stat(filepath.Join(root, "revoked")); err == nil {
		t.Error("the write of a revoked token was committed")
	}
	if m, _ := filepath.Glob(filepath.Join(root, ".*.kibotos-*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
	_, err = f.StatFile(ctx, bearerReq(&ctrlv1.StatFileRequest{WorkspaceId: ws, Path: "/"}, tok))
	wantErr(t, err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED, false)

	// Not AVAILABLE: failed_precondition with the observed Workspace.
	fresh := session("file-s2", scopeFS)
	if _, err := stopWS(c, t, "file-stop", getWS(t, c, ws), false); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, ws, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	_, err = f.StatFile(ctx, bearerReq(&ctrlv1.StatFileRequest{WorkspaceId: ws, Path: "/"}, fresh))
	d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, false)
	if d.GetObservedWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || !strings.Contains(d.GetMessage(), "files") {
		t.Errorf("detail = %v, want the STOPPED workspace", d)
	}
}

// TestFileWireTwins: the guest's messages and the public ones have the
// same wire form (the public requests' workspace_id, field 1, aside).
func TestFileWireTwins(t *testing.T) {
	uid := uint32(5)
	now := timestamppb.New(time.Unix(1700000000, 5))
	gfi := &guestv1.FileInfo{Path: "/a", Type: guestv1.FileType_FILE_TYPE_SYMLINK, Size: 3, Mode: 0o4755, Uid: 1, Gid: 2, ModifyTime: now, SymlinkTarget: "/b"}
	pfi := &ctrlv1.FileInfo{Path: "/a", Type: ctrlv1.FileType_FILE_TYPE_SYMLINK, Size: 3, Mode: 0o4755, Uid: 1, Gid: 2, ModifyTime: now, SymlinkTarget: "/b"}
	for _, tc := range []struct{ guest, public proto.Message }{
		{&guestv1.StatFileRequest{Path: "/a", FollowSymlinks: true}, &ctrlv1.StatFileRequest{Path: "/a", FollowSymlinks: true}},
		{&guestv1.StatFileResponse{File: gfi}, &ctrlv1.StatFileResponse{File: pfi}},
		{&guestv1.ListDirectoryRequest{Path: "/a", Depth: 2, Limit: 3}, &ctrlv1.ListDirectoryRequest{Path: "/a", Depth: 2, Limit: 3}},
		{&guestv1.ListDirectoryResponse{Entries: []*guestv1.FileInfo{gfi}, Truncated: true}, &ctrlv1.ListDirectoryResponse{Entries: []*ctrlv1.FileInfo{pfi}, Truncated: true}},
		{&guestv1.MakeDirectoryRequest{Path: "/a", Parents: true, Mode: 0o700, Uid: &uid}, &ctrlv1.MakeDirectoryRequest{Path: "/a", Parents: true, Mode: 0o700, Uid: &uid}},
		{&guestv1.MakeDirectoryResponse{Directory: gfi, Created: true}, &ctrlv1.MakeDirectoryResponse{Directory: pfi, Created: true}},
		{&guestv1.MoveFileRequest{Source: "/a", Destination: "/b", Overwrite: true}, &ctrlv1.MoveFileRequest{Source: "/a", Destination: "/b", Overwrite: true}},
		{&guestv1.MoveFileResponse{File: gfi}, &ctrlv1.MoveFileResponse{File: pfi}},
		{&guestv1.RemoveFileRequest{Path: "/a", Recursive: true}, &ctrlv1.RemoveFileRequest{Path: "/a", Recursive: true}},
		{&guestv1.RemoveFileResponse{Existed: true}, &ctrlv1.RemoveFileResponse{Existed: true}},
		{&guestv1.ReadFileRequest{Path: "/a", Offset: 1, Length: 2}, &ctrlv1.ReadFileRequest{Path: "/a", Offset: 1, Length: 2}},
		{&guestv1.ReadFileResponse{File: gfi, Offset: 4, Data: []byte("x")}, &ctrlv1.ReadFileResponse{File: pfi, Offset: 4, Data: []byte("x")}},
		{&guestv1.WriteFileRequest{Part: &guestv1.WriteFileRequest_Header{Header: &guestv1.WriteFileHeader{Path: "/a", Mode: 0o600, Uid: &uid, Gid: &uid, MakeParents: true}}},
			&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Header{Header: &ctrlv1.WriteFileHeader{Path: "/a", Mode: 0o600, Uid: &uid, Gid: &uid, MakeParents: true}}}},
		{&guestv1.WriteFileRequest{Part: &guestv1.WriteFileRequest_Data{Data: []byte("d")}}, &ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Data{Data: []byte("d")}}},
		{&guestv1.WriteFileResponse{File: gfi}, &ctrlv1.WriteFileResponse{File: pfi}},
		{&guestv1.WriteFileChunkRequest{Header: &guestv1.WriteFileHeader{Path: "/a"}, UploadId: "u", Offset: 3, Data: []byte("d"), Commit: true},
			&ctrlv1.WriteFileChunkRequest{Header: &ctrlv1.WriteFileHeader{Path: "/a"}, UploadId: "u", Offset: 3, Data: []byte("d"), Commit: true}},
		{&guestv1.WriteFileChunkResponse{WrittenBytes: 4, File: gfi}, &ctrlv1.WriteFileChunkResponse{WrittenBytes: 4, File: pfi}},
		{&guestv1.WatchDirectoryRequest{Path: "/a", Recursive: true}, &ctrlv1.WatchDirectoryRequest{Path: "/a", Recursive: true}},
		{&guestv1.WatchDirectoryResponse{Path: "/a", Change: guestv1.FileChange_FILE_CHANGE_ATTRIBUTES, Overflowed: true},
			&ctrlv1.WatchDirectoryResponse{Path: "/a", Change: ctrlv1.FileChange_FILE_CHANGE_ATTRIBUTES, Overflowed: true}},
	} {
		b, err := proto.Marshal(tc.guest)
		if err != nil {
			t.Fatal(err)
		}
		got := tc.public.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(b, got); err != nil || !proto.Equal(got, tc.public) {
			t.Errorf("%T → %T = %v, %v; want %v", tc.guest, tc.public, got, err, tc.public)
		}
		b, err = proto.Marshal(tc.public)
		if err != nil {
			t.Fatal(err)
		}
		back := tc.guest.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(b, back); err != nil || !proto.Equal(back, tc.guest) {
			t.Errorf("%T → %T = %v, %v; want %v", tc.public, tc.guest, back, err, tc.guest)
		}
	}
}
