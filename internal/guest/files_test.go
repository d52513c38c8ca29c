package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// The FileService's handlers run in-process over HTTP/2, on a temporary
// directory as the root (fileService.root): the paths the tests send are
// workspace paths, resolved under it.

func startFiles(t *testing.T) (guestv1connect.FileServiceClient, *fileService, string) {
	t.Helper()
	root := t.TempDir()
	s := newFileService(root)
	mux := http.NewServeMux()
	mux.Handle(guestv1connect.NewFileServiceHandler(s, connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage), connect.WithSendMaxBytes(protocol.MaxDataPlaneMessage)))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := guestv1connect.NewFileServiceClient(srv.Client(), srv.URL, connect.WithGRPC(),
		connect.WithReadMaxBytes(protocol.MaxDataPlaneMessage), connect.WithSendMaxBytes(protocol.MaxDataPlaneMessage))
	return c, s, root
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
	}
}

func writeHost(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCheckPath(t *testing.T) {
	for _, tc := range []struct {
		p  string
		ok bool
	}{
		{"/", true},
		{"/a", true},
		{"/a/b.c/d e", true},
		{"/é/日本", true},
		{"/" + strings.Repeat("a", MaxPathBytes-1), true},
		{"/" + strings.Repeat("a", MaxPathBytes), false},
		{"", false},
		{"a", false},
		{"a/b", false},
		{"/a/", false},
		{"//a", false},
		{"/a//b", false},
		{"/a/./b", false},
		{"/a/../b", false},
		{"/..", false},
		{"/.", false},
		{"/a\x00b", false},
		{"/a\xffb", false},
	} {
		err := checkPath("path", tc.p)
		if (err == nil) != tc.ok {
			t.Errorf("checkPath(%q): %v, want ok %v", protocol.Clip(tc.p, 40), err, tc.ok)
		}
		if err != nil && (connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "path:")) {
			t.Errorf("checkPath(%q): %v, want invalid_argument naming the field", protocol.Clip(tc.p, 40), err)
		}
	}
}

// FuzzCheckPath: what checkPath accepts is absolute, clean, valid UTF-8,
// without NUL, bounded, and stays under the root once prefixed.
func FuzzCheckPath(f *testing.F) {
	for _, p := range []string{"/", "/a/b", "/a/../b", "//", "/a\x00", "", "a", "/..", "/a/./b/"} {
		f.Add(p)
	}
	s := &fileService{root: "/root-of-test"}
	f.Fuzz(func(t *testing.T, p string) {
		if checkPath("path", p) != nil {
			return
		}
		if !strings.HasPrefix(p, "/") || path.Clean(p) != p || !utf8.ValidString(p) || strings.IndexByte(p, 0) >= 0 || len(p) > MaxPathBytes {
			t.Fatalf("accepted %q", p)
		}
		for _, e := range strings.Split(p, "/")[1:] {
			if e == ".." || e == "." || (e == "" && p != "/") {
				t.Fatalf("accepted %q with element %q", p, e)
			}
		}
		if h := s.host(p); h != "/root-of-test" && !strings.HasPrefix(h, "/root-of-test/") {
			t.Fatalf("%q is %q on the host", p, h)
		}
	})
}

func TestFileErrorMapping(t *testing.T) {
	for errno, code := range map[syscall.Errno]connect.Code{
		unix.ENOENT: connect.CodeNotFound, unix.EEXIST: connect.CodeAlreadyExists,
		unix.EACCES: connect.CodePermissionDenied, unix.EPERM: connect.CodePermissionDenied,
		unix.ENOTDIR: connect.CodeFailedPrecondition, unix.EISDIR: connect.CodeFailedPrecondition,
		unix.ENOTEMPTY: connect.CodeFailedPrecondition, unix.ENOSPC: connect.CodeResourceExhausted,
		unix.EDQUOT: connect.CodeResourceExhausted, unix.EMFILE: connect.CodeResourceExhausted,
		unix.ELOOP: connect.CodeFailedPrecondition, unix.EINVAL: connect.CodeInvalidArgument, unix.EIO: connect.CodeInternal,
	} {
		err := fileError("op", "/x", &os.PathError{Op: "open", Path: "/host/secret/x", Err: errno})
		if connect.CodeOf(err) != code || strings.Contains(err.Error(), "secret") {
			t.Errorf("%v: %v, want %v without the host path", errno, err, code)
		}
	}
}

func TestStatAndList(t *testing.T) {
	c, _, root := startFiles(t)
	ctx := testCtx(t)
	writeHost(t, root+"/d/a", "aa")
	writeHost(t, root+"/d/b/c", "c")
	writeHost(t, root+"/d/b/e/f", "f")
	writeHost(t, root+"/d/a-b", "")
	writeHost(t, root+"/other/x", "")
	if err := os.Symlink("../other", root+"/d/link"); err != nil {
		t.Fatal(err)
	}

	st, err := c.StatFile(ctx, connect.NewRequest(&guestv1.StatFileRequest{Path: "/d/a"}))
	if err != nil || st.Msg.File.GetSize() != 2 || st.Msg.File.GetType() != guestv1.FileType_FILE_TYPE_REGULAR || st.Msg.File.GetPath() != "/d/a" || st.Msg.File.GetMode() != 0o644 {
		t.Errorf("stat /d/a: %v %v", st, err)
	}
	st, err = c.StatFile(ctx, connect.NewRequest(&guestv1.StatFileRequest{Path: "/d/link"}))
	if err != nil || st.Msg.File.GetType() != guestv1.FileType_FILE_TYPE_SYMLINK || st.Msg.File.GetSymlinkTarget() != "../other" {
		t.Errorf("stat /d/link: %v %v", st, err)
	}
	st, err = c.StatFile(ctx, connect.NewRequest(&guestv1.StatFileRequest{Path: "/d/link", FollowSymlinks: true}))
	if err != nil || st.Msg.File.GetType() != guestv1.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("stat -L /d/link: %v %v", st, err)
	}
	_, err = c.StatFile(ctx, connect.NewRequest(&guestv1.StatFileRequest{Path: "/nothing"}))
	wantCode(t, "stat /nothing", err, connect.CodeNotFound)
	_, err = c.StatFile(ctx, connect.NewRequest(&guestv1.StatFileRequest{Path: "/d/../etc"}))
	wantCode(t, "stat /d/../etc", err, connect.CodeInvalidArgument)

	list := func(depth, limit uint32) ([]string, bool) {
		t.Helper()
		r, err := c.ListDirectory(ctx, connect.NewRequest(&guestv1.ListDirectoryRequest{Path: "/d", Depth: depth, Limit: limit}))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range r.Msg.Entries {
			names = append(names, e.GetPath())
		}
		return names, r.Msg.Truncated
	}
	if got, tr := list(0, 0); strings.Join(got, " ") != "/d/a /d/a-b /d/b /d/link" || tr {
		t.Errorf("list depth 0: %v %v", got, tr)
	}
	// The link to a directory is listed, not descended.
	if got, tr := list(16, 0); strings.Join(got, " ") != "/d/a /d/a-b /d/b /d/b/c /d/b/e /d/b/e/f /d/link" || tr {
		t.Errorf("list depth 16: %v %v", got, tr)
	}
	if got, tr := list(2, 0); strings.Join(got, " ") != "/d/a /d/a-b /d/b /d/b/c /d/b/e /d/link" || tr {
		t.Errorf("list depth 2: %v %v", got, tr)
	}
	if got, tr := list(16, 3); strings.Join(got, " ") != "/d/a /d/a-b /d/b" || !tr {
		t.Errorf("list limit 3: %v %v", got, tr)
	}
	_, err = c.ListDirectory(ctx, connect.NewRequest(&guestv1.ListDirectoryRequest{Path: "/d", Depth: 17}))
	wantCode(t, "depth 17", err, connect.CodeInvalidArgument)
	_, err = c.ListDirectory(ctx, connect.NewRequest(&guestv1.ListDirectoryRequest{Path: "/d", Limit: MaxListLimit + 1}))
	wantCode(t, "limit 10001", err, connect.CodeInvalidArgument)
	_, err = c.ListDirectory(ctx, connect.NewRequest(&guestv1.ListDirectoryRequest{Path: "/d/a"}))
	wantCode(t, "list a file", err, connect.CodeFailedPrecondition)
	_, err = c.ListDirectory(ctx, connect.NewRequest(&guestv1.ListDirectoryRequest{Path: "/nothing"}))
	wantCode(t, "list nothing", err, connect.CodeNotFound)

	// The default limit.
	for i := range DefaultListLimit + 5 {
		writeHost(t, fmt.Sprintf("%s/many/%05d", root, i), "")
	}
	r, err := c.ListDirectory(ctx, connect.NewRequest(&guestv1.ListDirectoryRequest{Path: "/many"}))
	if err != nil || len(r.Msg.Entries) != DefaultListLimit || !r.Msg.Truncated || r.Msg.Entries[0].GetPath() != "/many/00000" {
		t.Errorf("list /many: %d entries, truncated %v, %v", len(r.Msg.GetEntries()), r.Msg.GetTruncated(), err)
	}

	// Long names: the answer stays below the message bound, truncated.
	long := strings.Repeat("n", 200)
	for i := range 4000 {
		writeHost(t, fmt.Sprintf("%s/long/%s%05d", root, long, i), "")
	}
	r, err = c.ListDirectory(ctx, connect.NewRequest(&guestv1.ListDirectoryRequest{Path: "/long", Limit: MaxListLimit}))
	if err != nil || !r.Msg.Truncated || len(r.Msg.Entries) < 1000 || len(r.Msg.Entries) >= 4000 {
		t.Errorf("list /long: %d entries, truncated %v, %v", len(r.Msg.GetEntries()), r.Msg.GetTruncated(), err)
	}
	t.Logf("list of 4000 names of 206 bytes: %d entries, %d bytes", len(r.Msg.GetEntries()), proto.Size(r.Msg))
}

func TestMakeDirectory(t *testing.T) {
	c, _, root := startFiles(t)
	ctx := testCtx(t)
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)

	r, err := c.MakeDirectory(ctx, connect.NewRequest(&guestv1.MakeDirectoryRequest{Path: "/a"}))
	if err != nil || !r.Msg.Created || r.Msg.Directory.GetMode() != 0o755 || r.Msg.Directory.GetType() != guestv1.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("mkdir /a: %v %v", r, err)
	}
	_, err = c.MakeDirectory(ctx, connect.NewRequest(&guestv1.MakeDirectoryRequest{Path: "/a"}))
	wantCode(t, "mkdir /a again", err, connect.CodeAlreadyExists)
	_, err = c.MakeDirectory(ctx, connect.NewRequest(&guestv1.MakeDirectoryRequest{Path: "/x/y"}))
	wantCode(t, "mkdir /x/y", err, connect.CodeNotFound)
	r, err = c.MakeDirectory(ctx, connect.NewRequest(&guestv1.MakeDirectoryRequest{Path: "/x/y/z", Parents: true, Mode: 0o700}))
	if err != nil || !r.Msg.Created || r.Msg.Directory.GetMode() != 0o700 {
		t.Errorf("mkdir -p /x/y/z: %v %v", r, err)
	}
	if fi, err := os.Stat(root + "/x/y"); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("parent /x/y: %v %v", fi.Mode(), err)
	}
	r, err = c.MakeDirectory(ctx, connect.NewRequest(&guestv1.MakeDirectoryRequest{Path: "/x/y/z", Parents: true}))
	if err != nil || r.Msg.Created {
		t.Errorf("mkdir -p existing: %v %v", r, err)
	}
	writeHost(t, root+"/f", "")
	_, err = c.MakeDirectory(ctx, connect.NewRequest(&guestv1.MakeDirectoryRequest{Path: "/f", Parents: true}))
	wantCode(t, "mkdir -p over a file", err, connect.CodeAlreadyExists)
	_, err = c.MakeDirectory(ctx, connect.NewRequest(&guestv1.MakeDirectoryRequest{Path: "/f/g", Parents: true}))
	wantCode(t, "mkdir -p under a file", err, connect.CodeFailedPrecondition)
	_, err = c.MakeDirectory(ctx, connect.NewRequest(&guestv1.MakeDirectoryRequest{Path: "/m", Mode: 0o10000}))
	wantCode(t, "mode 010000", err, connect.CodeInvalidArgument)
	if os.Geteuid() == 0 {
		uid, gid := uint32(1234), uint32(5678)
		r, err = c.MakeDirectory(ctx, connect.NewRequest(&guestv1.MakeDirectoryRequest{Path: "/o/p", Parents: true, Uid: &uid, Gid: &gid}))
		if err != nil || r.Msg.Directory.GetUid() != uid || r.Msg.Directory.GetGid() != gid {
			t.Errorf("mkdir owned: %v %v", r, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(root+"/o", &st); err != nil || st.Uid != uid || st.Gid != gid {
			t.Errorf("parent owned: %+v %v", st, err)
		}
	}
}

func TestMoveFile(t *testing.T) {
	c, _, root := startFiles(t)
	ctx := testCtx(t)
	writeHost(t, root+"/a", "A")
	writeHost(t, root+"/b", "B")
	writeHost(t, root+"/t", "T")
	if err := os.Symlink(root+"/t", root+"/l"); err != nil {
		t.Fatal(err)
	}
	move := func(src, dst string, over bool) error {
		_, err := c.MoveFile(ctx, connect.NewRequest(&guestv1.MoveFileRequest{Source: src, Destination: dst, Overwrite: over}))
		return err
	}
	wantCode(t, "move onto existing", move("/a", "/b", false), connect.CodeAlreadyExists)
	if b, _ := os.ReadFile(root + "/b"); string(b) != "B" {
		t.Errorf("b: %q", b)
	}
	if err := move("/a", "/b", true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(root + "/b"); string(b) != "A" {
		t.Errorf("b: %q", b)
	}
	wantCode(t, "move missing", move("/a", "/c", false), connect.CodeNotFound)
	// A symbolic link is moved, not what it points to.
	r, err := c.MoveFile(ctx, connect.NewRequest(&guestv1.MoveFileRequest{Source: "/l", Destination: "/l2"}))
	if err != nil || r.Msg.File.GetType() != guestv1.FileType_FILE_TYPE_SYMLINK || r.Msg.File.GetPath() != "/l2" {
		t.Errorf("move link: %v %v", r, err)
	}
	if b, _ := os.ReadFile(root + "/t"); string(b) != "T" {
		t.Errorf("t: %q", b)
	}
	wantCode(t, "move /", move("/", "/z", false), connect.CodeInvalidArgument)
	wantCode(t, "move to bad", move("/b", "/z/", false), connect.CodeInvalidArgument)
	if err := os.MkdirAll(root+"/d/e", 0o755); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "move into itself", move("/d", "/d/e/f", false), connect.CodeInvalidArgument)
	if err := os.MkdirAll(root+"/full/x", 0o755); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "move over a non-empty directory", move("/d", "/full", true), connect.CodeFailedPrecondition)
}

func TestRemoveFile(t *testing.T) {
	c, _, root := startFiles(t)
	ctx := testCtx(t)
	writeHost(t, root+"/kept/canary", "canary")
	writeHost(t, root+"/d/e/f", "")
	writeHost(t, root+"/g", "")
	if err := os.Symlink(root+"/kept", root+"/d/link"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(root+"/kept", root+"/toplink"); err != nil {
		t.Fatal(err)
	}
	remove := func(p string, rec bool) (bool, error) {
		r, err := c.RemoveFile(ctx, connect.NewRequest(&guestv1.RemoveFileRequest{Path: p, Recursive: rec}))
		if err != nil {
			return false, err
		}
		return r.Msg.GetExisted(), nil
	}
	_, err := remove("/", true)
	wantCode(t, "remove /", err, connect.CodeInvalidArgument)
	if ex, err := remove("/nothing", false); ex || err != nil {
		t.Errorf("remove nothing: %v %v", ex, err)
	}
	_, err = remove("/d", false)
	wantCode(t, "remove non-empty", err, connect.CodeFailedPrecondition)
	if ex, err := remove("/toplink", true); !ex || err != nil {
		t.Errorf("remove link: %v %v", ex, err)
	}
	if ex, err := remove("/d", true); !ex || err != nil {
		t.Errorf("remove -r: %v %v", ex, err)
	}
	if ex, err := remove("/g", false); !ex || err != nil {
		t.Errorf("remove file: %v %v", ex, err)
	}
	if b, err := os.ReadFile(root + "/kept/canary"); string(b) != "canary" {
		t.Errorf("through links: %q %v", b, err)
	}
	for _, p := range []string{"/d", "/g", "/toplink"} {
		if _, err := os.Lstat(root + p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func readFileAll(t *testing.T, c guestv1connect.FileServiceClient, req *guestv1.ReadFileRequest) (*guestv1.FileInfo, []byte, error) {
	t.Helper()
	s, err := c.ReadFile(testCtx(t), connect.NewRequest(req))
	if err != nil {
		return nil, nil, err
	}
	defer s.Close()
	var fi *guestv1.FileInfo
	var data []byte
	first := true
	for s.Receive() {
		m := s.Msg()
		if first {
			if m.File == nil || len(m.Data) != 0 {
				t.Errorf("first message: %v", m)
			}
			fi, first = m.File, false
			continue
		}
		if m.File != nil || len(m.Data) == 0 || len(m.Data) > ReadChunkBytes || m.Offset != req.Offset+uint64(len(data)) {
			t.Errorf("chunk at %d: offset %d, %d bytes", len(data), m.Offset, len(m.Data))
		}
		data = append(data, m.Data...)
	}
	return fi, data, s.Err()
}

func TestReadFile(t *testing.T) {
	c, _, root := startFiles(t)
	content := bytes.Repeat([]byte("0123456789abcdef"), 40000) // 640000 bytes
	writeHost(t, root+"/f", string(content))
	fi, data, err := readFileAll(t, c, &guestv1.ReadFileRequest{Path: "/f"})
	if err != nil || !bytes.Equal(data, content) || fi.GetSize() != uint64(len(content)) || fi.GetPath() != "/f" {
		t.Errorf("read /f: %d bytes, %v, %v", len(data), fi, err)
	}
	_, data, err = readFileAll(t, c, &guestv1.ReadFileRequest{Path: "/f", Offset: 300000, Length: 262150})
	if err != nil || !bytes.Equal(data, content[300000:300000+262150]) {
		t.Errorf("read range: %d bytes, %v", len(data), err)
	}
	_, data, err = readFileAll(t, c, &guestv1.ReadFileRequest{Path: "/f", Offset: 1 << 40})
	if err != nil || len(data) != 0 {
		t.Errorf("read past the end: %d bytes, %v", len(data), err)
	}
	if err := os.Mkdir(root+"/d", 0o755); err != nil {
		t.Fatal(err)
	}
	_, _, err = readFileAll(t, c, &guestv1.ReadFileRequest{Path: "/d"})
	wantCode(t, "read a directory", err, connect.CodeFailedPrecondition)
	_, _, err = readFileAll(t, c, &guestv1.ReadFileRequest{Path: "/nothing"})
	wantCode(t, "read nothing", err, connect.CodeNotFound)
	if err := unix.Mkfifo(root+"/fifo", 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = readFileAll(t, c, &guestv1.ReadFileRequest{Path: "/fifo"})
	wantCode(t, "read a fifo", err, connect.CodeFailedPrecondition)
}

// temps lists the temporary files of writes under dir.
func temps(t *testing.T, dir string) []string {
	t.Helper()
	var found []string
	_ = filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error {
		if strings.Contains(filepath.Base(p), ".kibotos-") {
			found = append(found, p)
		}
		return nil
	})
	return found
}

func writeStream(ctx context.Context, c guestv1connect.FileServiceClient, h *guestv1.WriteFileHeader, chunks ...[]byte) (*guestv1.FileInfo, error) {
	s := c.WriteFile(ctx)
	if h != nil {
		if err := s.Send(&guestv1.WriteFileRequest{Part: &guestv1.WriteFileRequest_Header{Header: h}}); err != nil {
			r, err := s.CloseAndReceive()
			return r.Msg.GetFile(), err
		}
	}
	for _, b := range chunks {
		if err := s.Send(&guestv1.WriteFileRequest{Part: &guestv1.WriteFileRequest_Data{Data: b}}); err != nil {
			break
		}
	}
	r, err := s.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return r.Msg.GetFile(), nil
}

func TestWriteFile(t *testing.T) {
	c, _, root := startFiles(t)
	ctx := testCtx(t)
	writeHost(t, root+"/f", "previous")
	big := bytes.Repeat([]byte("x"), 300<<10)
	fi, err := writeStream(ctx, c, &guestv1.WriteFileHeader{Path: "/f", Mode: 0o640}, []byte("new "), big)
	if err != nil || fi.GetSize() != uint64(4+len(big)) || fi.GetMode() != 0o640 || fi.GetPath() != "/f" {
		t.Fatalf("write /f: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(root + "/f"); !bytes.Equal(b, append([]byte("new "), big...)) {
		t.Errorf("/f: %d bytes", len(b))
	}
	fi, err = writeStream(ctx, c, &guestv1.WriteFileHeader{Path: "/new/dir/g", MakeParents: true}, []byte("g"))
	if err != nil || fi.GetMode() != 0o644 {
		t.Errorf("write with parents: %v %v", fi, err)
	}
	_, err = writeStream(ctx, c, &guestv1.WriteFileHeader{Path: "/absent/g"}, []byte("g"))
	wantCode(t, "write without parents", err, connect.CodeNotFound)
	_, err = writeStream(ctx, c, nil, []byte("data first"))
	wantCode(t, "data first", err, connect.CodeInvalidArgument)
	_, err = writeStream(ctx, c, &guestv1.WriteFileHeader{Path: "/new"}, []byte("over a directory"))
	wantCode(t, "write over a directory", err, connect.CodeFailedPrecondition)
	_, err = writeStream(ctx, c, &guestv1.WriteFileHeader{Path: "/"})
	wantCode(t, "write /", err, connect.CodeInvalidArgument)
	_, err = writeStream(ctx, c, &guestv1.WriteFileHeader{Path: "f"})
	wantCode(t, "relative", err, connect.CodeInvalidArgument)

	// A client that goes away mid-stream leaves the file as it was.
	writeHost(t, root+"/f", "previous")
	cctx, cancel := context.WithCancel(ctx)
	s := c.WriteFile(cctx)
	_ = s.Send(&guestv1.WriteFileRequest{Part: &guestv1.WriteFileRequest_Header{Header: &guestv1.WriteFileHeader{Path: "/f"}}})
	_ = s.Send(&guestv1.WriteFileRequest{Part: &guestv1.WriteFileRequest_Data{Data: big}})
	deadline := time.Now().Add(10 * time.Second)
	for len(temps(t, root)) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	_, err = s.CloseAndReceive()
	wantCode(t, "canceled", err, connect.CodeCanceled)
	for len(temps(t, root)) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if b, _ := os.ReadFile(root + "/f"); string(b) != "previous" {
		t.Errorf("after cancel: %d bytes", len(b))
	}
	if tt := temps(t, root); len(tt) != 0 {
		t.Errorf("temporary files left: %v", tt)
	}

	if os.Geteuid() == 0 {
		uid, gid := uint32(4321), uint32(8765)
		fi, err := writeStream(ctx, c, &guestv1.WriteFileHeader{Path: "/owned", Uid: &uid, Gid: &gid}, []byte("o"))
		if err != nil || fi.GetUid() != uid || fi.GetGid() != gid {
			t.Errorf("write owned: %v %v", fi, err)
		}
	}
}

// TestWriteFileFull: a write that does not fit fails with
// resource_exhausted and leaves the previous file and no temporary file.
func TestWriteFileFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	c, _, root := startFiles(t)
	ctx := testCtx(t)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", root).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
	writeHost(t, root+"/f", "previous")
	chunk := bytes.Repeat([]byte("y"), 256<<10)
	_, err := writeStream(ctx, c, &guestv1.WriteFileHeader{Path: "/f"}, chunk, chunk, chunk, chunk, chunk, chunk)
	wantCode(t, "write 1.5 MiB to 1 MiB", err, connect.CodeResourceExhausted)
	if b, _ := os.ReadFile(root + "/f"); string(b) != "previous" {
		t.Errorf("after ENOSPC: %d bytes", len(b))
	}
	if tt := temps(t, root); len(tt) != 0 {
		t.Errorf("temporary files left: %v", tt)
	}
}

func TestWriteFileChunk(t *testing.T) {
	c, s, root := startFiles(t)
	ctx := testCtx(t)
	writeHost(t, root+"/f", "previous")
	chunk := func(id string, h *guestv1.WriteFileHeader, off uint64, data string, commit bool) (*guestv1.WriteFileChunkResponse, error) {
		r, err := c.WriteFileChunk(ctx, connect.NewRequest(&guestv1.WriteFileChunkRequest{UploadId: id, Header: h, Offset: off, Data: []byte(data), Commit: commit}))
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}
	h := &guestv1.WriteFileHeader{Path: "/f", Mode: 0o600}
	if r, err := chunk("u1", h, 0, "hello ", false); err != nil || r.WrittenBytes != 6 {
		t.Fatalf("chunk 1: %v %v", r, err)
	}
	if r, err := chunk("u1", nil, 3, "lo world", false); err != nil || r.WrittenBytes != 11 {
		t.Errorf("resend: %v %v", r, err)
	}
	if r, err := chunk("u1", nil, 0, "hel", false); err != nil || r.WrittenBytes != 11 {
		t.Errorf("resend all written: %v %v", r, err)
	}
	_, err := chunk("u1", nil, 20, "gap", false)
	wantCode(t, "past the end", err, connect.CodeOutOfRange)
	if err == nil || !strings.Contains(err.Error(), "11 bytes") {
		t.Errorf("past the end names the size: %v", err)
	}
	_, err = chunk("u1", &guestv1.WriteFileHeader{Path: "/other"}, 11, "", false)
	wantCode(t, "another path", err, connect.CodeInvalidArgument)
	if b, _ := os.ReadFile(root + "/f"); string(b) != "previous" {
		t.Errorf("before commit: %q", b)
	}
	r, err := chunk("u1", nil, 11, "!", true)
	if err != nil || r.WrittenBytes != 12 || r.File.GetSize() != 12 || r.File.GetMode() != 0o600 {
		t.Fatalf("commit: %v %v", r, err)
	}
	if b, _ := os.ReadFile(root + "/f"); string(b) != "hello world!" {
		t.Errorf("after commit: %q", b)
	}
	_, err = chunk("u1", nil, 12, "more", false)
	wantCode(t, "after commit", err, connect.CodeNotFound)
	if r, err := chunk("one", &guestv1.WriteFileHeader{Path: "/g"}, 0, "g", true); err != nil || r.File.GetSize() != 1 {
		t.Errorf("one-chunk upload: %v %v", r, err)
	}
	_, err = chunk("bad id", h, 0, "", false)
	wantCode(t, "bad id", err, connect.CodeInvalidArgument)
	_, err = chunk("nohdr", nil, 0, "", false)
	wantCode(t, "no header", err, connect.CodeInvalidArgument)

	// At most MaxUploads at once.
	for i := range MaxUploads {
		if _, err := chunk(fmt.Sprint("many-", i), &guestv1.WriteFileHeader{Path: fmt.Sprint("/m", i)}, 0, "x", false); err != nil {
			t.Fatal(err)
		}
	}
	_, err = chunk("one-more", &guestv1.WriteFileHeader{Path: "/m"}, 0, "x", false)
	wantCode(t, "one upload too many", err, connect.CodeResourceExhausted)
	if n := len(temps(t, root)); n != MaxUploads {
		t.Errorf("%d temporary files, want %d", n, MaxUploads)
	}

	// An idle upload is discarded with its temporary file.
	s.uploads.mu.Lock()
	s.uploads.idle = 50 * time.Millisecond
	s.uploads.mu.Unlock()
	for i := range MaxUploads {
		s.uploads.mu.Lock()
		u := s.uploads.byID[fmt.Sprint("many-", i)]
		s.uploads.mu.Unlock()
		u.timer.Reset(time.Millisecond)
	}
	if _, err := chunk("idle", &guestv1.WriteFileHeader{Path: "/i"}, 0, "x", false); err != nil {
		// The timers may not have fired yet.
		time.Sleep(200 * time.Millisecond)
		if _, err := chunk("idle", &guestv1.WriteFileHeader{Path: "/i"}, 0, "x", false); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if tt := temps(t, root); len(tt) != 0 {
		t.Errorf("temporary files left: %v", tt)
	}
	_, err = chunk("idle", nil, 1, "y", false)
	wantCode(t, "idle upload", err, connect.CodeNotFound)
}

func TestWatchDirectory(t *testing.T) {
	c, _, root := startFiles(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	if err := os.MkdirAll(root+"/w/pre", 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := c.WatchDirectory(ctx, connect.NewRequest(&guestv1.WatchDirectoryRequest{Path: "/w", Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.ResponseHeader() // the watch is in place once the headers came
	events := make(chan string, 100)
	go func() {
		for s.Receive() {
			m := s.Msg()
			events <- fmt.Sprintf("%s %s %v", m.Path, strings.TrimPrefix(m.Change.String(), "FILE_CHANGE_"), m.Overflowed)
		}
		close(events)
	}()
	expect := func(want string) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case e, ok := <-events:
				if !ok {
					t.Fatalf("stream ended waiting for %q: %v", want, s.Err())
				}
				if e == want {
					return
				}
			case <-timeout:
				t.Fatalf("no %q", want)
			}
		}
	}
	writeHost(t, root+"/w/a", "a")
	expect("/w/a CREATED false")
	expect("/w/a WRITTEN false")
	writeHost(t, root+"/w/pre/b", "b")
	expect("/w/pre/b CREATED false")
	if err := os.MkdirAll(root+"/w/new/deep", 0o755); err != nil {
		t.Fatal(err)
	}
	expect("/w/new CREATED false")
	time.Sleep(50 * time.Millisecond)
	writeHost(t, root+"/w/new/deep/c", "c")
	expect("/w/new/deep/c WRITTEN false")
	if err := os.Rename(root+"/w/new", root+"/w/moved"); err != nil {
		t.Fatal(err)
	}
	expect("/w/new REMOVED false")
	expect("/w/moved CREATED false")
	writeHost(t, root+"/w/moved/deep/d", "d")
	expect("/w/moved/deep/d CREATED false")
	if err := os.Chmod(root+"/w/a", 0o600); err != nil {
		t.Fatal(err)
	}
	expect("/w/a ATTRIBUTES false")
	if err := os.Remove(root + "/w/a"); err != nil {
		t.Fatal(err)
	}
	expect("/w/a REMOVED false")
	cancel()
	for range events {
	}

	_, err = c.WatchDirectory(testCtx(t), connect.NewRequest(&guestv1.WatchDirectoryRequest{Path: "/nothing"}))
	if err == nil {
		s, _ := c.WatchDirectory(testCtx(t), connect.NewRequest(&guestv1.WatchDirectoryRequest{Path: "/nothing"}))
		s.Receive()
		err = s.Err()
	}
	wantCode(t, "watch nothing", err, connect.CodeNotFound)
}

// TestWatchEvents: the inotify events the kernel rarely sends (a queue
// overflow, the watched directory gone) are told to the client.
func TestWatchEvents(t *testing.T) {
	var sent []*guestv1.WatchDirectoryResponse
	w := &watcher{s: newFileService(t.TempDir()), dirs: map[int32]string{1: "/w", 2: "/w/sub"}, fd: -1,
		send: func(m *guestv1.WatchDirectoryResponse) error { sent = append(sent, m); return nil }}
	if done, err := w.event(&unix.InotifyEvent{Wd: -1, Mask: unix.IN_Q_OVERFLOW}, "", "/w"); done || err != nil || len(sent) != 1 || !sent[0].Overflowed {
		t.Errorf("overflow: %v %v %v", done, err, sent)
	}
	if done, _ := w.event(&unix.InotifyEvent{Wd: 2, Mask: unix.IN_DELETE_SELF}, "", "/w"); done {
		t.Error("a subdirectory gone ends the watch")
	}
	if done, _ := w.event(&unix.InotifyEvent{Wd: 1, Mask: unix.IN_DELETE_SELF}, "", "/w"); !done || sent[len(sent)-1].Path != "/w" || sent[len(sent)-1].Change != guestv1.FileChange_FILE_CHANGE_REMOVED {
		t.Errorf("the directory gone: %v %v", done, sent)
	}
}
