package mountinfo

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mountinfo")
	content := "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n" +
		"40 30 0:35 / /sys/fs/cgroup/memory rw,relatime shared:17 - cgroup cgroup rw,memory\n" +
		"41 30 0:36 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n" +
		"2 1 8:1 /srv/sock /run/kibotos/sock rw - ext4 /dev/vda rw\n" +
		"short line - \n" +
		"\n"
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Read(p)
	if err != nil || len(m) != 4 {
		t.Fatalf("%+v %v", m, err)
	}
	if m[0].MountPoint != "/mnt/with space" || m[0].Root != "/mnt1" || m[0].FSType != "ext3" || m[0].Source != "/dev/root" {
		t.Errorf("entry 0: %+v", m[0])
	}
	if m[2].SuperOptions != "rw,cpu,cpuacct" || m[2].MountPoint != "/sys/fs/cgroup/cpu,cpuacct" {
		t.Errorf("entry 2: %+v", m[2])
	}
	if m[3].Root != "/srv/sock" || m[3].MountPoint != "/run/kibotos/sock" {
		t.Errorf("entry 3: %+v", m[3])
	}
	if _, err := Read(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing file read")
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"plain": "plain", `a\040b`: "a b", `tab\011`: "tab\t", `back\134slash`: `back\slash`,
		`\04`: `\04`, `\999x`: `\999x`, `end\`: `end\`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
