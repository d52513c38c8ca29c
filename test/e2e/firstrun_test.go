package e2e

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

// The first run on a fresh machine, as the README tells it: scripts/dev.sh
// (kibotos-ctrl --dev --data-dir .data, a relative directory), the export
// line it prints, then kibo from wherever the operator stands.

// TestFirstRunRelativeDataDir: a relative --data-dir used to reach the
// sandbox as a relative template directory, and every start failed.
func TestFirstRunRelativeDataDir(t *testing.T) {
	requireRoot(t)
	buildBinary(t, "kibo") // next to kibotos-ctrl, as in bin/: the export line then puts it on PATH
	work := t.TempDir()
	dataDir := filepath.Join(work, ".data")
	t.Cleanup(func() { // runs after ctrl is killed (cleanups run last first)
		if err := sandbox.Cleanup(filepath.Join(dataDir, "node")); err != nil {
			t.Logf("sandbox.Cleanup: %v", err)
		}
	})
	removeBackstop(t, filepath.Join(dataDir, "node"))
	cmd := exec.Command(filepath.Join(binDir, "kibotos-ctrl"), "--dev", "--data-dir", ".data", "--listen", "127.0.0.1:0")
	cmd.Dir = work
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "export ") {
				found <- line
			}
		}
	}()
	var export string
	select {
	case export = <-found:
	case <-time.After(30 * time.Second):
		t.Fatalf("kibotos-ctrl printed no export line; stderr:\n%s", stderr.String())
	}
	for _, want := range []string{
		"KIBO_CA=" + filepath.Join(dataDir, "pki", "ca.pem") + " ",
		"KIBO_CERT=" + filepath.Join(dataDir, "pki", "operator.pem") + " ",
		"KIBO_KEY=" + filepath.Join(dataDir, "pki", "operator-key.pem") + " ",
		"PATH=" + binDir + ":$PATH",
	} {
		if !strings.Contains(export, want) {
			t.Errorf("export line %q lacks %q", export, want)
		}
	}

	url := strings.TrimPrefix(strings.Fields(strings.TrimPrefix(export, "export "))[0], "KIBO_ENDPOINT=")
	hc := operatorClient(t, dataDir)
	info := ctrlv1connect.NewServerInfoServiceClient(hc, url)
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := info.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err == nil && contains(res.Msg.GetCapabilities(), "workspace.create") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace.create never advertised (%v); stderr:\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The README's command, from another directory, with only the export line.
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "-c", export+" && cd / && kibo workspace create --memory-mib 128 --cpu-millis 500 --writable-layer-mib 64 --command-id firstrun-1 --wait -o json")
	sh.Dir = t.TempDir()
	out, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("kibo workspace create --wait: %v\n%s\nctrl stderr:\n%s", err, out, stderr.String())
	}
	ws := ctrlv1connect.NewWorkspaceServiceClient(hc, url)
	list, err := ws.ListWorkspaces(t.Context(), connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.Msg.GetWorkspaces()); n != 1 || list.Msg.GetWorkspaces()[0].GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("after kibo workspace create --wait: %d workspaces %v, want one AVAILABLE\n%s", n, list.Msg.GetWorkspaces(), out)
	}
	id := list.Msg.GetWorkspaces()[0].GetWorkspaceId()
	if _, err := ws.DeleteWorkspace(t.Context(), connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{
		Metadata: md("firstrun-del"), WorkspaceId: id, ExpectedExpirationRevision: 1})); err != nil {
		t.Fatalf("delete: %v\nctrl stderr:\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), "embedded node agent stopped") {
		t.Fatalf("the embedded node stopped:\n%s", stderr.String())
	}
}

// TestFirstRunRefusedAtStartup: a machine that cannot run workspaces is
// refused when ctrl --dev (or kibotos-node) starts, with what to do, instead
// of a ctrl that accepts creates that never complete.
func TestFirstRunRefusedAtStartup(t *testing.T) {
	nodeBin := nodeBinary(t)
	type tc struct {
		name string
		cmd  *exec.Cmd
		want []string
	}
	ctrl := func(env []string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(binDir, "kibotos-ctrl"), append([]string{"--dev", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		return cmd
	}
	cases := []tc{
		{"ctrl, busybox missing", ctrl([]string{"KIBOTOS_BUSYBOX=/nonexistent/busybox"}), []string{"busybox-static", "/nonexistent/busybox"}},
		{"ctrl, --busybox missing", ctrl(nil, "--busybox", "/nonexistent/busybox"), []string{"busybox-static"}},
		{"node, busybox missing", func() *exec.Cmd {
			cmd := exec.Command(nodeBin, "--ctrl", "https://127.0.0.1:1", "--ca", "/nonexistent/ca.pem", "--state-dir", t.TempDir(),
				"--guest-binary", filepath.Join(binDir, "kibotos-guest"))
			cmd.Env = append(os.Environ(), "KIBOTOS_BUSYBOX=/nonexistent/busybox")
			return cmd
		}(), []string{"busybox-static"}},
	}
	if _, err := exec.LookPath("gcc"); err == nil {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nimport \"C\"\n\nfunc main() {}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		build := exec.Command("go", "build", "-o", "kibotos-guest", "main.go")
		build.Dir = dir
		build.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build a dynamic executable: %v\n%s", err, out)
		}
		cases = append(cases, tc{"ctrl, dynamic guest", ctrl(nil, "--guest-binary", filepath.Join(dir, "kibotos-guest")),
			[]string{"is dynamically linked (needs /lib", "CGO_ENABLED=0"}})
	} else {
		t.Log("no gcc: the dynamic guest case is left out")
	}
	for _, c := range cases {
		var out bytes.Buffer
		c.cmd.Stdout, c.cmd.Stderr = &out, &out
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- c.cmd.Wait() }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s: exited 0, want a failure\n%s", c.name, out.String())
			}
		case <-time.After(30 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
			t.Errorf("%s: still running after 30s, want a failure at start-up\n%s", c.name, out.String())
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s: output lacks %q:\n%s", c.name, w, out.String())
			}
		}
		if strings.Contains(out.String(), "serving on") {
			t.Errorf("%s: served anyway:\n%s", c.name, out.String())
		}
	}
}

// TestDevScriptMissingPackages: scripts/dev.sh, from another directory, on a
// machine without busybox-static and told not to install: one line saying
// what to install (or, without root, that it needs root), a failure, and
// nothing built or started.
func TestDevScriptMissingPackages(t *testing.T) {
	script, err := filepath.Abs("../../scripts/dev.sh")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "KIBOTOS_BUSYBOX=/nonexistent/busybox", "KIBOTOS_NO_INSTALL=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("dev.sh exited 0:\n%s", out)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	want := "apt-get install -y busybox-static"
	if os.Geteuid() != 0 {
		want = "need root"
	}
	if len(lines) != 1 || !strings.Contains(lines[0], want) {
		t.Fatalf("dev.sh printed %q, want one line containing %q", out, want)
	}
}

// syncBuffer is a bytes.Buffer safe for a process writing while the test
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
