package guest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
	"unsafe"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/guest/protocol"
)

// The FileService: the workspace's files, served to the node.
//
// The guest is PID 1 with the workspace's root as its root, so a path,
// symbolic links included, resolves inside the workspace: the kernel
// confines it, not this code. The service still never follows a final
// symbolic link where the operation must not (StatFile without
// follow_symlinks, RemoveFile, MoveFile, the temporary files of writes,
// directories met while listing or watching recursively).
//
// fileService.root is "/" in production. Tests set it to a temporary
// directory: every workspace path is then prefixed with it (host), which
// confines the names the handlers make but not absolute symbolic links,
// which the tests therefore do not rely on; the chroot that confines them
// is exercised by the end-to-end tests.

// Bounds of the FileService.
const (
	// MaxPathBytes bounds a path.
	MaxPathBytes = 4096
	// MaxListDepth bounds ListDirectory's depth.
	MaxListDepth = 16
	// DefaultListLimit is ListDirectory's limit when none is asked.
	DefaultListLimit = 1000
	// MaxListLimit bounds ListDirectory's limit.
	MaxListLimit = 10000
	// maxDirNames bounds the names read from one directory while listing
	// (they are sorted in memory); beyond, the list is truncated.
	maxDirNames = 65536
	// maxListBytes bounds the encoded entries of one ListDirectory
	// answer, below protocol.MaxDataPlaneMessage; beyond, the list is
	// truncated.
	maxListBytes = protocol.MaxDataPlaneMessage - 32<<10
	// ReadChunkBytes is the data of one ReadFile message.
	ReadChunkBytes = 256 << 10
	// MaxUploads bounds the WriteFileChunk uploads open at once.
	MaxUploads = 16
	// UploadIdle is how long an upload not touched is kept.
	UploadIdle = 10 * time.Minute
	// MaxWatchDirectories bounds the directories one recursive
	// WatchDirectory watches.
	MaxWatchDirectories = 4096
	// defaultFileMode and defaultDirMode are the modes when none is asked.
	defaultFileMode = 0o644
	defaultDirMode  = 0o755
)

// fileService serves guestv1connect.FileServiceHandler.
type fileService struct {
	// root prefixes every path: "/" in production, a temporary directory
	// in tests.
	root    string
	uploads *uploadTable
}

func newFileService(root string) *fileService {
	return &fileService{root: root, uploads: &uploadTable{byID: map[string]*upload{}, idle: UploadIdle}}
}

// host is the name of workspace path p (checked) for the system calls.
func (s *fileService) host(p string) string {
	if s.root == "" || s.root == "/" {
		return p
	}
	if p == "/" {
		return s.root
	}
	return s.root + p
}

// checkPath is the one validator of every path a method takes: absolute,
// valid UTF-8, no NUL, at most MaxPathBytes, and clean (no "." or ".."
// element, no doubled or trailing "/"). field names the request field in
// the error.
func checkPath(field, p string) error {
	bad := func(msg string) error {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: %s", field, msg))
	}
	switch {
	case p == "":
		return bad("empty")
	case len(p) > MaxPathBytes:
		return bad(fmt.Sprintf("longer than %d bytes", MaxPathBytes))
	case !utf8.ValidString(p):
		return bad("not valid UTF-8")
	case strings.IndexByte(p, 0) >= 0:
		return bad("contains NUL")
	case p[0] != '/':
		return bad("not absolute")
	case path.Clean(p) != p:
		return bad(fmt.Sprintf("not clean (%q)", protocol.Clip(path.Clean(p), 256)))
	}
	return nil
}

// fileError maps a system call's error on workspace path p to a Connect
// error; its message names p, never the host's name of it.
func fileError(op, p string, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("%s %s failed", op, protocol.Clip(p, 512)))
	}
	code := connect.CodeInternal
	switch errno {
	case unix.ENOENT:
		code = connect.CodeNotFound
	case unix.EEXIST:
		code = connect.CodeAlreadyExists
	case unix.EACCES, unix.EPERM:
		code = connect.CodePermissionDenied
	case unix.ENOTDIR, unix.EISDIR, unix.ENOTEMPTY, unix.ELOOP, unix.EXDEV, unix.EBUSY, unix.EROFS, unix.ETXTBSY:
		code = connect.CodeFailedPrecondition
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG, unix.EMLINK, unix.EMFILE, unix.ENFILE:
		code = connect.CodeResourceExhausted
	case unix.EINVAL, unix.ENAMETOOLONG:
		code = connect.CodeInvalidArgument
	}
	return connect.NewError(code, fmt.Errorf("%s %s: %s", op, protocol.Clip(p, 512), errno.Error()))
}

// fileInfo describes the file of st, named p.
func fileInfo(p string, st *unix.Stat_t) *guestv1.FileInfo {
	fi := &guestv1.FileInfo{
		Path:       p,
		Size:       uint64(st.Size),
		Mode:       st.Mode & 0o7777,
		Uid:        st.Uid,
		Gid:        st.Gid,
		ModifyTime: timestamppb.New(time.Unix(st.Mtim.Unix())),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fi.Type = guestv1.FileType_FILE_TYPE_REGULAR
	case unix.S_IFDIR:
		fi.Type = guestv1.FileType_FILE_TYPE_DIRECTORY
	case unix.S_IFLNK:
		fi.Type = guestv1.FileType_FILE_TYPE_SYMLINK
	default:
		fi.Type = guestv1.FileType_FILE_TYPE_OTHER
	}
	return fi
}

// lstat describes workspace path p (a final symbolic link itself).
func (s *fileService) lstat(p string) (*guestv1.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Lstat(s.host(p), &st); err != nil {
		return nil, fileError("stat", p, err)
	}
	fi := fileInfo(p, &st)
	if fi.Type == guestv1.FileType_FILE_TYPE_SYMLINK {
		if t, err := os.Readlink(s.host(p)); err == nil {
			fi.SymlinkTarget = protocol.Clip(t, MaxPathBytes)
		}
	}
	return fi, nil
}

func (s *fileService) StatFile(_ context.Context, req *connect.Request[guestv1.StatFileRequest]) (*connect.Response[guestv1.StatFileResponse], error) {
	p := req.Msg.GetPath()
	if err := checkPath("path", p); err != nil {
		return nil, err
	}
	if !req.Msg.GetFollowSymlinks() {
		fi, err := s.lstat(p)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&guestv1.StatFileResponse{File: fi}), nil
	}
	var st unix.Stat_t
	if err := unix.Stat(s.host(p), &st); err != nil {
		return nil, fileError("stat", p, err)
	}
	return connect.NewResponse(&guestv1.StatFileResponse{File: fileInfo(p, &st)}), nil
}

func (s *fileService) ListDirectory(_ context.Context, req *connect.Request[guestv1.ListDirectoryRequest]) (*connect.Response[guestv1.ListDirectoryResponse], error) {
	m := req.Msg
	p := m.GetPath()
	if err := checkPath("path", p); err != nil {
		return nil, err
	}
	depth := int(m.GetDepth())
	if depth > MaxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("depth: at most %d", MaxListDepth))
	}
	depth = max(depth, 1)
	limit := int(m.GetLimit())
	if limit > MaxListLimit {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("limit: at most %d", MaxListLimit))
	}
	if limit == 0 {
		limit = DefaultListLimit
	}
	// The directory named may be a symbolic link to one (as ls does);
	// those met below it are listed, not descended.
	var st unix.Stat_t
	if err := unix.Stat(s.host(p), &st); err != nil {
		return nil, fileError("list", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("list %s: not a directory", protocol.Clip(p, 512)))
	}
	l := lister{s: s, limit: limit}
	l.walk(p, depth, true)
	return connect.NewResponse(&guestv1.ListDirectoryResponse{Entries: l.entries, Truncated: l.truncated}), nil
}

// lister walks directories depth first, in name order: each directory's
// entries follow it, which is the order of paths compared element by
// element.
type lister struct {
	s         *fileService
	limit     int
	entries   []*guestv1.FileInfo
	size      int // encoded size of entries
	truncated bool
	full      bool // the limit or maxListBytes reached: the walk stops
}

func (l *lister) walk(dir string, depth int, top bool) {
	names, complete := l.s.readNames(dir, !top)
	if !complete {
		l.truncated = true
	}
	slices.Sort(names)
	for _, name := range names {
		if l.full || len(l.entries) >= l.limit {
			l.truncated, l.full = true, true
			return
		}
		p := path.Join(dir, name)
		fi, err := l.s.lstat(p)
		if err != nil {
			continue // gone since it was read
		}
		// The entry's encoding in the answer: tag, length, message.
		n := proto.Size(fi)
		n += 1 + protowire.SizeVarint(uint64(n))
		if l.size+n > maxListBytes {
			l.truncated, l.full = true, true
			return
		}
		l.size += n
		l.entries = append(l.entries, fi)
		if depth > 1 && fi.Type == guestv1.FileType_FILE_TYPE_DIRECTORY {
			l.walk(p, depth-1, false)
		}
	}
}

// readNames reads at most maxDirNames names of directory dir (with
// nofollow, not through a final symbolic link); complete is false when
// there were more, or it could not be read.
func (s *fileService) readNames(dir string, nofollow bool) (names []string, complete bool) {
	flags := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC
	if nofollow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Open(s.host(dir), flags, 0)
	if err != nil {
		return nil, false
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	for len(names) < maxDirNames {
		batch, err := f.Readdirnames(min(4096, maxDirNames-len(names)))
		names = append(names, batch...)
		if err == io.EOF {
			return names, true
		}
		if err != nil {
			return names, false
		}
	}
	more, _ := f.Readdirnames(1)
	return names, len(more) == 0
}

// owner is the owner a request asks for; set is false when it asks for
// none (what the guest makes is then owned by the guest: root).
func owner(uid, gid *uint32) (u, g int, set bool) {
	if uid == nil && gid == nil {
		return 0, 0, false
	}
	if uid != nil {
		u = int(*uid)
	}
	if gid != nil {
		g = int(*gid)
	}
	return u, g, true
}

func checkMode(m uint32) error {
	if m > 0o7777 {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("mode: at most 07777"))
	}
	return nil
}

// mkdir makes directory p with mode and owner, exactly (not masked by the
// umask).
func (s *fileService) mkdir(p string, mode uint32, uid, gid int, chown bool) error {
	if err := unix.Mkdir(s.host(p), 0o700); err != nil {
		return fileError("mkdir", p, err)
	}
	if chown {
		if err := unix.Lchown(s.host(p), uid, gid); err != nil {
			return fileError("chown", p, err)
		}
	}
	if err := unix.Chmod(s.host(p), mode); err != nil {
		return fileError("chmod", p, err)
	}
	return nil
}

// mkdirAll makes p and its missing parents (parents with defaultDirMode);
// made is false when p was a directory already.
func (s *fileService) mkdirAll(p string, mode uint32, uid, gid int, chown bool) (made bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(s.host(p), &st); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return false, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("mkdir %s: exists, not a directory", protocol.Clip(p, 512)))
		}
		return false, nil
	}
	if parent := path.Dir(p); parent != p {
		if _, err := s.mkdirAll(parent, defaultDirMode, uid, gid, chown); err != nil {
			if connect.CodeOf(err) == connect.CodeAlreadyExists {
				// A parent is not a directory.
				return false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("mkdir %s: %s is not a directory", protocol.Clip(p, 512), protocol.Clip(parent, 512)))
			}
			return false, err
		}
	}
	if err := s.mkdir(p, mode, uid, gid, chown); err != nil {
		if connect.CodeOf(err) == connect.CodeAlreadyExists {
			return false, nil // made meanwhile
		}
		return false, err
	}
	return true, nil
}

func (s *fileService) MakeDirectory(_ context.Context, req *connect.Request[guestv1.MakeDirectoryRequest]) (*connect.Response[guestv1.MakeDirectoryResponse], error) {
	m := req.Msg
	p := m.GetPath()
	if err := checkPath("path", p); err != nil {
		return nil, err
	}
	if err := checkMode(m.GetMode()); err != nil {
		return nil, err
	}
	mode := m.GetMode()
	if mode == 0 {
		mode = defaultDirMode
	}
	uid, gid, chown := owner(m.Uid, m.Gid)
	created := true
	if m.GetParents() {
		made, err := s.mkdirAll(p, mode, uid, gid, chown)
		if err != nil {
			return nil, err
		}
		created = made
	} else if err := s.mkdir(p, mode, uid, gid, chown); err != nil {
		return nil, err
	}
	fi, err := s.lstat(p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&guestv1.MakeDirectoryResponse{Directory: fi, Created: created}), nil
}

func (s *fileService) MoveFile(_ context.Context, req *connect.Request[guestv1.MoveFileRequest]) (*connect.Response[guestv1.MoveFileResponse], error) {
	m := req.Msg
	src, dst := m.GetSource(), m.GetDestination()
	if err := checkPath("source", src); err != nil {
		return nil, err
	}
	if err := checkPath("destination", dst); err != nil {
		return nil, err
	}
	if src == "/" || dst == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("cannot move /"))
	}
	flags := uint(unix.RENAME_NOREPLACE)
	if m.GetOverwrite() {
		flags = 0
	}
	// renameat2 neither follows a final symbolic link of either name: a
	// link is moved, or replaced, itself.
	err := unix.Renameat2(unix.AT_FDCWD, s.host(src), unix.AT_FDCWD, s.host(dst), flags)
	if flags != 0 && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS)) {
		// A file system without RENAME_NOREPLACE: checked, then renamed
		// (a destination made in between is replaced).
		var st unix.Stat_t
		if lerr := unix.Lstat(s.host(dst), &st); lerr == nil {
			err = unix.EEXIST
		} else {
			err = unix.Rename(s.host(src), s.host(dst))
		}
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) && !m.GetOverwrite() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("move: %s exists", protocol.Clip(dst, 512)))
		}
		return nil, fileError("move", src+" to "+dst, err)
	}
	fi, err := s.lstat(dst)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&guestv1.MoveFileResponse{File: fi}), nil
}

func (s *fileService) RemoveFile(_ context.Context, req *connect.Request[guestv1.RemoveFileRequest]) (*connect.Response[guestv1.RemoveFileResponse], error) {
	m := req.Msg
	p := m.GetPath()
	if err := checkPath("path", p); err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path: cannot remove /"))
	}
	var st unix.Stat_t
	if err := unix.Lstat(s.host(p), &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return connect.NewResponse(&guestv1.RemoveFileResponse{}), nil
		}
		return nil, fileError("remove", p, err)
	}
	var err error
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		err = unix.Unlink(s.host(p)) // a symbolic link itself
	case m.GetRecursive():
		// os.RemoveAll opens each directory relative to its parent,
		// without following symbolic links.
		err = os.RemoveAll(s.host(p))
	default:
		err = unix.Rmdir(s.host(p))
	}
	if errors.Is(err, unix.ENOENT) {
		return connect.NewResponse(&guestv1.RemoveFileResponse{}), nil
	}
	if err != nil {
		return nil, fileError("remove", p, err)
	}
	return connect.NewResponse(&guestv1.RemoveFileResponse{Existed: true}), nil
}

// ReadFile refuses what is not a regular file with failed_precondition
// (a directory included, as EISDIR maps).
func (s *fileService) ReadFile(ctx context.Context, req *connect.Request[guestv1.ReadFileRequest], stream *connect.ServerStream[guestv1.ReadFileResponse]) error {
	m := req.Msg
	p := m.GetPath()
	if err := checkPath("path", p); err != nil {
		return err
	}
	// O_NONBLOCK: opening a FIFO does not wait for a writer.
	fd, err := unix.Open(s.host(p), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return fileError("read", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileError("read", p, err)
	}
	fi := fileInfo(p, &st)
	if fi.Type != guestv1.FileType_FILE_TYPE_REGULAR {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("read %s: not a regular file", protocol.Clip(p, 512)))
	}
	if err := stream.Send(&guestv1.ReadFileResponse{File: fi}); err != nil {
		return err
	}
	off, left := m.GetOffset(), m.GetLength()
	if left == 0 {
		left = ^uint64(0)
	}
	buf := make([]byte, ReadChunkBytes)
	for left > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		if off > 1<<62 {
			return nil
		}
		n, err := f.ReadAt(buf[:min(uint64(len(buf)), left)], int64(off))
		if n > 0 {
			if err := stream.Send(&guestv1.ReadFileResponse{Offset: off, Data: buf[:n]}); err != nil {
				return err
			}
			off += uint64(n)
			left -= uint64(n)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fileError("read", p, err)
		}
	}
	return nil
}

// tempFile is a file being written beside its target.
type tempFile struct {
	s      *fileService
	target string // workspace path
	name   string // workspace path of the temporary file
	f      *os.File
	mode   uint32
	uid    int
	gid    int
	chown  bool
	size   uint64
}

// createTemp checks header h and creates its temporary file: a hidden
// name beside the target, ".NAME.kibotos-XXXXXXXX", made O_EXCL and
// O_NOFOLLOW so that nothing already there is opened.
func (s *fileService) createTemp(h *guestv1.WriteFileHeader) (*tempFile, error) {
	p := h.GetPath()
	if err := checkPath("header.path", p); err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("header.path: cannot write /"))
	}
	if err := checkMode(h.GetMode()); err != nil {
		return nil, err
	}
	t := &tempFile{s: s, target: p, mode: h.GetMode()}
	if t.mode == 0 {
		t.mode = defaultFileMode
	}
	t.uid, t.gid, t.chown = owner(h.Uid, h.Gid)
	dir := path.Dir(p)
	if h.GetMakeParents() {
		if _, err := s.mkdirAll(dir, defaultDirMode, t.uid, t.gid, t.chown); err != nil {
			return nil, err
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(s.host(p), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("write %s: is a directory", protocol.Clip(p, 512)))
	}
	base := path.Base(p)
	if len(base) > 200 {
		base = base[:200]
	}
	for range 8 {
		var r [4]byte
		_, _ = rand.Read(r[:])
		t.name = path.Join(dir, "."+base+".kibotos-"+hex.EncodeToString(r[:]))
		fd, err := unix.Open(s.host(t.name), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return nil, fileError("write", p, err)
		}
		t.f = os.NewFile(uintptr(fd), t.name)
		return t, nil
	}
	return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("write %s: no temporary name", protocol.Clip(p, 512)))
}

// writeAt writes b at offset off of the temporary file.
func (t *tempFile) writeAt(b []byte, off uint64) error {
	if _, err := t.f.WriteAt(b, int64(off)); err != nil {
		return fileError("write", t.target, err)
	}
	t.size = max(t.size, off+uint64(len(b)))
	return nil
}

// commit gives the temporary file its mode and owner, syncs it, and
// renames it over the target; on failure the temporary file is removed
// and the target left as it was.
func (t *tempFile) commit() (*guestv1.FileInfo, error) {
	fd := int(t.f.Fd())
	err := func() error {
		if t.chown {
			if err := unix.Fchown(fd, t.uid, t.gid); err != nil {
				return fileError("chown", t.target, err)
			}
		}
		if err := unix.Fchmod(fd, t.mode); err != nil {
			return fileError("chmod", t.target, err)
		}
		if err := t.f.Sync(); err != nil {
			return fileError("write", t.target, err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(t.s.host(t.target), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("write %s: is a directory", protocol.Clip(t.target, 512)))
		}
		if err := unix.Rename(t.s.host(t.name), t.s.host(t.target)); err != nil {
			return fileError("write", t.target, err)
		}
		return nil
	}()
	if err != nil {
		t.discard()
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.f.Close()
		return nil, fileError("stat", t.target, err)
	}
	t.f.Close()
	return fileInfo(t.target, &st), nil
}

// discard closes and removes the temporary file.
func (t *tempFile) discard() {
	t.f.Close()
	_ = unix.Unlink(t.s.host(t.name))
}

func (s *fileService) WriteFile(ctx context.Context, stream *connect.ClientStream[guestv1.WriteFileRequest]) (*connect.Response[guestv1.WriteFileResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("header: missing"))
	}
	h := stream.Msg().GetHeader()
	if h == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("header: the first message is not a header"))
	}
	t, err := s.createTemp(h)
	if err != nil {
		return nil, err
	}
	for stream.Receive() {
		if stream.Msg().GetHeader() != nil {
			t.discard()
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("header: sent twice"))
		}
		if err := t.writeAt(stream.Msg().GetData(), t.size); err != nil {
			t.discard()
			return nil, err
		}
	}
	if err := stream.Err(); err != nil {
		t.discard()
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		t.discard()
		return nil, connect.NewError(connect.CodeCanceled, err)
	}
	fi, err := t.commit()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&guestv1.WriteFileResponse{File: fi}), nil
}

// upload is an open WriteFileChunk upload.
type upload struct {
	id    string
	mu    sync.Mutex // held while writing; t is nil once ended
	t     *tempFile
	timer *time.Timer
}

// uploadTable is the open uploads, at most MaxUploads.
type uploadTable struct {
	mu   sync.Mutex
	byID map[string]*upload
	idle time.Duration // UploadIdle, shorter in tests
}

// remove forgets u; u.mu is held. It is a no-op when u is gone already.
func (ut *uploadTable) remove(u *upload) {
	ut.mu.Lock()
	if ut.byID[u.id] == u {
		delete(ut.byID, u.id)
	}
	ut.mu.Unlock()
	u.timer.Stop()
}

func checkUploadID(id string) error {
	if id == "" || len(id) > 64 {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("upload_id: 1 to 64 characters"))
	}
	for _, c := range []byte(id) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return connect.NewError(connect.CodeInvalidArgument, errors.New("upload_id: letters, digits, - and _ only"))
		}
	}
	return nil
}

// open returns the upload named id, made from header h when it is new
// and begins at offset 0.
func (s *fileService) openUpload(id string, h *guestv1.WriteFileHeader, offset uint64) (*upload, error) {
	ut := s.uploads
	ut.mu.Lock()
	defer ut.mu.Unlock()
	if u := ut.byID[id]; u != nil {
		return u, nil
	}
	if offset != 0 {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no upload %q (it ended, or was idle for %v): start again at offset 0", id, UploadIdle))
	}
	if h == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("header: missing from the first chunk"))
	}
	if len(ut.byID) >= MaxUploads {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d uploads are open", MaxUploads))
	}
	t, err := s.createTemp(h)
	if err != nil {
		return nil, err
	}
	u := &upload{id: id, t: t}
	u.timer = time.AfterFunc(ut.idle, func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		if u.t != nil {
			ut.remove(u)
			u.t.discard()
			u.t = nil
		}
	})
	ut.byID[id] = u
	return u, nil
}

func (s *fileService) WriteFileChunk(_ context.Context, req *connect.Request[guestv1.WriteFileChunkRequest]) (*connect.Response[guestv1.WriteFileChunkResponse], error) {
	m := req.Msg
	if err := checkUploadID(m.GetUploadId()); err != nil {
		return nil, err
	}
	u, err := s.openUpload(m.GetUploadId(), m.GetHeader(), m.GetOffset())
	if err != nil {
		return nil, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	t := u.t
	if t == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no upload %q (it ended): start again at offset 0", m.GetUploadId()))
	}
	if h := m.GetHeader(); h != nil && h.GetPath() != t.target {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("header.path: not the upload's path"))
	}
	u.timer.Reset(s.uploads.idle)
	off, data := m.GetOffset(), m.GetData()
	if off > t.size {
		return nil, connect.NewError(connect.CodeOutOfRange, fmt.Errorf("offset %d is past the %d bytes written", off, t.size))
	}
	if skip := t.size - off; skip < uint64(len(data)) {
		if err := t.writeAt(data[skip:], t.size); err != nil {
			// The upload stays: the caller may retry the chunk.
			return nil, err
		}
	}
	if !m.GetCommit() {
		return connect.NewResponse(&guestv1.WriteFileChunkResponse{WrittenBytes: t.size}), nil
	}
	s.uploads.remove(u)
	u.t = nil
	fi, err := t.commit()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&guestv1.WriteFileChunkResponse{WrittenBytes: t.size, File: fi}), nil
}

// Watch masks: a watched directory's entries, and its own end.
const (
	watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
		unix.IN_CLOSE_WRITE | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
		unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK
)

// watcher is one WatchDirectory's inotify instance.
type watcher struct {
	s         *fileService
	fd        int
	f         *os.File
	dirs      map[int32]string // watch descriptor → workspace path
	recursive bool
	full      bool                                        // MaxWatchDirectories reached: an overflow was sent
	send      func(*guestv1.WatchDirectoryResponse) error // the stream's Send
}

// add watches directory p (not following a final symbolic link unless it
// is the top one) and, recursively, its subdirectories; created reports
// their entries as created (a directory that appeared while watched may
// have been filled before its watch was added).
func (w *watcher) add(p string, top, created bool) error {
	if len(w.dirs) >= MaxWatchDirectories {
		if top {
			return nil
		}
		if !w.full {
			w.full = true
			return w.send(&guestv1.WatchDirectoryResponse{Overflowed: true})
		}
		return nil
	}
	mask := uint32(watchMask)
	if !top {
		mask |= unix.IN_DONT_FOLLOW
	}
	wd, err := unix.InotifyAddWatch(w.fd, w.s.host(p), mask)
	if err != nil {
		if top {
			return fileError("watch", p, err)
		}
		return nil // gone, or not a directory any more
	}
	if _, ok := w.dirs[int32(wd)]; ok {
		w.dirs[int32(wd)] = p // the same directory, under a new name
		return nil
	}
	w.dirs[int32(wd)] = p
	if !w.recursive && !created {
		return nil
	}
	names, _ := w.s.readNames(p, !top)
	slices.Sort(names)
	for _, name := range names {
		c := path.Join(p, name)
		if created {
			if err := w.send(&guestv1.WatchDirectoryResponse{Path: c, Change: guestv1.FileChange_FILE_CHANGE_CREATED}); err != nil {
				return err
			}
		}
		if w.recursive {
			var st unix.Stat_t
			if unix.Lstat(w.s.host(c), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				if err := w.add(c, false, created); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// WatchDirectory streams changes. What it buffers is bounded by the
// kernel's inotify queue (fs.inotify.max_queued_events) and one read
// buffer: a client slower than the changes makes the queue overflow,
// which is sent as overflowed. More than MaxWatchDirectories directories
// under a recursive watch: those beyond are not watched, and one
// overflowed is sent when one appears.
func (s *fileService) WatchDirectory(ctx context.Context, req *connect.Request[guestv1.WatchDirectoryRequest], stream *connect.ServerStream[guestv1.WatchDirectoryResponse]) error {
	m := req.Msg
	p := m.GetPath()
	if err := checkPath("path", p); err != nil {
		return err
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fileError("watch", p, err)
	}
	// Through os.File the reads wait in the runtime's poller, and Close
	// ends a read waiting.
	w := &watcher{s: s, fd: fd, f: os.NewFile(uintptr(fd), "inotify"), dirs: map[int32]string{}, recursive: m.GetRecursive(), send: stream.Send}
	var closeOnce sync.Once
	closeFile := func() { closeOnce.Do(func() { w.f.Close() }) }
	defer closeFile()
	if err := w.add(p, true, false); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, closeFile)
	defer stop()
	// The stream's headers go now: the client knows the watch is in place.
	if err := stream.Send(nil); err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fileError("watch", p, err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if off+unix.SizeofInotifyEvent+int(ev.Len) > n {
				break
			}
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			name := strings.TrimRight(string(nameBytes), "\x00")
			done, err := w.event(ev, name, p)
			if err != nil || done {
				return err
			}
		}
	}
}

// event sends what ev says; done is set when the watched directory went.
func (w *watcher) event(ev *unix.InotifyEvent, name, top string) (done bool, err error) {
	mask := ev.Mask
	if mask&unix.IN_Q_OVERFLOW != 0 {
		return false, w.send(&guestv1.WatchDirectoryResponse{Overflowed: true})
	}
	dir, ok := w.dirs[ev.Wd]
	if !ok {
		return false, nil
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, ev.Wd)
		if dir == top {
			return true, nil
		}
		return false, nil
	}
	if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
		if dir == top {
			err := w.send(&guestv1.WatchDirectoryResponse{Path: top, Change: guestv1.FileChange_FILE_CHANGE_REMOVED})
			return true, err
		}
		return false, nil
	}
	if name == "" {
		return false, nil
	}
	p := path.Join(dir, name)
	var change guestv1.FileChange
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		change = guestv1.FileChange_FILE_CHANGE_CREATED
	case mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
		change = guestv1.FileChange_FILE_CHANGE_REMOVED
	case mask&unix.IN_CLOSE_WRITE != 0:
		change = guestv1.FileChange_FILE_CHANGE_WRITTEN
	case mask&unix.IN_ATTRIB != 0:
		change = guestv1.FileChange_FILE_CHANGE_ATTRIBUTES
	default:
		return false, nil
	}
	if err := w.send(&guestv1.WatchDirectoryResponse{Path: p, Change: change}); err != nil {
		return false, err
	}
	if w.recursive && mask&(unix.IN_MOVED_FROM|unix.IN_ISDIR) == unix.IN_MOVED_FROM|unix.IN_ISDIR {
		// A directory moved out of its name: its watches go (moved within
		// the watch, its new name comes as a creation, watched again).
		for wd, d := range w.dirs {
			if d == p || strings.HasPrefix(d, p+"/") {
				_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
				delete(w.dirs, wd)
			}
		}
		w.full = false
	}
	if w.recursive && change == guestv1.FileChange_FILE_CHANGE_CREATED && mask&unix.IN_ISDIR != 0 {
		return false, w.add(p, false, true)
	}
	return false, nil
}

// NewFileService returns the FileService on the files under root, as if
// root were the workspace's root: for tests of the services that forward
// to it (the guest itself serves root "/"). Absolute symbolic links under
// root are not confined to it.
func NewFileService(root string) guestv1connect.FileServiceHandler { return newFileService(root) }
