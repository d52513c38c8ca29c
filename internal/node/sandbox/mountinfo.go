package sandbox

import (
	"os"
	"strings"
)

type mountEntry struct {
	root       string
	mountPoint string
	fsType     string
	source     string
	superOpts  string
}

func readMountInfo() ([]mountEntry, error) { return readMountInfoFile("/proc/self/mountinfo") }

func readMountInfoFile(path string) ([]mountEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+3 > len(f) {
			continue
		}
		e := mountEntry{root: unescape(f[3]), mountPoint: unescape(f[4]), fsType: f[sep+1], source: unescape(f[sep+2])}
		if sep+3 < len(f) {
			e.superOpts = f[sep+3]
		}
		out = append(out, e)
	}
	return out, nil
}

// unescape undoes the octal escapes (\040 …) of mountinfo.
func unescape(s string) string {
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

// under reports whether p is dir or inside it.
func under(p, dir string) bool {
	dir = strings.TrimSuffix(dir, "/")
	return p == dir || strings.HasPrefix(p, dir+"/")
}
