// Package mountinfo reads /proc/<pid>/mountinfo (proc(5)). It is used by the
// sandbox runtime on the node and by the guest agent inside a workspace, so
// it depends on the standard library only.
package mountinfo

import (
	"os"
	"strings"
)

// Entry is one mount.
type Entry struct {
	Root         string // the root of the mount within its filesystem
	MountPoint   string
	FSType       string
	Source       string
	SuperOptions string // per-superblock options, e.g. the controllers of a cgroup v1 mount
}

// ReadSelf reads the mounts of the calling process.
func ReadSelf() ([]Entry, error) { return Read("/proc/self/mountinfo") }

// Read reads a mountinfo file. Malformed lines are skipped.
func Read(path string) ([]Entry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+2 > len(f) {
			continue
		}
		e := Entry{Root: Unescape(f[3]), MountPoint: Unescape(f[4]), FSType: f[sep+1]}
		if sep+2 < len(f) {
			e.Source = Unescape(f[sep+2])
		}
		if sep+3 < len(f) {
			e.SuperOptions = f[sep+3]
		}
		out = append(out, e)
	}
	return out, nil
}

// Unescape undoes the octal escapes (\040 for a space, …) of mountinfo.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			v, ok := 0, true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + int(c-'0')
			}
			if ok {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
