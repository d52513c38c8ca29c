package volume_test

import (
	"path"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/volume"
)

func TestCheckMountPath(t *testing.T) {
	for p, ok := range map[string]bool{
		"/data":                           true,
		"/home/user/work":                 true,
		"/mnt/vol-1":                      true,
		"/devices":                        true, // not /dev
		"/procfs":                         true,
		"/sysroot":                        true,
		"/données":                        true,
		"/" + strings.Repeat("a", 255):    true,
		"":                                false,
		"/":                               false,
		"data":                            false,
		"./data":                          false,
		"/data/":                          false,
		"//data":                          false,
		"/data//x":                        false,
		"/data/./x":                       false,
		"/data/../etc":                    false,
		"/..":                             false,
		"/proc":                           false,
		"/proc/self":                      false,
		"/sys":                            false,
		"/sys/fs/cgroup":                  false,
		"/dev":                            false,
		"/dev/shm":                        false,
		"/data\n":                         false,
		"/da\x00ta":                       false,
		"/da\x7fta":                       false,
		"/da\u0085ta":                     false,
		"/\xff":                           false,
		"/" + strings.Repeat("a", 256):    false,
		"/" + strings.Repeat("ab/", 400):  false, // longer than 1024 bytes
		"/a/" + strings.Repeat("b", 1019): false,
	} {
		err := volume.CheckMountPath("volume_binding.mount_path", p)
		if (err == nil) != ok {
			t.Errorf("CheckMountPath(%.40q) = %v, want ok %v", p, err, ok)
		}
		if fe, isFault := fault.As(err); err != nil && (!isFault || fe.Kind != fault.KindInvalidArgument || fe.Field != "volume_binding.mount_path") {
			t.Errorf("CheckMountPath(%.40q) = %v, want invalid_argument on the field", p, err)
		}
	}
}

// FuzzCheckMountPath: whatever the input, an accepted path is absolute,
// clean, bounded, valid UTF-8 without control characters, and neither /
// nor /proc, /sys, /dev or below them; a refusal is invalid_argument.
func FuzzCheckMountPath(f *testing.F) {
	for _, s := range []string{"/data", "/", "/proc/x", "/a/../b", "/dev", "relative", "/x\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := volume.CheckMountPath("f", p)
		if err != nil {
			if fe, ok := fault.As(err); !ok || fe.Kind != fault.KindInvalidArgument || fe.Field != "f" {
				t.Fatalf("CheckMountPath(%q) = %v", p, err)
			}
			return
		}
		if !strings.HasPrefix(p, "/") || p == "/" || path.Clean(p) != p || len(p) > volume.MaxMountPathBytes || !utf8.ValidString(p) {
			t.Fatalf("accepted %q", p)
		}
		for _, r := range p {
			if r < 0x20 || r == 0x7f {
				t.Fatalf("accepted a control character in %q", p)
			}
		}
		for _, bad := range []string{"/proc", "/sys", "/dev"} {
			if p == bad || strings.HasPrefix(p, bad+"/") {
				t.Fatalf("accepted %q", p)
			}
		}
		for _, name := range strings.Split(p[1:], "/") {
			if name == "" || name == "." || name == ".." || len(name) > 255 {
				t.Fatalf("accepted element %q of %q", name, p)
			}
		}
	})
}
