package kibotos_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/fstest"
	"testing/iotest"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/guest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// fakeFiles is a ctrl's SessionService and data-plane FileService whose
// Workspace's files are a local directory (through an os.Root). It checks
// the Bearer token of every call and answers like the public FileService:
// errors of the file with their code and no ErrorDetail, a refused token
// with unauthenticated / SESSION_EXPIRED.
type fakeFiles struct {
	ctrlv1connect.UnimplementedSessionServiceHandler
	ctrlv1connect.UnimplementedFileServiceHandler

	root *os.Root
	dir  string

	// expireFirst makes the first session expired at once: its token is
	// refused with SESSION_EXPIRED.
	expireFirst bool
	// breakReadAt, when > 0, ends the first ReadFile stream that passes
	// this offset with unavailable.
	breakReadAt atomic.Int64
	// listExtra is added to every listing (a hostile guest).
	listExtra *ctrlv1.FileInfo
	// events are sent by WatchDirectory.
	events []*ctrlv1.WatchDirectoryResponse

	mu        sync.Mutex
	sessions  int
	valid     map[string]bool
	calls     []string
	maxChunk  int
	committed int
	aborted   int
}

func newFakeFiles(t *testing.T) *fakeFiles {
	t.Helper()
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return &fakeFiles{root: root, dir: dir, valid: map[string]bool{}}
}

func (f *fakeFiles) record(method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, method)
}

func (f *fakeFiles) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == method {
			n++
		}
	}
	return n
}

func (f *fakeFiles) CreateDataPlaneSession(_ context.Context, r *connect.Request[ctrlv1.CreateDataPlaneSessionRequest]) (*connect.Response[ctrlv1.CreateDataPlaneSessionResponse], error) {
	f.record("CreateDataPlaneSession")
	if len(r.Msg.GetScopes()) != 1 || r.Msg.GetScopes()[0] != ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("scopes %v", r.Msg.GetScopes()))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sessions++
	tok := fmt.Sprintf("tok-%d", f.sessions)
	exp := time.Now().Add(r.Msg.GetTtl().AsDuration())
	if f.expireFirst && f.sessions == 1 {
		exp = time.Now()
	} else {
		f.valid[tok] = true
	}
	return connect.NewResponse(&ctrlv1.CreateDataPlaneSessionResponse{Session: &ctrlv1.DataPlaneSession{
		WorkspaceId: r.Msg.GetWorkspaceId(), Token: tok, ExpireTime: timestamppb.New(exp),
	}}), nil
}

// admit checks the token.
func (f *fakeFiles) admit(method string, h http.Header, ws string) error {
	f.record(method)
	tok, _ := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	f.mu.Lock()
	ok := f.valid[tok]
	f.mu.Unlock()
	if !ok {
		return detailed(connect.CodeUnauthenticated, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED, Message: "the token expired"})
	}
	if ws != fakeWorkspaceID {
		return detailed(connect.CodePermissionDenied, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED, Message: "another workspace"})
	}
	return nil
}

// rel is the name in root of an absolute path.
func rel(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q is not absolute", p))
	}
	p = strings.TrimPrefix(path.Clean(p), "/")
	if p == "" {
		return ".", nil
	}
	return p, nil
}

// osErr is the answer of the guest to a failed system call.
func osErr(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	}
	return connect.NewError(connect.CodeFailedPrecondition, err)
}

func infoOf(p string, fi fs.FileInfo, target string) *ctrlv1.FileInfo {
	t := ctrlv1.FileType_FILE_TYPE_REGULAR
	switch {
	case fi.IsDir():
		t = ctrlv1.FileType_FILE_TYPE_DIRECTORY
	case fi.Mode()&fs.ModeSymlink != 0:
		t = ctrlv1.FileType_FILE_TYPE_SYMLINK
	case !fi.Mode().IsRegular():
		t = ctrlv1.FileType_FILE_TYPE_OTHER
	}
	mode := uint32(fi.Mode().Perm())
	if fi.Mode()&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if fi.Mode()&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if fi.Mode()&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	m := &ctrlv1.FileInfo{Path: p, Type: t, Size: uint64(fi.Size()), Mode: mode, ModifyTime: timestamppb.New(fi.ModTime()), SymlinkTarget: target}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		m.Uid, m.Gid = st.Uid, st.Gid
	}
	return m
}

func (f *fakeFiles) stat(p string, follow bool) (*ctrlv1.FileInfo, error) {
	r, err := rel(p)
	if err != nil {
		return nil, err
	}
	var fi fs.FileInfo
	if follow {
		fi, err = f.root.Stat(r)
	} else {
		fi, err = f.root.Lstat(r)
	}
	if err != nil {
		return nil, osErr(err)
	}
	var target string
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ = f.root.Readlink(r)
	}
	return infoOf(path.Clean(p), fi, target), nil
}

func (f *fakeFiles) StatFile(_ context.Context, r *connect.Request[ctrlv1.StatFileRequest]) (*connect.Response[ctrlv1.StatFileResponse], error) {
	if err := f.admit("StatFile", r.Header(), r.Msg.GetWorkspaceId()); err != nil {
		return nil, err
	}
	m, err := f.stat(r.Msg.GetPath(), r.Msg.GetFollowSymlinks())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.StatFileResponse{File: m}), nil
}

func (f *fakeFiles) ListDirectory(_ context.Context, r *connect.Request[ctrlv1.ListDirectoryRequest]) (*connect.Response[ctrlv1.ListDirectoryResponse], error) {
	if err := f.admit("ListDirectory", r.Header(), r.Msg.GetWorkspaceId()); err != nil {
		return nil, err
	}
	if r.Msg.GetDepth() > 1 {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("fake: depth > 1"))
	}
	dir, err := rel(r.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	ents, err := fs.ReadDir(f.root.FS(), dir)
	if err != nil {
		return nil, osErr(err)
	}
	res := &ctrlv1.ListDirectoryResponse{}
	limit := int(r.Msg.GetLimit())
	for _, e := range ents {
		if len(res.Entries) == limit {
			res.Truncated = true
			break
		}
		m, err := f.stat(path.Join(r.Msg.GetPath(), e.Name()), false)
		if err != nil {
			return nil, err
		}
		res.Entries = append(res.Entries, m)
	}
	if f.listExtra != nil {
		res.Entries = append(res.Entries, f.listExtra)
	}
	return connect.NewResponse(res), nil
}

func (f *fakeFiles) MakeDirectory(_ context.Context, r *connect.Request[ctrlv1.MakeDirectoryRequest]) (*connect.Response[ctrlv1.MakeDirectoryResponse], error) {
	if err := f.admit("MakeDirectory", r.Header(), r.Msg.GetWorkspaceId()); err != nil {
		return nil, err
	}
	p, err := rel(r.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	mode := fs.FileMode(r.Msg.GetMode())
	if mode == 0 {
		mode = 0o755
	}
	if r.Msg.GetParents() {
		err = f.root.MkdirAll(p, mode)
	} else {
		err = f.root.Mkdir(p, mode)
	}
	if err != nil {
		return nil, osErr(err)
	}
	m, err := f.stat(r.Msg.GetPath(), false)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.MakeDirectoryResponse{Directory: m, Created: true}), nil
}

func (f *fakeFiles) MoveFile(_ context.Context, r *connect.Request[ctrlv1.MoveFileRequest]) (*connect.Response[ctrlv1.MoveFileResponse], error) {
	if err := f.admit("MoveFile", r.Header(), r.Msg.GetWorkspaceId()); err != nil {
		return nil, err
	}
	from, err := rel(r.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	to, err := rel(r.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if fi, err := f.root.Lstat(to); err == nil {
		if !r.Msg.GetOverwrite() {
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("destination exists"))
		}
		if fi.IsDir() {
			if err := f.root.Remove(to); err != nil { // an empty directory only
				return nil, osErr(err)
			}
		}
	}
	if err := f.root.Rename(from, to); err != nil {
		return nil, osErr(err)
	}
	m, err := f.stat(r.Msg.GetDestination(), false)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.MoveFileResponse{File: m}), nil
}

func (f *fakeFiles) RemoveFile(_ context.Context, r *connect.Request[ctrlv1.RemoveFileRequest]) (*connect.Response[ctrlv1.RemoveFileResponse], error) {
	if err := f.admit("RemoveFile", r.Header(), r.Msg.GetWorkspaceId()); err != nil {
		return nil, err
	}
	p, err := rel(r.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if p == "." {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("/ is refused"))
	}
	if _, err := f.root.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return connect.NewResponse(&ctrlv1.RemoveFileResponse{}), nil
	}
	if r.Msg.GetRecursive() {
		err = f.root.RemoveAll(p)
	} else {
		err = f.root.Remove(p)
	}
	if err != nil {
		return nil, osErr(err)
	}
	return connect.NewResponse(&ctrlv1.RemoveFileResponse{Existed: true}), nil
}

func (f *fakeFiles) ReadFile(ctx context.Context, r *connect.Request[ctrlv1.ReadFileRequest], out *connect.ServerStream[ctrlv1.ReadFileResponse]) error {
	if err := f.admit("ReadFile", r.Header(), r.Msg.GetWorkspaceId()); err != nil {
		return err
	}
	p, err := rel(r.Msg.GetPath())
	if err != nil {
		return err
	}
	fl, err := f.root.Open(p)
	if err != nil {
		return osErr(err)
	}
	defer fl.Close()
	fi, err := fl.Stat()
	if err != nil {
		return osErr(err)
	}
	if fi.IsDir() {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("is a directory"))
	}
	if err := out.Send(&ctrlv1.ReadFileResponse{File: infoOf(path.Clean(r.Msg.GetPath()), fi, "")}); err != nil {
		return err
	}
	off := int64(r.Msg.GetOffset())
	left := int64(r.Msg.GetLength())
	if left == 0 {
		left = 1 << 62
	}
	buf := make([]byte, 256<<10)
	for left > 0 {
		n, rerr := fl.ReadAt(buf[:min(int64(len(buf)), left)], off)
		if n > 0 {
			if b := f.breakReadAt.Load(); b > 0 && off+int64(n) > b && f.breakReadAt.CompareAndSwap(b, 0) {
				return connect.NewError(connect.CodeUnavailable, errors.New("fake: the stream broke"))
			}
			if err := out.Send(&ctrlv1.ReadFileResponse{Offset: uint64(off), Data: buf[:n]}); err != nil {
				return err
			}
			off += int64(n)
			left -= int64(n)
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return osErr(rerr)
		}
	}
	return nil
}

func (f *fakeFiles) WriteFile(ctx context.Context, in *connect.ClientStream[ctrlv1.WriteFileRequest]) (*connect.Response[ctrlv1.WriteFileResponse], error) {
	if !in.Receive() {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no header"))
	}
	hdr := in.Msg().GetHeader()
	if err := f.admit("WriteFile", in.RequestHeader(), hdr.GetWorkspaceId()); err != nil {
		return nil, err
	}
	p, err := rel(hdr.GetPath())
	if err != nil {
		return nil, err
	}
	if hdr.GetMakeParents() {
		if err := f.root.MkdirAll(path.Dir(p), 0o755); err != nil {
			return nil, osErr(err)
		}
	}
	mode := fs.FileMode(hdr.GetMode() & 0o777)
	if mode == 0 {
		mode = 0o644
	}
	tmp := path.Join(path.Dir(p), ".kibotos-tmp-"+path.Base(p))
	w, err := f.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return nil, osErr(err)
	}
	fail := func(err error) (*connect.Response[ctrlv1.WriteFileResponse], error) {
		w.Close()
		f.root.Remove(tmp)
		f.mu.Lock()
		f.aborted++
		f.mu.Unlock()
		return nil, err
	}
	for in.Receive() {
		d := in.Msg().GetData()
		f.mu.Lock()
		f.maxChunk = max(f.maxChunk, len(d))
		f.mu.Unlock()
		if len(d) > 512<<10 {
			return fail(connect.NewError(connect.CodeInvalidArgument, errors.New("chunk over 512 KiB")))
		}
		if _, err := w.Write(d); err != nil {
			return fail(osErr(err))
		}
	}
	if err := in.Err(); err != nil {
		return fail(err)
	}
	if err := w.Chmod(mode); err != nil {
		return fail(osErr(err))
	}
	if err := w.Close(); err != nil {
		return fail(osErr(err))
	}
	if err := f.root.Rename(tmp, p); err != nil {
		return fail(osErr(err))
	}
	f.mu.Lock()
	f.committed++
	f.mu.Unlock()
	m, err := f.stat(hdr.GetPath(), false)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.WriteFileResponse{File: m}), nil
}

func (f *fakeFiles) WatchDirectory(ctx context.Context, r *connect.Request[ctrlv1.WatchDirectoryRequest], out *connect.ServerStream[ctrlv1.WatchDirectoryResponse]) error {
	if err := f.admit("WatchDirectory", r.Header(), r.Msg.GetWorkspaceId()); err != nil {
		return err
	}
	for _, ev := range f.events {
		if err := out.Send(ev); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

// filesEnv serves files (and GetServerInfo with caps) over HTTP/2 and TLS
// and returns the FS of the fake Workspace, and the ServerInfo fake.
func filesEnv(t *testing.T, files *fakeFiles, caps []string, opts ...kibotos.FilesOption) (*kibotos.FS, *fakeCtrl) {
	t.Helper()
	info := newFakeCtrl(caps...)
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewServerInfoServiceHandler(info))
	mux.Handle(ctrlv1connect.NewSessionServiceHandler(files))
	mux.Handle(ctrlv1connect.NewFileServiceHandler(files))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c, err := kibotos.NewClient(srv.URL, kibotos.WithHTTPClient(srv.Client()), kibotos.WithDefaultRetryPolicy(fastRetry))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.Workspaces().Handle(fakeWorkspaceID).Files(t.Context(), opts...), info
}

var filesCaps = []string{capability.WorkspaceCreate, capability.WorkspaceFilesystem}

// writeTree makes files under dir: name → content ("/" suffix: a
// directory; "-> target": a symbolic link).
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(strings.TrimSuffix(name, "/")))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(name, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(content, "-> "):
			err = os.Symlink(strings.TrimPrefix(content, "-> "), p)
		default:
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestFilesFSTest runs the io/fs conformance test (testing/fstest) on the
// FS of a Workspace: Open, Stat, ReadDir, ReadFile, Seek, ReadAt, ReadLink
// and Lstat agree with one another and with the files.
func TestFilesFSTest(t *testing.T) {
	t.Parallel()
	files := newFakeFiles(t)
	writeTree(t, files.dir, map[string]string{
		"hello.txt":          "hello\n",
		"dir/a.txt":          "a",
		"dir/sub/b.txt":      strings.Repeat("b", 3000), // fstest reads it with a ReadAt per byte: chunks are TestFilesRead's
		"dir/empty/":         "",
		"dir/link":           "-> a.txt",
		"dir/sub/.hidden":    "h",
		"other/deep/c/d.bin": "\x00\x01\x02",
	})
	fsys, _ := filesEnv(t, files, filesCaps)
	if err := fstest.TestFS(fsys, "hello.txt", "dir/a.txt", "dir/sub/b.txt", "dir/empty", "dir/link", "other/deep/c/d.bin"); err != nil {
		t.Fatal(err)
	}
	sub, err := fs.Sub(fsys, "dir")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := fs.ReadFile(sub, "a.txt"); err != nil || string(b) != "a" {
		t.Errorf("ReadFile(Sub(dir), a.txt) = %q, %v", b, err)
	}
	if target, err := fsys.ReadLink("dir/link"); err != nil || target != "a.txt" {
		t.Errorf("ReadLink(dir/link) = %q, %v", target, err)
	}
	if fi, err := fsys.Lstat("dir/link"); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("Lstat(dir/link) = %v, %v; want a symbolic link", fi, err)
	}
	if fi, err := fsys.Stat("."); err != nil || !fi.IsDir() || fi.Sys().(*ctrlv1.FileInfo).GetPath() != "/" {
		t.Errorf("Stat(.) = %v, %v; want the directory /", fi, err)
	}
	if n := files.count("CreateDataPlaneSession"); n != 1 {
		t.Errorf("%d sessions created, want 1 for every call", n)
	}
}

// TestFilesRead: an open file streams ReadFile lazily (nothing but
// StatFile before the first Read), reads in order with small buffers,
// seeks, reads at offsets, and resumes a broken stream from where it was.
func TestFilesRead(t *testing.T) {
	t.Parallel()
	files := newFakeFiles(t)
	content := make([]byte, 3<<20+17)
	rand.Read(content)
	if err := os.WriteFile(filepath.Join(files.dir, "big"), content, 0o600); err != nil {
		t.Fatal(err)
	}
	fsys, _ := filesEnv(t, files, filesCaps)

	fl, err := fsys.Open("big")
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if n := files.count("ReadFile"); n != 0 {
		t.Errorf("Open sent %d ReadFile, want none before the first Read", n)
	}
	fi, err := fl.Stat()
	if err != nil || fi.Size() != int64(len(content)) || fi.Mode() != 0o600 || fi.Name() != "big" {
		t.Fatalf("Stat = %v, %v", fi, err)
	}
	got, err := io.ReadAll(iotest.OneByteReader(io.LimitReader(fl, 1000)))
	if err != nil || !bytes.Equal(got, content[:1000]) {
		t.Fatalf("first 1000 bytes one at a time: %d bytes, %v", len(got), err)
	}
	rest, err := io.ReadAll(fl)
	if err != nil || !bytes.Equal(rest, content[1000:]) {
		t.Fatalf("the rest: %d bytes, %v", len(rest), err)
	}
	if n := files.count("ReadFile"); n != 1 {
		t.Errorf("%d ReadFile streams for one pass, want 1", n)
	}

	sk := fl.(io.ReadSeeker)
	if off, err := sk.Seek(-10, io.SeekEnd); err != nil || off != int64(len(content)-10) {
		t.Fatalf("Seek(-10, end) = %d, %v", off, err)
	}
	if tail, err := io.ReadAll(sk); err != nil || !bytes.Equal(tail, content[len(content)-10:]) {
		t.Fatalf("tail = %x, %v", tail, err)
	}
	p := make([]byte, 5000)
	if n, err := fl.(io.ReaderAt).ReadAt(p, 1<<20); n != len(p) || err != nil || !bytes.Equal(p, content[1<<20:1<<20+5000]) {
		t.Fatalf("ReadAt(5000, 1MiB) = %d, %v", n, err)
	}
	if n, err := fl.(io.ReaderAt).ReadAt(p, int64(len(content)-100)); n != 100 || err != io.EOF {
		t.Fatalf("ReadAt past the end = %d, %v; want 100, EOF", n, err)
	}

	t.Run("Resume", func(t *testing.T) {
		files.breakReadAt.Store(1 << 20)
		b, err := fsys.ReadFile("big")
		if err != nil || !bytes.Equal(b, content) {
			t.Fatalf("ReadFile through a broken stream: %d bytes, %v", len(b), err)
		}
		if files.breakReadAt.Load() != 0 {
			t.Error("the stream was not broken")
		}
	})
	t.Run("ContextEnds", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		fl, err := fsys.WithContext(ctx).Open("big")
		if err != nil {
			t.Fatal(err)
		}
		defer fl.Close()
		if _, err := fl.Read(make([]byte, 10)); err != nil {
			t.Fatal(err)
		}
		cancel()
		_, err = io.ReadAll(fl)
		if !errors.Is(err, context.Canceled) && connect.CodeOf(err) != connect.CodeCanceled {
			t.Fatalf("read after cancel = %v, want canceled", err)
		}
	})
}

// TestFilesErrors: errors are *fs.PathError that match the fs errors; an
// invalid name sends nothing.
func TestFilesErrors(t *testing.T) {
	t.Parallel()
	files := newFakeFiles(t)
	writeTree(t, files.dir, map[string]string{"d/f": "x"})
	fsys, info := filesEnv(t, files, filesCaps)
	ctx := t.Context()

	_, err := fsys.Open("missing")
	if pe, ok := errors.AsType[*fs.PathError](err); !ok || pe.Op != "open" || pe.Path != "missing" || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open(missing) = %v, want *fs.PathError matching fs.ErrNotExist", err)
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Open(missing): code %v, want the server's not_found within", connect.CodeOf(err))
	}
	if _, err := fsys.ReadFile("d/missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile(d/missing) = %v, want fs.ErrNotExist", err)
	}
	if err := fsys.Mkdir(ctx, "d", 0o755); !errors.Is(err, fs.ErrExist) {
		t.Errorf("Mkdir(existing) = %v, want fs.ErrExist", err)
	}
	if err := fsys.Remove(ctx, "nothing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Remove(nothing) = %v, want fs.ErrNotExist", err)
	}
	if err := fsys.RemoveAll(ctx, "nothing"); err != nil {
		t.Errorf("RemoveAll(nothing) = %v, want nil", err)
	}
	if _, err := fsys.ReadDir("d/f"); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadDir(a file) = %v, want an error that is not ErrNotExist", err)
	}

	before := len(files.calls) + info.count("GetServerInfo")
	for _, name := range []string{"/etc", "../x", "a/../b", "a//b", "a/", ""} {
		if _, err := fsys.Stat(name); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("Stat(%q) = %v, want fs.ErrInvalid", name, err)
		}
		if _, err := fsys.WriteFile(ctx, name, strings.NewReader("x"), nil); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("WriteFile(%q) = %v, want fs.ErrInvalid", name, err)
		}
	}
	if err := fsys.RemoveAll(ctx, "."); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("RemoveAll(.) = %v, want fs.ErrInvalid", err)
	}
	if after := len(files.calls) + info.count("GetServerInfo"); after != before {
		t.Errorf("invalid names sent %d requests", after-before)
	}

	t.Run("TokenRefusalIsNotAFileError", func(t *testing.T) {
		fsys, _ := filesEnv(t, newFakeFiles(t), filesCaps, kibotos.WithFilesToken("not-a-token"))
		_, err := fsys.Stat("x")
		if connect.CodeOf(err) != connect.CodeUnauthenticated || errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			t.Errorf("Stat with a bad token = %v, want unauthenticated and no fs error", err)
		}
	})
	t.Run("HostileListing", func(t *testing.T) {
		files.listExtra = &ctrlv1.FileInfo{Path: "/d/../../etc", Type: ctrlv1.FileType_FILE_TYPE_REGULAR}
		defer func() { files.listExtra = nil }()
		if ents, err := fsys.ReadDir("d"); err == nil {
			t.Errorf("ReadDir with an entry outside the directory = %v, nil; want an error", ents)
		}
	})
}

// TestFilesWrite: WriteFile streams in chunks of at most 512 KiB from any
// reader, sets the mode, makes parents; a reader that fails resets the
// stream and the previous file stays.
func TestFilesWrite(t *testing.T) {
	t.Parallel()
	files := newFakeFiles(t)
	fsys, _ := filesEnv(t, files, filesCaps)
	ctx := t.Context()

	content := make([]byte, 2<<20+3)
	rand.Read(content)
	// A reader that is not an io.Seeker and returns short reads.
	r := iotest.HalfReader(io.MultiReader(bytes.NewReader(content)))
	fi, err := fsys.WriteFile(ctx, "x/y/file.bin", r, &kibotos.WriteFileOptions{Mode: 0o600 | fs.ModeSetgid, MakeParents: true})
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != int64(len(content)) || fi.Name() != "file.bin" {
		t.Errorf("WriteFile = %v", fi)
	}
	got, err := os.ReadFile(filepath.Join(files.dir, "x/y/file.bin"))
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("written: %d bytes, %v", len(got), err)
	}
	if st, _ := os.Stat(filepath.Join(files.dir, "x/y/file.bin")); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode())
	}
	if files.maxChunk != kibotos.FileChunkSize {
		t.Errorf("largest chunk %d, want %d", files.maxChunk, kibotos.FileChunkSize)
	}
	if _, err := fsys.WriteFile(ctx, "nodir/f", strings.NewReader("x"), nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("WriteFile without parents = %v, want fs.ErrNotExist", err)
	}

	t.Run("ReaderFails", func(t *testing.T) {
		boom := errors.New("boom")
		r := io.MultiReader(bytes.NewReader(content[:1<<20]), iotest.ErrReader(boom))
		_, err := fsys.WriteFile(ctx, "x/y/file.bin", r, nil)
		if !errors.Is(err, boom) {
			t.Fatalf("WriteFile from a failing reader = %v, want boom", err)
		}
		got, _ := os.ReadFile(filepath.Join(files.dir, "x/y/file.bin"))
		if !bytes.Equal(got, content) {
			t.Error("the previous file was replaced")
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			files.mu.Lock()
			aborted := files.aborted
			files.mu.Unlock()
			if aborted > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the server did not see the stream fail")
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	t.Run("Empty", func(t *testing.T) {
		if _, err := fsys.WriteFile(ctx, "empty", strings.NewReader(""), nil); err != nil {
			t.Fatal(err)
		}
		if b, err := fsys.ReadFile("empty"); err != nil || len(b) != 0 {
			t.Errorf("ReadFile(empty) = %q, %v", b, err)
		}
	})
}

// TestFilesDirectories: Mkdir, MkdirAll, Rename, Remove and RemoveAll.
func TestFilesDirectories(t *testing.T) {
	t.Parallel()
	files := newFakeFiles(t)
	fsys, _ := filesEnv(t, files, filesCaps)
	ctx := t.Context()
	if err := fsys.MkdirAll(ctx, "a/b/c", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := fsys.MkdirAll(ctx, "a/b/c", 0o700); err != nil {
		t.Errorf("MkdirAll(existing) = %v", err)
	}
	if err := fsys.Mkdir(ctx, "a/d", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := fsys.WriteFile(ctx, "a/b/c/f", strings.NewReader("f"), nil); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Rename(ctx, "a/b", "a/d"); err != nil {
		t.Fatalf("Rename onto an empty directory = %v", err)
	}
	if b, err := fsys.ReadFile("a/d/c/f"); err != nil || string(b) != "f" {
		t.Errorf("after Rename: ReadFile(a/d/c/f) = %q, %v", b, err)
	}
	if err := fsys.Remove(ctx, "a/d"); err == nil {
		t.Error("Remove(non-empty directory) = nil")
	}
	if err := fsys.RemoveAll(ctx, "a/d"); err != nil {
		t.Fatal(err)
	}
	if _, err := fsys.Stat("a/d"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat after RemoveAll = %v", err)
	}
	ents, err := fsys.ReadDir("a")
	if err != nil || len(ents) != 0 {
		t.Errorf("ReadDir(a) = %v, %v; want empty", ents, err)
	}
}

// TestFilesMissingCapability: without workspace.filesystem nothing but
// GetServerInfo is sent, and the error names the capability.
func TestFilesMissingCapability(t *testing.T) {
	t.Parallel()
	files := newFakeFiles(t)
	fsys, info := filesEnv(t, files, []string{capability.WorkspaceCreate, capability.WorkspaceExec})
	_, err := fsys.Stat("x")
	me, ok := errors.AsType[*kibotos.MissingCapabilityError](err)
	if !ok || me.Capability != capability.WorkspaceFilesystem {
		t.Fatalf("Stat = %v, want *MissingCapabilityError for workspace.filesystem", err)
	}
	if _, err := fsys.WriteFile(t.Context(), "x", strings.NewReader("x"), nil); !errors.As(err, &me) {
		t.Fatalf("WriteFile = %v, want *MissingCapabilityError", err)
	}
	if len(files.calls) != 0 || info.count("GetServerInfo") != 1 {
		t.Errorf("sent %v and %d GetServerInfo, want one GetServerInfo only", files.calls, info.count("GetServerInfo"))
	}
}

// TestFilesSessionRenewal: an expired session is created again and the
// call sent again; a write from an io.Seeker is made again from its start.
func TestFilesSessionRenewal(t *testing.T) {
	t.Parallel()
	t.Run("Stat", func(t *testing.T) {
		files := newFakeFiles(t)
		files.expireFirst = true
		writeTree(t, files.dir, map[string]string{"f": "x"})
		fsys, _ := filesEnv(t, files, filesCaps)
		if _, err := fsys.Stat("f"); err != nil {
			t.Fatal(err)
		}
		if n := files.count("CreateDataPlaneSession"); n != 2 {
			t.Errorf("%d sessions, want 2", n)
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		// Calls that share the FS and see its session expire together
		// all succeed; a call that finds it renewed by another does not
		// renew it again.
		files := newFakeFiles(t)
		files.expireFirst = true
		writeTree(t, files.dir, map[string]string{"f": "x"})
		fsys, _ := filesEnv(t, files, filesCaps)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				_, err := fsys.Stat("f")
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := files.count("CreateDataPlaneSession"); n > 3 {
			t.Errorf("%d sessions for 8 calls, want few", n)
		}
	})
	t.Run("WriteFromSeeker", func(t *testing.T) {
		files := newFakeFiles(t)
		files.expireFirst = true
		fsys, _ := filesEnv(t, files, filesCaps)
		// The first session is stale at once, so WriteFile renews it before
		// sending: one WriteFile stream.
		r := strings.NewReader("0123456789")
		r.Seek(3, io.SeekStart)
		if _, err := fsys.WriteFile(t.Context(), "f", r, nil); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(files.dir, "f")); string(b) != "3456789" {
			t.Errorf("written %q", b)
		}
		if n := files.count("CreateDataPlaneSession"); n != 2 {
			t.Errorf("%d sessions, want 2", n)
		}
	})
}

// TestFilesWatch: Watch yields the changes with fs names.
func TestFilesWatch(t *testing.T) {
	t.Parallel()
	files := newFakeFiles(t)
	files.events = []*ctrlv1.WatchDirectoryResponse{
		{Path: "/d/new", Change: ctrlv1.FileChange_FILE_CHANGE_CREATED},
		{Overflowed: true},
	}
	fsys, _ := filesEnv(t, files, filesCaps)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var got []kibotos.FileEvent
	for ev, err := range fsys.Watch(ctx, "d", true) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
		if len(got) == 2 {
			cancel()
		}
	}
	want := []kibotos.FileEvent{{Name: "d/new", Change: ctrlv1.FileChange_FILE_CHANGE_CREATED}, {Overflowed: true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Watch = %v, want %v", got, want)
	}
}

// TestFilesThroughCtrl runs the FS against a real ctrl: its public
// FileService, the node's data tunnel, and the guest's FileService (the
// real one, on a temporary directory as the Workspace's root).
func TestFilesThroughCtrl(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	rt := agenttest.New()
	p, h := guestv1connect.NewFileServiceHandler(guest.NewFileService(root))
	rt.GuestServices = map[string]http.Handler{p: h}
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt})
	if err := waitForCapability(e, capability.WorkspaceFilesystem); err != nil {
		t.Fatal(err)
	}
	c, err := kibotos.NewClient(e.URL, kibotos.WithTLSFiles(e.PKI.CA, e.PKI.Operator, e.PKI.OperatorKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx := t.Context()
	ws, err := c.Workspaces().Create(ctx, kibotos.WorkspaceSpec{MemoryMiB: 256, CPUMillis: 500})
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	fsys := ws.Files(ctx)

	content := make([]byte, 1<<20+5)
	rand.Read(content)
	if _, err := fsys.WriteFile(ctx, "d/big", iotest.HalfReader(bytes.NewReader(content)), &kibotos.WriteFileOptions{Mode: 0o640, MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"d/a.txt": "a", "d/sub/b.txt": "bb", "top": "t"} {
		if _, err := fsys.WriteFile(ctx, name, strings.NewReader(body), &kibotos.WriteFileOptions{MakeParents: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a.txt", filepath.Join(root, "d/link")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "d/big")); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("written: %d bytes, %v", len(b), err)
	}
	if b, err := fsys.ReadFile("d/big"); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("ReadFile(d/big): %d bytes, %v", len(b), err)
	}
	if fi, err := fsys.Stat("d/big"); err != nil || fi.Mode() != 0o640 || fi.Size() != int64(len(content)) {
		t.Errorf("Stat(d/big) = %v, %v", fi, err)
	}
	// fstest reads every file with a ReadAt per byte (a stream each):
	// the small files only.
	small, err := fs.Sub(fsys, "d")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(root, "d/big"), filepath.Join(root, "big")); err != nil {
		t.Fatal(err)
	}
	if err := fstest.TestFS(small, "a.txt", "sub/b.txt", "link"); err != nil {
		t.Error(err)
	}

	// The guest's errors match the fs errors; the Workspace's do not.
	if _, err := fsys.Stat("nothing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(nothing) = %v, want fs.ErrNotExist", err)
	}
	if err := fsys.Mkdir(ctx, "d", 0); !errors.Is(err, fs.ErrExist) {
		t.Errorf("Mkdir(d) = %v, want fs.ErrExist", err)
	}
	if _, err := fsys.ReadFile("d"); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile(a directory) = %v", err)
	}
	if err := fsys.Rename(ctx, "top", "d/top"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Remove(ctx, "d/top"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.RemoveAll(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Remove(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	if ents, err := fsys.ReadDir("."); err != nil || len(ents) != 0 {
		t.Errorf("ReadDir(.) after RemoveAll = %v, %v", ents, err)
	}
	gone := c.Workspaces().Handle("ws-0123456789abcdefghij").Files(ctx)
	if _, err := gone.Stat("x"); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat in an unknown Workspace = %v, want an error that is not fs.ErrNotExist", err)
	}

	t.Run("Watch", func(t *testing.T) {
		if err := fsys.MkdirAll(ctx, "w", 0); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		go func() {
			time.Sleep(200 * time.Millisecond)
			fsys.WriteFile(ctx, "w/new", strings.NewReader("n"), nil)
		}()
		for ev, err := range fsys.Watch(wctx, "w", false) {
			if err != nil {
				t.Fatal(err)
			}
			if ev.Name == "w/new" {
				return
			}
		}
		t.Error("no event for w/new")
	})
}
