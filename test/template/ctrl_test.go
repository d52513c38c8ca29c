package template

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/node/netattach"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/pki"
)

// runThroughCtrl is the user's path of issue 14 with the real binaries: a
// `kibotos-ctrl --dev` (SQLite, its embedded node), the tarball published
// with `kibo template publish` and made the default, then
// `kibo workspace create --template debian` and
// `kibo workspace exec WS -- python3 -c 'print(42)'`.
func runThroughCtrl(t *testing.T, tarball string) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../../cmd/kibotos-ctrl", "../../cmd/kibotos-guest", "../../cmd/kibo")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	data := t.TempDir()
	stateDir := filepath.Join(data, "node")
	t.Cleanup(func() {
		if err := netattach.BackstopOf(stateDir).Remove(); err != nil {
			t.Logf("remove the node's backstop: %v", err)
		}
	})
	t.Cleanup(func() {
		if err := sandbox.Cleanup(stateDir); err != nil {
			t.Logf("sandbox.Cleanup: %v", err)
		}
	})
	ctrl := exec.Command(filepath.Join(bin, "kibotos-ctrl"), "--dev", "--data-dir", data, "--listen", "127.0.0.1:0",
		"--guest-binary", filepath.Join(bin, "kibotos-guest"))
	stdout, err := ctrl.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	ctrl.Stderr = &stderr
	if err := ctrl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ctrl.Process.Kill(); _ = ctrl.Wait() })
	serving := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "kibotos-ctrl is serving on "); ok {
				serving <- rest
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var url string
	select {
	case url = <-serving:
	case <-time.After(60 * time.Second):
		t.Fatalf("kibotos-ctrl did not start; stderr:\n%s", stderr.String())
	}
	paths := pki.DevPathsIn(data)
	kibo := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "kibo"), args...)
		cmd.Env = append(os.Environ(), "KIBO_ENDPOINT="+url, "KIBO_CA="+paths.CA, "KIBO_CERT="+paths.Operator, "KIBO_KEY="+paths.OperatorKey)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("kibo %s: %v\n%s%s\nctrl stderr:\n%s", strings.Join(args, " "), err, out.String(), errb.String(), stderr.String())
		}
		return strings.TrimSpace(out.String())
	}
	began := time.Now()
	kibo("template", "publish", tarball, "--template", "debian")
	kibo("template", "set-default", "debian", "1", "--expect-no-default")
	t.Logf("published and made the default: %s", time.Since(began).Round(time.Millisecond))
	began = time.Now()
	ws := kibo("workspace", "create", "--template", "debian", "--memory-mib", "512", "--cpu-millis", "1000", "--wait", "-q")
	t.Logf("workspace %s AVAILABLE: %s", ws, time.Since(began).Round(time.Millisecond))
	if got := kibo("workspace", "exec", ws, "--", "python3", "-c", "print(42)"); got != "42" {
		t.Fatalf("python3 -c 'print(42)' printed %q", got)
	}
	if got := kibo("workspace", "exec", ws, "--", "runuser", "-u", "user", "--", "id", "-u"); got != "1000" {
		t.Fatalf("id -u of user printed %q", got)
	}
	kibo("workspace", "delete", ws, "--expected-expiration-revision", "current")
}
