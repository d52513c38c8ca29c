// Package staticbin tells whether an executable is statically linked. The
// node mounts kibotos-guest, and copies busybox, into template root
// filesystems that have no dynamic loader and no shared libraries, so both
// must be static: a dynamic one fails only later, inside the workspace, with
// "exec …: no such file or directory" (the loader is what is missing).
package staticbin

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"strings"
)

// DynamicError reports a dynamically linked executable.
type DynamicError struct {
	Path string
	// Interp is the dynamic loader it asks for (PT_INTERP), if any.
	Interp string
	// Needed are the shared libraries it asks for (DT_NEEDED).
	Needed []string
}

// Needs names what the executable needs at run time: its loader, else its
// libraries.
func (e *DynamicError) Needs() string {
	if e.Interp != "" {
		return e.Interp
	}
	return strings.Join(e.Needed, ", ")
}

func (e *DynamicError) Error() string {
	return fmt.Sprintf("%s is dynamically linked (needs %s)", e.Path, e.Needs())
}

// Check returns nil when path is a statically linked ELF executable, a
// *DynamicError when it is dynamically linked, and another error when it
// cannot be read or is not an ELF executable.
func Check(path string) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	var magic [4]byte
	if _, err := io.ReadFull(file, magic[:]); err != nil || string(magic[:]) != elf.ELFMAG {
		return fmt.Errorf("%s is not an ELF executable", path)
	}
	f, err := elf.NewFile(file)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	de := &DynamicError{Path: path}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return fmt.Errorf("%s: read PT_INTERP: %w", path, err)
		}
		de.Interp = strings.TrimRight(string(b), "\x00")
		if de.Interp == "" {
			de.Interp = "a dynamic loader"
		}
	}
	// A static executable has no dynamic section: the error is then
	// ErrNoSymbols or nil with no entries.
	if libs, err := f.ImportedLibraries(); err == nil {
		de.Needed = libs
	}
	if de.Interp != "" || len(de.Needed) > 0 {
		return de
	}
	return nil
}
