package api

import (
	"strings"
	"unicode/utf8"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
)

// Limits of a StartProcess request, checked by ctrl before anything is
// sent to the guest (docs/api.md, "Data plane: processes"). They follow
// Linux's own bounds where it has them (a string of argv or env must stay
// below MAX_ARG_STRLEN) and keep the request well inside the guest's
// message bound.
const (
	// MaxExecString bounds one argument or environment entry, in bytes.
	MaxExecString = 128<<10 - 1
	// MaxExecStrings bounds the arguments and environment entries
	// together.
	MaxExecStrings = 32768
	// MaxExecBytes bounds argv and env together: the bytes of every
	// string plus one each (as the kernel counts them).
	MaxExecBytes = 256 << 10
	// MaxExecPath bounds working_directory.
	MaxExecPath = 4096
	// MaxExecTag bounds a process tag.
	MaxExecTag = 256
	// MaxExecID bounds uid and gid: a Workspace maps 65536 IDs.
	MaxExecID = 65535
	// MaxPtySide bounds a terminal's rows and columns.
	MaxPtySide = 1 << 15
)

// checkStart checks a StartProcess request's fields against the limits:
// invalid_argument naming the first field that breaks one.
func checkStart(m *ctrlv1.StartProcessRequest) error {
	argv, env := m.GetArgv(), m.GetEnv()
	if len(argv) == 0 || argv[0] == "" {
		return fault.Invalid("argv", "argv names the program to run: at least one non-empty string")
	}
	if n := len(argv) + len(env); n > MaxExecStrings {
		return fault.Invalid("argv", "argv and env hold %d strings; at most %d", n, MaxExecStrings)
	}
	total := 0
	for i, a := range argv {
		if err := checkExecString("argv", i, a); err != nil {
			return err
		}
		total += len(a) + 1
	}
	for i, e := range env {
		if err := checkExecString("env", i, e); err != nil {
			return err
		}
		if name, _, ok := strings.Cut(e, "="); !ok || name == "" {
			return fault.Invalid("env", "env[%d] is not NAME=value", i)
		}
		total += len(e) + 1
	}
	if total > MaxExecBytes {
		return fault.Invalid("argv", "argv and env hold %d bytes (one more per string); at most %d", total, MaxExecBytes)
	}
	if d := m.GetWorkingDirectory(); d != "" {
		if len(d) > MaxExecPath || !strings.HasPrefix(d, "/") || strings.IndexByte(d, 0) >= 0 || !utf8.ValidString(d) {
			return fault.Invalid("working_directory", "working_directory is an absolute UTF-8 path without NUL, at most %d bytes", MaxExecPath)
		}
	}
	if len(m.GetTag()) > MaxExecTag || !utf8.ValidString(m.GetTag()) {
		return fault.Invalid("tag", "tag is UTF-8 of at most %d bytes", MaxExecTag)
	}
	if m.Uid != nil && m.GetUid() > MaxExecID {
		return fault.Invalid("uid", "uid %d is outside the Workspace's IDs (0 to %d)", m.GetUid(), MaxExecID)
	}
	if m.Gid != nil && m.GetGid() > MaxExecID {
		return fault.Invalid("gid", "gid %d is outside the Workspace's IDs (0 to %d)", m.GetGid(), MaxExecID)
	}
	if p := m.GetPty(); p != nil && (p.GetRows() > MaxPtySide || p.GetCols() > MaxPtySide) {
		return fault.Invalid("pty", "a terminal has at most %d rows and columns, not %dx%d (0 is 24 rows, 80 columns)", MaxPtySide, p.GetRows(), p.GetCols())
	}
	return nil
}

// checkExecString checks field[i]: valid UTF-8 is not required (argv is
// bytes to the kernel), NUL is refused (it would end the string).
func checkExecString(field string, i int, s string) error {
	if len(s) > MaxExecString {
		return fault.Invalid(field, "%s[%d] is %d bytes; at most %d", field, i, len(s), MaxExecString)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return fault.Invalid(field, "%s[%d] holds a NUL byte", field, i)
	}
	return nil
}
