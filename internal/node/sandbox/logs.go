package sandbox

import (
	"errors"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoLog is returned by OpenLog for a workspace of which the node keeps
// no log.
var ErrNoLog = errors.New("no log of the workspace is kept")

// OpenLog opens the guest log of workspaceID (its guest's and PID 1's
// output, as copyLog wrote it): the file rotated at logMaxBytes, nil when
// there is none, and the current one, nil when there is none; ErrNoLog
// when neither exists. Both are opened read-only from the node's own
// Root/logs, never through a symlink. Whether the workspace runs does not
// matter: the log stays until Delete.
//
// A rotation between the two opens is seen (the rotated file is the
// current one just opened) and the opening done again, so that the pair
// is always consecutive.
func (r *Runtime) OpenLog(workspaceID string) (rotated, current *os.File, err error) {
	if workspaceID == "" || workspaceID == "." || workspaceID == ".." || strings.ContainsAny(workspaceID, "/\x00") {
		return nil, nil, ErrNoLog
	}
	p := r.logPath(workspaceID)
	for range 3 {
		current, err = openLogRead(p)
		if err != nil {
			return nil, nil, err
		}
		rotated, err = openLogRead(p + ".1")
		if err != nil {
			closeFiles(current)
			return nil, nil, err
		}
		if rotated == nil && current == nil {
			return nil, nil, ErrNoLog
		}
		if rotated != nil && current != nil && sameFile(rotated, current) {
			closeFiles(rotated, current)
			continue
		}
		return rotated, current, nil
	}
	// Rotated at every try: the log is written faster than it is opened;
	// the current file alone is still consistent.
	current, err = openLogRead(p)
	if err == nil && current == nil {
		err = ErrNoLog
	}
	return nil, current, err
}

// openLogRead opens p for reading, never through a symlink: nil when it
// does not exist.
func openLogRead(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = errors.New("a guest log is not a regular file")
		}
		return nil, err
	}
	return f, nil
}

func sameFile(a, b *os.File) bool {
	fa, err1 := a.Stat()
	fb, err2 := b.Stat()
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}
