package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func (a *app) workspaceCp() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files between a Workspace and the local machine",
		Long: `Copy a file or a directory tree into or out of an AVAILABLE Workspace through
the public data plane (FileService): kibo creates a data-plane session with the
filesystem scope (--ttl, renewed when it expires) and streams the bytes, so a
file of any size uses little memory.

Exactly one of SRC and DST is WORKSPACE_ID:PATH, the other a local path. An
argument is a Workspace's when it has a ":" and no "/" before it: write a local
path that holds a ":" as ./a:b. PATH is absolute in the Workspace; a relative
PATH is taken from / ("ws-…:tmp" is /tmp). A local "-" is standard input (SRC)
or standard output (DST), for one regular file.

As with cp -r: when DST is an existing directory, SRC is copied into it under
its own name; otherwise SRC is copied to DST (a missing parent of DST is made).
A directory is copied with everything in it. Modes are kept (permission bits;
into the Workspace also setuid, setgid and sticky; out of it, those three are
dropped, so that nothing setuid of a Workspace lands on this machine). Files
are written as a new file renamed over the old one, so that a failed copy
leaves the previous file as it was; a file written into the Workspace is owned
by its root.

Symbolic links: a link given as SRC itself is followed. Inside a directory
tree, links are never followed: out of a Workspace they are made as links
(with the target as written); into a Workspace they are skipped with a warning,
since the file service cannot make links. Local files are written through
os.Root, so that nothing the Workspace lists (a link included) can make kibo
write outside DST. Devices, FIFOs and sockets are skipped with a warning.

On a terminal, the bytes copied and the rate are shown on stderr on one line;
otherwise kibo prints nothing but errors and warnings. --timeout bounds the
connection only, not the copy; an interrupted upload leaves the Workspace's
file as it was.`,
		Example: `  kibo workspace cp ./data ws-0123456789abcdefghij:/work
  kibo workspace cp ws-0123456789abcdefghij:/work/out.tar.gz .
  tar cz src | kibo workspace cp - ws-0123456789abcdefghij:/tmp/src.tar.gz`,
		Args:        exactArgs("SRC", "DST"),
		Annotations: map[string]string{annotationNoName: "cp prints no objects"},
	}
	var ttl time.Duration
	cmd.Flags().DurationVar(&ttl, "ttl", kibotos.DefaultFilesSessionTTL, "lifetime of the session kibo creates, 10s to 24h (renewed when it expires; an upload from standard input must end within it)")
	cmd.RunE = a.action(func(setup context.Context, cmd *cobra.Command, args []string) error {
		// --timeout bounds the connection (setup), not the copy, which
		// lasts as long as its bytes take.
		ctx := cmd.Context()
		src, dst := parseCpArg(args[0]), parseCpArg(args[1])
		switch {
		case src.ws == "" && dst.ws == "":
			return usagef("one of SRC and DST must be WORKSPACE_ID:PATH")
		case src.ws != "" && dst.ws != "":
			return usagef("only one of SRC and DST may be WORKSPACE_ID:PATH; the other is a local path")
		case src.path == "-" && dst.path == "-":
			return usagef("SRC and DST cannot both be -")
		}
		c := &copier{a: a, prog: newProgress(a.stderr, a.env.isTerminal(a.stderr), a.env.now)}
		defer c.prog.finish()
		if dst.ws != "" {
			local, err := a.localPath(src.path)
			if err != nil {
				return err
			}
			s, err := a.connect(setup, cmd, nil, ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure)
			if err != nil {
				return err
			}
			c.fsys = s.client.Workspaces().Handle(dst.ws).Files(ctx, kibotos.WithFilesSessionTTL(ttl))
			return c.upload(ctx, local, dst.name())
		}
		local, err := a.localPath(dst.path)
		if err != nil {
			return err
		}
		s, err := a.connect(setup, cmd, nil, ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure)
		if err != nil {
			return err
		}
		c.fsys = s.client.Workspaces().Handle(src.ws).Files(ctx, kibotos.WithFilesSessionTTL(ttl))
		return c.download(ctx, src.name(), local)
	})
	return procedure(cmd, ctrlv1connect.FileServiceStatFileProcedure)
}

// cpArg is one side of cp: a Workspace's path, or a local one.
type cpArg struct {
	ws   string // empty: local
	path string
}

// parseCpArg reads WORKSPACE_ID:PATH (a ":" with no "/" before it) or a
// local path.
func parseCpArg(s string) cpArg {
	if i := strings.IndexByte(s, ':'); i > 0 && !strings.Contains(s[:i], "/") {
		return cpArg{ws: s[:i], path: s[i+1:]}
	}
	return cpArg{path: s}
}

// name is the io/fs name of a Workspace's path: absolute, or relative to
// "/", cleaned.
func (c cpArg) name() string {
	p := path.Clean("/" + c.path)
	if p == "/" {
		return "."
	}
	return p[1:]
}

// localPath makes a local path absolute ("-" stays).
func (a *app) localPath(p string) (string, error) {
	if p == "-" {
		return p, nil
	}
	if p == "" {
		return "", usagef("empty local path")
	}
	return a.abs(p)
}

// copier is one run of cp.
type copier struct {
	a    *app
	fsys *kibotos.FS
	prog *progress
}

func (c *copier) warn(format string, args ...any) {
	c.prog.clear()
	fmt.Fprintf(c.a.stderr, "warning: "+format+"\n", args...)
}

// upload copies the local src ("-": standard input) to the Workspace's
// name.
func (c *copier) upload(ctx context.Context, src, name string) error {
	target := name
	if dst, err := c.fsys.Stat(name); err == nil && dst.IsDir() {
		if src == "-" {
			return usagef("DST %s is a directory: name the file to write from standard input", "/"+strings.TrimPrefix(name, "."))
		}
		target = path.Join(name, filepath.Base(src))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if src == "-" {
		_, err := c.fsys.WriteFile(ctx, target, c.prog.reader(c.a.stdin), &kibotos.WriteFileOptions{Mode: 0o644, MakeParents: true})
		return err
	}
	fi, err := os.Stat(src) // SRC itself is followed
	if err != nil {
		return err
	}
	switch {
	case fi.Mode().IsRegular():
		return c.uploadFile(ctx, src, target, fi.Mode())
	case fi.IsDir():
		return c.uploadTree(ctx, src, target)
	}
	return fmt.Errorf("%s is not a regular file or a directory", src)
}

// uploadTree copies the local directory src to the Workspace's name,
// without following links.
func (c *copier) uploadTree(ctx context.Context, src, name string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := path.Join(name, filepath.ToSlash(rel))
		switch t := d.Type(); {
		case t.IsDir():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			return c.fsys.MkdirAll(ctx, to, fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
		case t.IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			return c.uploadFile(ctx, p, to, fi.Mode())
		case t&fs.ModeSymlink != 0:
			c.warn("skipped the symbolic link %s: the Workspace's file service cannot make links", p)
		default:
			c.warn("skipped %s: not a regular file, directory or symbolic link", p)
		}
		return nil
	})
}

// uploadFile streams the local regular file p to the Workspace's name.
func (c *copier) uploadFile(ctx context.Context, p, name string, mode fs.FileMode) error {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// The reader stays an io.Seeker, so that a write cut by the session's
	// expiry is made again from the start.
	_, err = c.fsys.WriteFile(ctx, name, c.prog.seeker(f), &kibotos.WriteFileOptions{
		Mode: mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky), MakeParents: true})
	return err
}

// download copies the Workspace's name to the local dst ("-": standard
// output).
func (c *copier) download(ctx context.Context, name, dst string) error {
	fi, err := c.fsys.Stat(name) // SRC itself is followed
	if err != nil {
		return err
	}
	if dst == "-" {
		if !fi.Mode().IsRegular() {
			return usagef("- writes one regular file; %s is not one", "/"+strings.TrimPrefix(name, "."))
		}
		f, err := c.fsys.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(c.a.stdout, c.prog.reader(f))
		return err
	}
	target := dst
	if st, err := os.Stat(dst); err == nil && st.IsDir() && name != "." {
		target = filepath.Join(dst, path.Base(name))
	}
	switch {
	case fi.Mode().IsRegular():
		dir := filepath.Dir(target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		root, err := os.OpenRoot(dir)
		if err != nil {
			return err
		}
		defer root.Close()
		return c.downloadFile(root, name, filepath.Base(target), fi.Mode())
	case fi.IsDir():
		return c.downloadTree(name, target, fi.Mode())
	}
	return fmt.Errorf("%s is not a regular file or a directory", "/"+strings.TrimPrefix(name, "."))
}

// downloadTree copies the Workspace's directory name to the local dir,
// through an os.Root at dir: whatever the Workspace lists, nothing is
// written outside dir.
func (c *copier) downloadTree(name, dir string, mode fs.FileMode) error {
	_, statErr := os.Stat(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	// Directories get their mode at the end, deepest first, so that one
	// without write permission is still filled.
	type dirMode struct {
		rel  string
		mode fs.FileMode
	}
	var dirs []dirMode
	if statErr != nil { // made here: it takes the mode of name
		dirs = append(dirs, dirMode{".", mode})
	}
	err = fs.WalkDir(c.fsys, name, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == name {
			return nil
		}
		rel := p
		if name != "." {
			rel = strings.TrimPrefix(p, name+"/")
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch t := d.Type(); {
		case t.IsDir():
			if err := root.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if st, err := root.Lstat(rel); err != nil || !st.IsDir() {
				return fmt.Errorf("%s: not a directory here", filepath.Join(dir, rel))
			}
			dirs = append(dirs, dirMode{rel, fi.Mode()})
		case t.IsRegular():
			return c.downloadFile(root, p, rel, fi.Mode())
		case t&fs.ModeSymlink != 0:
			target := ""
			if m, ok := fi.Sys().(*ctrlv1.FileInfo); ok {
				target = m.GetSymlinkTarget()
			}
			if target == "" {
				if target, err = c.fsys.ReadLink(p); err != nil {
					return err
				}
			}
			if err := root.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			return root.Symlink(target, rel)
		default:
			c.warn("skipped /%s: not a regular file, directory or symbolic link", p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := root.Chmod(d.rel, d.mode.Perm()); err != nil {
			return err
		}
	}
	return nil
}

// downloadFile streams the Workspace's regular file name to rel in root:
// into a new file beside it, renamed over it once complete, with the
// permission bits of mode (never setuid, setgid or sticky).
func (c *copier) downloadFile(root *os.Root, name, rel string, mode fs.FileMode) error {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(rel), "."+filepath.Base(rel)+".kibo-"+hex.EncodeToString(rnd[:]))
	out, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			out.Close()
			_ = root.Remove(tmp)
		}
	}()
	in, err := c.fsys.Open(name)
	if err != nil {
		return err
	}
	defer in.Close()
	if _, err := io.Copy(out, c.prog.reader(in)); err != nil {
		return err
	}
	if err := out.Chmod(mode.Perm()); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := root.Rename(tmp, rel); err != nil {
		return err
	}
	ok = true
	return nil
}

// progress shows the bytes copied and the rate on one line of a terminal,
// rewritten at most every 200ms; it shows nothing when off.
type progress struct {
	w   io.Writer
	on  bool
	now func() time.Time

	mu      sync.Mutex
	start   time.Time
	last    time.Time
	bytes   int64
	printed bool
}

func newProgress(w io.Writer, on bool, now func() time.Time) *progress {
	return &progress{w: w, on: on, now: now, start: now()}
}

func (p *progress) add(n int) {
	if !p.on || n <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bytes += int64(n)
	if t := p.now(); t.Sub(p.last) >= 200*time.Millisecond {
		p.last = t
		p.show(t)
	}
}

// show writes the line; p.mu is held.
func (p *progress) show(t time.Time) {
	rate := 0.0
	if d := t.Sub(p.start).Seconds(); d > 0 {
		rate = float64(p.bytes) / d
	}
	fmt.Fprintf(p.w, "\r%s copied, %s/s\x1b[K", humanBytes(float64(p.bytes)), humanBytes(rate))
	p.printed = true
}

// clear erases the line before another message.
func (p *progress) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.printed {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.printed = false
	}
}

// finish shows the final figures and ends the line.
func (p *progress) finish() {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bytes > 0 || p.printed {
		p.show(p.now())
		fmt.Fprintln(p.w)
	}
}

func (p *progress) reader(r io.Reader) io.Reader { return &countReader{r: r, p: p} }

// seeker counts what is read from f and keeps it an io.Seeker.
func (p *progress) seeker(f io.ReadSeeker) io.Reader { return &countSeeker{countReader{r: f, p: p}, f} }

type countReader struct {
	r io.Reader
	p *progress
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.p.add(n)
	return n, err
}

type countSeeker struct {
	countReader
	s io.Seeker
}

func (c *countSeeker) Seek(off int64, whence int) (int64, error) { return c.s.Seek(off, whence) }

// humanBytes is n in B, KiB, MiB or GiB.
func humanBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f %s", n, units[i])
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}
