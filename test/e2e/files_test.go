package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/pki"
)

// fsToken creates a session of the workspace with scopes.
func (e *dpEnv) fsToken(scopes ...ctrlv1.DataPlaneScope) string {
	e.t.Helper()
	e.n++
	r, err := e.sessions.CreateDataPlaneSession(e.t.Context(), connect.NewRequest(&ctrlv1.CreateDataPlaneSessionRequest{
		Metadata: md(fmt.Sprintf("%s-fs%d", e.id, e.n)), WorkspaceId: e.id, Scopes: scopes}))
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Msg.GetSession().GetToken()
}

// newFiles is a public FileService client on a connection of its own
// (TLS, no client certificate).
func (e *dpEnv) newFiles() ctrlv1connect.FileServiceClient {
	e.t.Helper()
	tlsc, err := pki.ClientConfig(pki.DevPathsIn(e.dataDir).CA, "", "")
	if err != nil {
		e.t.Fatal(err)
	}
	return ctrlv1connect.NewFileServiceClient(&http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}}, e.p.url)
}

// e2eWrite writes n bytes of content through WriteFile, 256 KiB a message.
func e2eWrite(ctx context.Context, f ctrlv1connect.FileServiceClient, tok string, h *ctrlv1.WriteFileHeader, content []byte) (*ctrlv1.FileInfo, error) {
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

func e2eRead(ctx context.Context, f ctrlv1connect.FileServiceClient, tok, ws, path string) ([]byte, error) {
	s, err := f.ReadFile(ctx, bearer(&ctrlv1.ReadFileRequest{WorkspaceId: ws, Path: path}, tok))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var data []byte
	for s.Receive() {
		data = append(data, s.Msg().GetData()...)
	}
	return data, s.Err()
}

// hostState is a host file's content and modification time.
func hostState(t *testing.T, p string) string {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatalf("host %s: %v", p, err)
	}
	b, _ := os.ReadFile(p)
	return fmt.Sprintf("%d %v %x", fi.Size(), fi.ModTime().UnixNano(), b)
}

// TestFilesThroughPublicEndpoint: a real workspace's files through the
// public FileService: a round trip; symbolic links planted in the
// workspace towards host paths are resolved inside the workspace, never on
// the host; a write beyond the writable layer is resource_exhausted and
// keeps the previous file; the scope; revocation ends open streams.
func TestFilesThroughPublicEndpoint(t *testing.T) {
	e := newDPEnv(t, "e2e-files")
	ctx := t.Context()
	ws := e.id
	tok := e.fsToken(ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM)
	execTok := e.token()
	f := e.newFiles()

	// A round trip.
	content := make([]byte, 3<<20+12345)
	_, _ = rand.Read(content)
	fi, err := e2eWrite(ctx, f, tok, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/work/sub/data.bin", Mode: 0o640, MakeParents: true}, content)
	if err != nil || fi.GetSize() != uint64(len(content)) || fi.GetMode() != 0o640 {
		t.Fatalf("WriteFile = %v, %v; stderr:\n%s", fi, err, e.p.stderr)
	}
	if got, err := e2eRead(ctx, f, tok, ws, "/work/sub/data.bin"); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("ReadFile = %d bytes, %v", len(got), err)
	}
	// The process sees what was written.
	if out := e.mustRun(execTok, "sh", "-c", "wc -c < /work/sub/data.bin"); string(bytes.TrimSpace([]byte(out))) != fmt.Sprint(len(content)) {
		t.Errorf("wc -c inside = %q", out)
	}
	st, err := f.StatFile(ctx, bearer(&ctrlv1.StatFileRequest{WorkspaceId: ws, Path: "/work/sub"}, tok))
	if err != nil || st.Msg.GetFile().GetType() != ctrlv1.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("StatFile = %v, %v", st, err)
	}
	if _, err := f.MakeDirectory(ctx, bearer(&ctrlv1.MakeDirectoryRequest{WorkspaceId: ws, Path: "/work/dst"}, tok)); err != nil {
		t.Errorf("MakeDirectory = %v", err)
	}
	if _, err := f.MoveFile(ctx, bearer(&ctrlv1.MoveFileRequest{WorkspaceId: ws, Source: "/work/sub/data.bin", Destination: "/work/dst/moved.bin"}, tok)); err != nil {
		t.Errorf("MoveFile = %v", err)
	}
	ls, err := f.ListDirectory(ctx, bearer(&ctrlv1.ListDirectoryRequest{WorkspaceId: ws, Path: "/work", Depth: 3}, tok))
	var paths []string
	for _, en := range ls.Msg.GetEntries() {
		paths = append(paths, en.GetPath())
	}
	if err != nil || fmt.Sprint(paths) != "[/work/dst /work/dst/moved.bin /work/sub]" {
		t.Errorf("ListDirectory = %v, %v", paths, err)
	}
	if r, err := f.RemoveFile(ctx, bearer(&ctrlv1.RemoveFileRequest{WorkspaceId: ws, Path: "/work/dst", Recursive: true}, tok)); err != nil || !r.Msg.GetExisted() {
		t.Errorf("RemoveFile = %v, %v", r, err)
	}

	// Symbolic links planted in the workspace towards host paths resolve
	// inside the workspace: the host's files are neither read, written nor
	// removed.
	hostDir := t.TempDir()
	canary := filepath.Join(hostDir, "canary")
	if err := os.WriteFile(canary, []byte("host canary\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := map[string]string{canary: hostState(t, canary), "/etc/shadow": hostState(t, "/etc/shadow"), hostDir: hostState(t, hostDir)}
	e.mustRun(execTok, "sh", "-c", `mkdir -p /links && ln -s "$0" /links/canary && ln -s /etc/shadow /links/shadow && ln -s "$1" /links/dir && ln -s "$0" /links/canary2`, canary, hostDir)
	if got, err := e2eRead(ctx, f, tok, ws, "/links/canary"); bytes.Contains(got, []byte("host canary")) || connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("ReadFile through a link to a host file = %q, %v; want not_found", got, err)
	}
	if got, _ := e2eRead(ctx, f, tok, ws, "/links/shadow"); len(got) > 0 {
		if host, _ := os.ReadFile("/etc/shadow"); bytes.Equal(got, host) {
			t.Error("ReadFile through a link to /etc/shadow read the host's")
		}
	}
	if _, err := e2eWrite(ctx, f, tok, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/links/canary"}, []byte("overwritten")); err != nil {
		t.Errorf("WriteFile over a link = %v", err)
	}
	if _, err := e2eWrite(ctx, f, tok, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/links/shadow"}, []byte("root::0:0:::::\n")); err != nil {
		t.Errorf("WriteFile over a link to /etc/shadow = %v", err)
	}
	_, err = e2eWrite(ctx, f, tok, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/links/dir/planted"}, []byte("x"))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("WriteFile under a link to a host directory = %v, want not_found", err)
	}
	_, err = f.MakeDirectory(ctx, bearer(&ctrlv1.MakeDirectoryRequest{WorkspaceId: ws, Path: "/links/dir/made", Parents: true}, tok))
	if err != nil {
		t.Logf("MakeDirectory under a link to a host directory = %v", err)
	}
	for _, p := range []string{"/links/canary2", "/links/dir"} {
		if r, err := f.RemoveFile(ctx, bearer(&ctrlv1.RemoveFileRequest{WorkspaceId: ws, Path: p, Recursive: true}, tok)); err != nil || !r.Msg.GetExisted() {
			t.Errorf("RemoveFile(%s) = %v, %v", p, r, err)
		}
	}
	st, err = f.StatFile(ctx, bearer(&ctrlv1.StatFileRequest{WorkspaceId: ws, Path: "/links/canary"}, tok))
	if err != nil || st.Msg.GetFile().GetType() != ctrlv1.FileType_FILE_TYPE_REGULAR || st.Msg.GetFile().GetSize() != uint64(len("overwritten")) {
		t.Errorf("the link written over = %v, %v; want a regular file of the workspace", st, err)
	}
	for p, was := range before {
		if now := hostState(t, p); now != was {
			t.Errorf("host %s changed: %s → %s", p, was, now)
		}
	}
	if _, err := os.Stat(filepath.Join(hostDir, "planted")); err == nil {
		t.Error("a file was planted in the host directory")
	}
	if _, err := os.Stat(filepath.Join(hostDir, "made")); err == nil {
		t.Error("a directory was made in the host directory")
	}

	// A write beyond the writable layer (64 MiB): resource_exhausted, the
	// previous file intact, no temporary file left.
	if _, err := e2eWrite(ctx, f, tok, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/work/keep"}, []byte("previous")); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("b"), 100<<20)
	start := time.Now()
	_, err = e2eWrite(ctx, f, tok, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/work/keep"}, big)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("WriteFile(100 MiB into 64 MiB) = %v, want resource_exhausted", err)
	}
	t.Logf("100 MiB into a 64 MiB writable layer refused after %v", time.Since(start).Round(time.Millisecond))
	if got, err := e2eRead(ctx, f, tok, ws, "/work/keep"); err != nil || string(got) != "previous" {
		t.Errorf("after the refused write: %q, %v", got, err)
	}
	ls, err = f.ListDirectory(ctx, bearer(&ctrlv1.ListDirectoryRequest{WorkspaceId: ws, Path: "/work"}, tok))
	if err != nil || len(ls.Msg.GetEntries()) != 2 { // keep, sub
		t.Errorf("/work after the refused write = %v, %v", ls.Msg.GetEntries(), err)
	}
	// The space is back: a write that fits works (40 MiB, read below).
	start = time.Now()
	if _, err := e2eWrite(ctx, f, tok, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/work/keep"}, big[:40<<20]); err != nil {
		t.Errorf("WriteFile(40 MiB) after the refused one = %v", err)
	}
	wrote := time.Since(start)
	start = time.Now()
	if got, err := e2eRead(ctx, f, tok, ws, "/work/keep"); err != nil || !bytes.Equal(got, big[:40<<20]) {
		t.Errorf("ReadFile(40 MiB) = %d bytes, %v", len(got), err)
	}
	t.Logf("40 MiB: WriteFile %v (%.0f MiB/s), ReadFile %v (%.0f MiB/s)", wrote.Round(time.Millisecond), 40/wrote.Seconds(),
		time.Since(start).Round(time.Millisecond), 40/time.Since(start).Seconds())

	// A token without the filesystem scope.
	_, err = f.StatFile(ctx, bearer(&ctrlv1.StatFileRequest{WorkspaceId: ws, Path: "/"}, execTok))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("StatFile with an exec token = %v, want permission_denied", err)
	}

	// Revocation ends an open watch and an open read (held by flow
	// control: it is not read).
	watch, err := f.WatchDirectory(ctx, bearer(&ctrlv1.WatchDirectoryRequest{WorkspaceId: ws, Path: "/work", Recursive: true}, tok))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	watch.ResponseHeader()
	if _, err := e2eWrite(ctx, f, tok, &ctrlv1.WriteFileHeader{WorkspaceId: ws, Path: "/work/sub/seen"}, []byte("x")); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for !got["/work/sub/seen CREATED"] && watch.Receive() {
		got[watch.Msg().GetPath()+" "+watch.Msg().GetChange().String()[len("FILE_CHANGE_"):]] = true
	}
	if !got["/work/sub/seen CREATED"] {
		t.Fatalf("watch = %v, %v", got, watch.Err())
	}
	read, err := f.ReadFile(ctx, bearer(&ctrlv1.ReadFileRequest{WorkspaceId: ws, Path: "/work/keep"}, tok))
	if err != nil {
		t.Fatal(err)
	}
	defer read.Close()
	if !read.Receive() || read.Msg().GetFile() == nil {
		t.Fatalf("ReadFile first message = %v, %v", read.Msg(), read.Err())
	}
	if _, err := e.ws.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(&ctrlv1.RevokeWorkspaceDataPlaneRequest{Metadata: md("e2e-files-revoke"), WorkspaceId: ws})); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	ended := make(chan error, 2)
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
	for range 2 {
		select {
		case err := <-ended:
			if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("a stream after revocation ended with %v, want unauthenticated", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a stream of a revoked token is still open after 10s")
		}
	}
	t.Logf("streams closed %v after the revocation", time.Since(revoked).Round(10*time.Microsecond))
}
