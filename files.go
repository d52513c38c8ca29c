package kibotos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
)

// DefaultFilesSessionTTL is the lifetime of the data-plane session (scope
// FILESYSTEM) an FS creates when WithFilesSessionTTL is not given. The
// session is renewed when it expires; a WriteFile renews it first when
// less than half of it is left, since a write cannot be resent once its
// bytes were read (unless its reader is an io.Seeker).
const DefaultFilesSessionTTL = 10 * time.Minute

// FileChunkSize is the largest chunk of bytes WriteFile sends in one
// message: the size the server advises, half its bound on a message
// (512 KiB, the chunk and its framing). WriteFile holds one such buffer,
// never the whole file.
const FileChunkSize = 256 << 10

// MaxDirectoryEntries is the most entries ReadDir returns for one
// directory (one ListDirectory); a larger directory is reported with
// ErrDirectoryTruncated.
const MaxDirectoryEntries = 10000

// ErrDirectoryTruncated reports that a directory has more entries than
// ReadDir returns (MaxDirectoryEntries); the entries read come with it.
var ErrDirectoryTruncated = errors.New("the directory has more entries than one listing returns")

// fileReconnects is how many times in a row a file being read opens
// ReadFile again, from where it was, after a failure of the transport.
const fileReconnects = 3

// FS is the file system of a Workspace through the public data plane
// (FileService): an io/fs.FS (with fs.StatFS, fs.ReadDirFS, fs.ReadFileFS
// and fs.ReadLinkFS) for reading, and WriteFile, Mkdir, MkdirAll, Remove,
// RemoveAll, Rename and Watch for the rest. Make one with Workspace.Files.
//
// Names follow io/fs: unrooted, slash-separated, without "." or ".."
// elements ("etc/hosts"; "." is the root), checked with fs.ValidPath; the
// name "a/b" is the Workspace's "/a/b". The guest resolves them as a
// process of the Workspace would, symbolic links included; nothing outside
// the Workspace can be named.
//
// Every error is an *fs.PathError. Its Err matches fs.ErrNotExist,
// fs.ErrExist or fs.ErrPermission with errors.Is when the server said so
// of the file (not of the Workspace or the token), fs.ErrInvalid for a
// name that is not valid, and holds the server's *connect.Error (Detail,
// Reason and connect.CodeOf apply) or a *MissingCapabilityError.
//
// The capability workspace.filesystem is checked before the first request
// of each call (nothing is sent when the server does not offer it). Calls
// are not resent after a failure, except the ReadFile stream of an open
// file, which resumes from where it was (after a renewal of the session
// too). An FS is safe for concurrent use; the files it opens are not.
type FS struct {
	ctx context.Context
	st  *fsState
}

// fsState is what the FS values of one Workspace.Files share.
type fsState struct {
	ws    *Workspace
	files ctrlv1connect.FileServiceClient
	token string
	ttl   time.Duration

	startMu sync.Mutex // held while the session is created
	started bool
	sess    dataSession
}

// FilesOption configures Workspace.Files.
type FilesOption func(*fsState)

// WithFilesToken makes the FS send token (a data-plane token with the
// FILESYSTEM scope, from SessionService) instead of creating a session. It
// is never renewed.
func WithFilesToken(token string) FilesOption {
	return func(s *fsState) { s.token = token }
}

// WithFilesSessionTTL sets the lifetime of the session the FS creates,
// from 10s to 24h; the default is DefaultFilesSessionTTL.
func WithFilesSessionTTL(d time.Duration) FilesOption {
	return func(s *fsState) { s.ttl = d }
}

// Files returns the file system of the Workspace. ctx bounds the calls of
// the io/fs methods (Open, Stat, ReadDir, ReadFile, ReadLink, Lstat, and
// the reads of the files opened), which take no context; the other methods
// take their own. Nothing is sent until the first call.
func (w *Workspace) Files(ctx context.Context, opts ...FilesOption) *FS {
	st := &fsState{ws: w, files: w.c.FileService, ttl: DefaultFilesSessionTTL}
	for _, o := range opts {
		o(st)
	}
	st.sess = dataSession{ws: w, scope: ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM, ttl: st.ttl}
	if ctx == nil {
		ctx = context.Background()
	}
	return &FS{ctx: ctx, st: st}
}

// WithContext returns an FS whose io/fs methods are bounded by ctx. It
// shares f's session.
func (f *FS) WithContext(ctx context.Context) *FS {
	return &FS{ctx: ctx, st: f.st}
}

// begin checks the capabilities of a request of proc (workspace.filesystem
// and what capability.Procedures says), then creates the session the first
// time.
func (st *fsState) begin(ctx context.Context, proc string, req proto.Message) error {
	cl := st.ws.c
	info, err := cl.serverInfo(ctx, cl.retry)
	if err != nil {
		return err
	}
	if !HasCapability(info, capability.WorkspaceFilesystem) {
		return &MissingCapabilityError{Procedure: proc, Capability: capability.WorkspaceFilesystem}
	}
	if err := MissingRequestCapability(info, proc, req); err != nil {
		return err
	}
	st.startMu.Lock()
	defer st.startMu.Unlock()
	if st.started {
		return nil
	}
	if err := st.sess.start(ctx, info, st.token); err != nil {
		return err
	}
	st.started = true
	return nil
}

// unary sends a request of proc with the session's token, again after the
// session was renewed (by this call or a concurrent one) when it expired.
func unary[Req, Res any](ctx context.Context, st *fsState, proc string, req *Req,
	send func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) (*Res, error) {
	if err := st.begin(ctx, proc, any(req).(proto.Message)); err != nil {
		return nil, err
	}
	res, err := callAuth(ctx, &st.sess, req, send)
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// abs is the Workspace's path of the fs name, which must be valid.
func abs(name string) string {
	if name == "." {
		return "/"
	}
	return "/" + name
}

// fileError is an error of the server that errors.Is also matches with
// one of the fs errors.
type fileError struct {
	kind error
	err  error
}

func (e *fileError) Error() string   { return e.err.Error() }
func (e *fileError) Unwrap() []error { return []error{e.kind, e.err} }

// pathErr wraps err, the failure of op on name, in an *fs.PathError.
func pathErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	if pe, ok := errors.AsType[*fs.PathError](err); ok && pe.Path == name {
		return err
	}
	if kind := fsKind(err); kind != nil {
		err = &fileError{kind: kind, err: err}
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}

// fsKind is the fs error that err, an answer of the data plane, is: only
// of the file, not of the Workspace or the token, whose refusals carry an
// ErrorDetail of ctrl with their own reason.
func fsKind(err error) error {
	ce, ok := errors.AsType[*connect.Error](err)
	if !ok {
		return nil
	}
	switch Reason(err) {
	case ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT,
		ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT:
	default:
		return nil // the token, the Workspace's state, a capacity, ...
	}
	switch ce.Code() {
	case connect.CodeNotFound:
		if d, ok := Detail(err); ok && strings.HasPrefix(d.GetMessage(), "workspace ") {
			return nil // the Workspace, not the file
		}
		return fs.ErrNotExist
	case connect.CodeAlreadyExists:
		return fs.ErrExist
	case connect.CodePermissionDenied:
		return fs.ErrPermission
	}
	return nil
}

// validName checks name for op: an *fs.PathError with fs.ErrInvalid when
// it is not valid.
func validName(op, name string) error {
	if !fs.ValidPath(name) {
		return &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return nil
}

// fileInfo is an fs.FileInfo of a FileInfo of the server.
type fileInfo struct {
	name string
	m    *ctrlv1.FileInfo
}

func (i *fileInfo) Name() string       { return i.name }
func (i *fileInfo) Size() int64        { return int64(i.m.GetSize()) }
func (i *fileInfo) Mode() fs.FileMode  { return fileMode(i.m) }
func (i *fileInfo) IsDir() bool        { return i.m.GetType() == ctrlv1.FileType_FILE_TYPE_DIRECTORY }
func (i *fileInfo) Sys() any           { return i.m }
func (i *fileInfo) String() string     { return fs.FormatFileInfo(i) }
func (i *fileInfo) ModTime() time.Time { return modTime(i.m) }

func modTime(m *ctrlv1.FileInfo) time.Time {
	if m.GetModifyTime() == nil {
		return time.Time{}
	}
	return m.GetModifyTime().AsTime()
}

// newInfo is the fs.FileInfo of m, named name (the base of its path, "."
// for the root).
func newInfo(name string, m *ctrlv1.FileInfo) *fileInfo {
	return &fileInfo{name: path.Base(name), m: m}
}

// fileMode is the fs.FileMode of m: its permission bits, setuid, setgid,
// sticky, and its type (ModeIrregular for a device, FIFO or socket).
func fileMode(m *ctrlv1.FileInfo) fs.FileMode {
	u := m.GetMode()
	mode := fs.FileMode(u & 0o777)
	if u&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if u&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if u&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	switch m.GetType() {
	case ctrlv1.FileType_FILE_TYPE_DIRECTORY:
		mode |= fs.ModeDir
	case ctrlv1.FileType_FILE_TYPE_SYMLINK:
		mode |= fs.ModeSymlink
	case ctrlv1.FileType_FILE_TYPE_OTHER:
		mode |= fs.ModeIrregular
	}
	return mode
}

// unixMode is the permission bits (07777) of mode.
func unixMode(mode fs.FileMode) uint32 {
	u := uint32(mode.Perm())
	if mode&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if mode&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if mode&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// stat is StatFile of name.
func (f *FS) stat(ctx context.Context, op, name string, follow bool) (*fileInfo, error) {
	if err := validName(op, name); err != nil {
		return nil, err
	}
	req := &ctrlv1.StatFileRequest{WorkspaceId: f.st.ws.id, Path: abs(name), FollowSymlinks: follow}
	res, err := unary(ctx, f.st, ctrlv1connect.FileServiceStatFileProcedure, req, f.st.files.StatFile)
	if err != nil {
		return nil, pathErr(op, name, err)
	}
	return newInfo(name, res.GetFile()), nil
}

// Stat describes the file name, following a final symbolic link
// (StatFile). Its Sys is the server's *ctrlv1.FileInfo (owner, symbolic
// link target).
func (f *FS) Stat(name string) (fs.FileInfo, error) {
	return f.stat(f.ctx, "stat", name, true)
}

// Lstat describes the file name; a final symbolic link is described
// itself.
func (f *FS) Lstat(name string) (fs.FileInfo, error) {
	return f.stat(f.ctx, "lstat", name, false)
}

// ReadLink returns the target of the symbolic link name, as written.
func (f *FS) ReadLink(name string) (string, error) {
	info, err := f.stat(f.ctx, "readlink", name, false)
	if err != nil {
		return "", err
	}
	if info.m.GetType() != ctrlv1.FileType_FILE_TYPE_SYMLINK {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrInvalid}
	}
	return info.m.GetSymlinkTarget(), nil
}

// ReadDir lists the directory name (ListDirectory), sorted by name. A
// directory of more than MaxDirectoryEntries entries returns the first of
// them and an error that matches ErrDirectoryTruncated. Entries describe
// the files themselves (a symbolic link is a symbolic link); Info needs no
// further request.
func (f *FS) ReadDir(name string) ([]fs.DirEntry, error) {
	return f.readDir(f.ctx, name)
}

func (f *FS) readDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	const op = "readdir"
	if err := validName(op, name); err != nil {
		return nil, err
	}
	dir := abs(name)
	req := &ctrlv1.ListDirectoryRequest{WorkspaceId: f.st.ws.id, Path: dir, Depth: 1, Limit: MaxDirectoryEntries}
	res, err := unary(ctx, f.st, ctrlv1connect.FileServiceListDirectoryProcedure, req, f.st.files.ListDirectory)
	if err != nil {
		return nil, pathErr(op, name, err)
	}
	out := make([]fs.DirEntry, 0, len(res.GetEntries()))
	for _, e := range res.GetEntries() {
		// What the Workspace sends is checked: an entry is one element
		// directly under dir, so that a caller that joins its name to a
		// local directory stays in that directory.
		p := e.GetPath()
		base := path.Base(p)
		if path.Dir(p) != dir || !fs.ValidPath(base) || base == "." || strings.Contains(base, "/") {
			return nil, &fs.PathError{Op: op, Path: name, Err: fmt.Errorf("the server listed %q, which is not an entry of %s", p, dir)}
		}
		out = append(out, fs.FileInfoToDirEntry(newInfo(base, e)))
	}
	slices.SortFunc(out, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	if res.GetTruncated() {
		return out, &fs.PathError{Op: op, Path: name, Err: ErrDirectoryTruncated}
	}
	return out, nil
}

// Open opens the file name for reading: one StatFile (following a final
// symbolic link). A regular file's bytes are read with ReadFile, lazily,
// from the first Read on; it is also an io.Seeker and an io.ReaderAt. A
// directory is an fs.ReadDirFile. Close ends the stream being read.
func (f *FS) Open(name string) (fs.File, error) {
	info, err := f.stat(f.ctx, "open", name, true)
	if err != nil {
		return nil, err
	}
	if info.IsDir() {
		return &dirFile{fsys: f, name: name, info: info}, nil
	}
	return &file{fsys: f, name: name, info: info}, nil
}

// ReadFile reads the whole file name (one ReadFile stream, no StatFile).
func (f *FS) ReadFile(name string) ([]byte, error) {
	if err := validName("read", name); err != nil {
		return nil, err
	}
	fl := &file{fsys: f, name: name}
	defer fl.Close()
	if err := fl.fill(); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	var b bytes.Buffer
	if fl.info != nil {
		b.Grow(int(min(fl.info.Size(), 1<<30)) + 1)
	}
	if _, err := b.ReadFrom(fl); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// file is a regular file (or another file that is not a directory) opened
// for reading.
type file struct {
	fsys *FS
	name string
	info *fileInfo // from Open, or the first message of ReadFile

	off     int64 // the offset of pending's first byte
	pending []byte
	eof     bool
	closed  bool

	stream   *connect.ServerStreamForClient[ctrlv1.ReadFileResponse]
	token    string // the token stream was opened with
	cancel   context.CancelFunc
	failures int
}

func (fl *file) Stat() (fs.FileInfo, error) {
	if fl.info == nil {
		return fl.fsys.Stat(fl.name)
	}
	return fl.info, nil
}

func (fl *file) Read(p []byte) (int, error) {
	if fl.closed {
		return 0, &fs.PathError{Op: "read", Path: fl.name, Err: fs.ErrClosed}
	}
	if len(p) == 0 {
		return 0, nil
	}
	for len(fl.pending) == 0 {
		if fl.eof {
			return 0, io.EOF
		}
		if err := fl.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, fl.pending)
	fl.pending = fl.pending[n:]
	fl.off += int64(n)
	return n, nil
}

// fill receives the next message of the ReadFile stream, opening it at
// off when none is open; it sets eof at the stream's end.
func (fl *file) fill() error {
	st := fl.fsys.st
	for {
		if fl.stream == nil {
			ctx, cancel := context.WithCancel(fl.fsys.ctx)
			req := &ctrlv1.ReadFileRequest{WorkspaceId: st.ws.id, Path: abs(fl.name), Offset: uint64(fl.off)}
			if err := st.begin(ctx, ctrlv1connect.FileServiceReadFileProcedure, req); err != nil {
				cancel()
				return pathErr("read", fl.name, err)
			}
			tok := st.sess.current()
			s, err := st.files.ReadFile(ctx, tokenReq(req, tok))
			if err != nil {
				cancel()
				if st.sess.renewAfter(fl.fsys.ctx, err, tok) {
					continue
				}
				return pathErr("read", fl.name, err)
			}
			fl.stream, fl.token, fl.cancel = s, tok, cancel
		}
		if fl.stream.Receive() {
			fl.failures = 0
			m := fl.stream.Msg()
			if m.GetFile() != nil && fl.info == nil {
				fl.info = newInfo(fl.name, m.GetFile())
			}
			data, at := m.GetData(), int64(m.GetOffset())
			if len(data) == 0 {
				continue
			}
			if at > fl.off {
				fl.stop()
				return &fs.PathError{Op: "read", Path: fl.name, Err: fmt.Errorf("the server skipped from offset %d to %d", fl.off, at)}
			}
			if end := at + int64(len(data)); end <= fl.off {
				continue // already read
			}
			fl.pending = data[fl.off-at:]
			return nil
		}
		err := fl.stream.Err()
		used := fl.token
		fl.stop()
		if err == nil {
			fl.eof = true
			return nil
		}
		if st.sess.renewAfter(fl.fsys.ctx, err, used) {
			continue // from off, with a new session
		}
		if fl.fsys.ctx.Err() == nil && reconnectable(err) && fl.failures < fileReconnects && fl.info != nil {
			fl.failures++
			select {
			case <-fl.fsys.ctx.Done():
			case <-time.After(time.Duration(fl.failures) * 100 * time.Millisecond):
			}
			continue
		}
		return pathErr("read", fl.name, err)
	}
}

// stop ends the stream being read.
func (fl *file) stop() {
	if fl.stream != nil {
		fl.cancel()
		_ = fl.stream.Close()
		fl.stream, fl.cancel = nil, nil
	}
}

// Seek sets the offset of the next Read; io.SeekEnd is relative to the
// size Open saw. A new offset ends the stream being read; the next Read
// opens another there.
func (fl *file) Seek(offset int64, whence int) (int64, error) {
	if fl.closed {
		return 0, &fs.PathError{Op: "seek", Path: fl.name, Err: fs.ErrClosed}
	}
	var to int64
	switch whence {
	case io.SeekStart:
		to = offset
	case io.SeekCurrent:
		to = fl.off + offset
	case io.SeekEnd:
		if fl.info == nil {
			return 0, &fs.PathError{Op: "seek", Path: fl.name, Err: errors.New("size unknown")}
		}
		to = fl.info.Size() + offset
	default:
		return 0, &fs.PathError{Op: "seek", Path: fl.name, Err: fs.ErrInvalid}
	}
	if to < 0 {
		return 0, &fs.PathError{Op: "seek", Path: fl.name, Err: fs.ErrInvalid}
	}
	if to != fl.off {
		fl.stop()
		fl.off, fl.pending, fl.eof = to, nil, false
	}
	return to, nil
}

// ReadAt reads len(p) bytes at off with a ReadFile of its own; it does not
// move the offset of Read.
func (fl *file) ReadAt(p []byte, off int64) (int, error) {
	if fl.closed {
		return 0, &fs.PathError{Op: "read", Path: fl.name, Err: fs.ErrClosed}
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "read", Path: fl.name, Err: fs.ErrInvalid}
	}
	if len(p) == 0 {
		return 0, nil
	}
	st := fl.fsys.st
	ctx, cancel := context.WithCancel(fl.fsys.ctx)
	defer cancel()
	req := &ctrlv1.ReadFileRequest{WorkspaceId: st.ws.id, Path: abs(fl.name), Offset: uint64(off), Length: uint64(len(p))}
	if err := st.begin(ctx, ctrlv1connect.FileServiceReadFileProcedure, req); err != nil {
		return 0, pathErr("read", fl.name, err)
	}
	n := 0
	for n < len(p) {
		tok := st.sess.current()
		s, err := st.files.ReadFile(ctx, tokenReq(req, tok))
		if err != nil {
			if st.sess.renewAfter(ctx, err, tok) {
				continue
			}
			return n, pathErr("read", fl.name, err)
		}
		for n < len(p) && s.Receive() {
			m := s.Msg()
			data, at := m.GetData(), int64(m.GetOffset())
			if len(data) == 0 || at+int64(len(data)) <= off+int64(n) {
				continue
			}
			if at > off+int64(n) {
				s.Close()
				return n, &fs.PathError{Op: "read", Path: fl.name, Err: fmt.Errorf("the server skipped from offset %d to %d", off+int64(n), at)}
			}
			n += copy(p[n:], data[off+int64(n)-at:])
		}
		err = s.Err()
		s.Close()
		if n == len(p) {
			return n, nil
		}
		if err == nil {
			return n, io.EOF
		}
		if st.sess.renewAfter(ctx, err, tok) {
			req.Offset, req.Length = uint64(off)+uint64(n), uint64(len(p)-n)
			continue
		}
		return n, pathErr("read", fl.name, err)
	}
	return n, nil
}

func (fl *file) Close() error {
	if fl.closed {
		return &fs.PathError{Op: "close", Path: fl.name, Err: fs.ErrClosed}
	}
	fl.closed = true
	fl.stop()
	return nil
}

// dirFile is a directory opened for reading.
type dirFile struct {
	fsys    *FS
	name    string
	info    *fileInfo
	entries []fs.DirEntry
	listed  bool
	closed  bool
}

func (d *dirFile) Stat() (fs.FileInfo, error) { return d.info, nil }

func (d *dirFile) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.name, Err: errors.New("is a directory")}
}

func (d *dirFile) Close() error {
	if d.closed {
		return &fs.PathError{Op: "close", Path: d.name, Err: fs.ErrClosed}
	}
	d.closed = true
	return nil
}

// ReadDir lists the directory with the first call (see FS.ReadDir) and
// returns its entries n at a time (all of them when n <= 0).
func (d *dirFile) ReadDir(n int) ([]fs.DirEntry, error) {
	if d.closed {
		return nil, &fs.PathError{Op: "readdir", Path: d.name, Err: fs.ErrClosed}
	}
	var err error
	if !d.listed {
		d.listed = true
		d.entries, err = d.fsys.readDir(d.fsys.ctx, d.name)
		if err != nil && !errors.Is(err, ErrDirectoryTruncated) {
			return nil, err
		}
	}
	if n <= 0 {
		out := d.entries
		d.entries = nil
		return out, err
	}
	if len(d.entries) == 0 {
		if err != nil {
			return nil, err
		}
		return nil, io.EOF
	}
	k := min(n, len(d.entries))
	out := d.entries[:k:k]
	d.entries = d.entries[k:]
	return out, err
}

// WriteFileOptions are the options of FS.WriteFile.
type WriteFileOptions struct {
	// Mode is the file's permission bits, with fs.ModeSetuid, ModeSetgid
	// and ModeSticky; 0 is 0644. Other bits are ignored.
	Mode fs.FileMode
	// UID owns the file; nil is root of the Workspace.
	UID *uint32
	// GID is its group; nil is 0.
	GID *uint32
	// MakeParents makes missing parent directories (0755, same owner).
	MakeParents bool
}

// WriteFile writes the regular file name with the bytes of r, streamed
// (WriteFile, chunks of FileChunkSize; one chunk is held in memory, never
// the whole file). The bytes go to a temporary file beside name, which
// replaces name atomically once r reached end of file: an error (of r, of
// ctx, of the server) leaves the previous file as it was. A file that does
// not fit the Workspace's writable layer fails with resource_exhausted. It
// returns the description of the file written.
//
// A session the FS created is renewed first when less than half of its
// lifetime is left; when the server answers that it expired, the write is
// made again with a new one only if r is an io.Seeker (from r's offset at
// the call).
func (f *FS) WriteFile(ctx context.Context, name string, r io.Reader, opts *WriteFileOptions) (fs.FileInfo, error) {
	const op = "write"
	if err := validName(op, name); err != nil {
		return nil, err
	}
	if name == "." {
		return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	if opts == nil {
		opts = &WriteFileOptions{}
	}
	hdr := &ctrlv1.WriteFileHeader{WorkspaceId: f.st.ws.id, Path: abs(name), Mode: unixMode(opts.Mode),
		Uid: opts.UID, Gid: opts.GID, MakeParents: opts.MakeParents}
	first := &ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Header{Header: hdr}}
	if err := f.st.begin(ctx, ctrlv1connect.FileServiceWriteFileProcedure, first); err != nil {
		return nil, pathErr(op, name, err)
	}
	if err := f.st.sess.fresh(ctx, f.st.ttl/2); err != nil {
		return nil, pathErr(op, name, err)
	}
	seeker, _ := r.(io.Seeker)
	var start int64
	if seeker != nil {
		var err error
		if start, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			seeker = nil
		}
	}
	buf := make([]byte, FileChunkSize)
	for {
		tok := f.st.sess.current()
		res, err := f.writeOnce(ctx, first, r, buf, tok)
		if err != nil && seeker != nil && f.st.sess.renewAfter(ctx, err, tok) {
			if _, serr := seeker.Seek(start, io.SeekStart); serr == nil {
				seeker = nil // once
				continue
			}
		}
		if err != nil {
			return nil, pathErr(op, name, err)
		}
		return newInfo(name, res.GetFile()), nil
	}
}

// writeOnce sends one WriteFile stream with token: first, then r in
// chunks of buf.
// A failure to read r or a done ctx resets the stream, so that the server
// does not replace the file.
func (f *FS) writeOnce(ctx context.Context, first *ctrlv1.WriteFileRequest, r io.Reader, buf []byte, token string) (*ctrlv1.WriteFileResponse, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := f.st.files.WriteFile(sctx)
	setBearer(s.RequestHeader(), token)
	// abort resets the stream and returns err.
	abort := func(err error) (*ctrlv1.WriteFileResponse, error) {
		cancel()
		_, _ = s.CloseAndReceive()
		return nil, err
	}
	serverErr := func() (*ctrlv1.WriteFileResponse, error) {
		// The server ended the stream: its answer says why.
		if _, err := s.CloseAndReceive(); err != nil {
			return nil, err
		}
		return nil, errors.New("the server answered before the end of the file")
	}
	if err := s.Send(first); err != nil {
		if errors.Is(err, io.EOF) {
			return serverErr()
		}
		return abort(err)
	}
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := s.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Data{Data: buf[:n]}}); err != nil {
				if errors.Is(err, io.EOF) {
					return serverErr()
				}
				return abort(err)
			}
		}
		switch {
		case rerr == nil:
			continue
		case errors.Is(rerr, io.EOF), errors.Is(rerr, io.ErrUnexpectedEOF):
		default:
			return abort(fmt.Errorf("read the source: %w", rerr))
		}
		break
	}
	if err := ctx.Err(); err != nil {
		return abort(context.Cause(ctx))
	}
	res, err := s.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// Mkdir makes the directory name with the permission bits of perm (0 is
// 0755), owned by root of the Workspace. An existing name is fs.ErrExist.
func (f *FS) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	return f.mkdir(ctx, "mkdir", name, perm, false)
}

// MkdirAll makes the directory name and its missing parents, like
// os.MkdirAll: an existing directory is no error.
func (f *FS) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	return f.mkdir(ctx, "mkdir", name, perm, true)
}

func (f *FS) mkdir(ctx context.Context, op, name string, perm fs.FileMode, parents bool) error {
	if err := validName(op, name); err != nil {
		return err
	}
	req := &ctrlv1.MakeDirectoryRequest{WorkspaceId: f.st.ws.id, Path: abs(name), Parents: parents, Mode: unixMode(perm)}
	_, err := unary(ctx, f.st, ctrlv1connect.FileServiceMakeDirectoryProcedure, req, f.st.files.MakeDirectory)
	return pathErr(op, name, err)
}

// Remove removes the file or empty directory name, like os.Remove: a
// missing name is fs.ErrNotExist.
func (f *FS) Remove(ctx context.Context, name string) error {
	const op = "remove"
	existed, err := f.remove(ctx, op, name, false)
	if err == nil && !existed {
		return &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
	}
	return err
}

// RemoveAll removes name and what it holds, like os.RemoveAll: a missing
// name is no error. The root (".") is refused.
func (f *FS) RemoveAll(ctx context.Context, name string) error {
	_, err := f.remove(ctx, "removeall", name, true)
	return err
}

func (f *FS) remove(ctx context.Context, op, name string, recursive bool) (bool, error) {
	if err := validName(op, name); err != nil {
		return false, err
	}
	if name == "." {
		return false, &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	req := &ctrlv1.RemoveFileRequest{WorkspaceId: f.st.ws.id, Path: abs(name), Recursive: recursive}
	res, err := unary(ctx, f.st, ctrlv1connect.FileServiceRemoveFileProcedure, req, f.st.files.RemoveFile)
	if err != nil {
		return false, pathErr(op, name, err)
	}
	return res.GetExisted(), nil
}

// Rename moves oldname to newname, like os.Rename: an existing newname (a
// file, or an empty directory) is replaced.
func (f *FS) Rename(ctx context.Context, oldname, newname string) error {
	const op = "rename"
	if err := validName(op, oldname); err != nil {
		return err
	}
	if err := validName(op, newname); err != nil {
		return err
	}
	req := &ctrlv1.MoveFileRequest{WorkspaceId: f.st.ws.id, Source: abs(oldname), Destination: abs(newname), Overwrite: true}
	_, err := unary(ctx, f.st, ctrlv1connect.FileServiceMoveFileProcedure, req, f.st.files.MoveFile)
	if err != nil {
		return &fs.PathError{Op: op, Path: oldname + " " + newname, Err: unwrapPath(pathErr(op, oldname, err))}
	}
	return nil
}

func unwrapPath(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Err
	}
	return err
}

// FileEvent is a change Watch reports.
type FileEvent struct {
	// Name is the file that changed, as an fs name; empty when Overflowed.
	Name string
	// Change is what happened to it.
	Change ctrlv1.FileChange
	// Overflowed says that changes were lost (the guest's queue
	// overflowed, or the stream was opened again after a renewal of the
	// session): list the directory again.
	Overflowed bool
}

// Watch reports the changes in the directory name (and its subdirectories
// when recursive) as they happen (WatchDirectory), until ctx is done (the
// sequence then ends without an error) or the stream fails (its last pair
// holds the error). When the session the FS created expires, Watch opens
// the stream again and reports an Overflowed event first.
func (f *FS) Watch(ctx context.Context, name string, recursive bool) iter.Seq2[FileEvent, error] {
	return func(yield func(FileEvent, error) bool) {
		const op = "watch"
		if err := validName(op, name); err != nil {
			yield(FileEvent{}, err)
			return
		}
		req := &ctrlv1.WatchDirectoryRequest{WorkspaceId: f.st.ws.id, Path: abs(name), Recursive: recursive}
		if err := f.st.begin(ctx, ctrlv1connect.FileServiceWatchDirectoryProcedure, req); err != nil {
			yield(FileEvent{}, pathErr(op, name, err))
			return
		}
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		again := false
		for {
			tok := f.st.sess.current()
			s, err := f.st.files.WatchDirectory(sctx, tokenReq(req, tok))
			if err == nil {
				if again && !yield(FileEvent{Overflowed: true}, nil) {
					s.Close()
					return
				}
				for s.Receive() {
					m := s.Msg()
					ev := FileEvent{Change: m.GetChange(), Overflowed: m.GetOverflowed()}
					if p := m.GetPath(); p != "" {
						ev.Name = strings.TrimPrefix(p, "/")
						if ev.Name == "" {
							ev.Name = "."
						}
					}
					if !yield(ev, nil) {
						s.Close()
						return
					}
				}
				err = s.Err()
				s.Close()
				if err == nil {
					err = errors.New("the server ended the stream")
				}
			}
			if ctx.Err() != nil {
				return
			}
			if f.st.sess.renewAfter(ctx, err, tok) {
				again = true
				continue
			}
			yield(FileEvent{}, pathErr(op, name, err))
			return
		}
	}
}

var (
	_ fs.StatFS      = (*FS)(nil)
	_ fs.ReadDirFS   = (*FS)(nil)
	_ fs.ReadFileFS  = (*FS)(nil)
	_ fs.ReadLinkFS  = (*FS)(nil)
	_ io.Seeker      = (*file)(nil)
	_ io.ReaderAt    = (*file)(nil)
	_ fs.ReadDirFile = (*dirFile)(nil)
)
