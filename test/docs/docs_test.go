package docs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDocumentedCommands follows the README and the docs word for word, as a
// new user would, on a fresh copy of the repository: it runs the README's
// run command (scripts/dev.sh), pastes the export line it prints into a shell
// in another directory, and runs every command of the README, the quick
// start and every kibo example of docs/*.md, checking each exit code.
func TestDocumentedCommands(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: scripts/dev.sh runs real workspaces (namespaces, cgroups, loop devices); .ci/run runs it as root")
	}
	if testing.Short() {
		t.Skip("builds every binary and runs a dev deployment; skipped with -short")
	}
	repo := freshCopy(t)
	u := &user{t: t, repo: repo, home: t.TempDir(), cwd: t.TempDir(), ids: ids{}}
	t.Cleanup(u.stopServer)

	for _, doc := range []string{"README.md", "docs/quickstart.md", "docs/cli.md", "docs/workspaces.md", "docs/operations.md", "docs/api.md", "docs/sdk.md"} {
		data, err := os.ReadFile(filepath.Join(repo, doc))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		u.functions = nil
		for _, c := range Extract(string(data)) {
			u.run(doc, c)
		}
	}
	u.cleanUp()
}

// user is the person following the docs: one dev server, a shell in another
// directory, the IDs seen so far.
type user struct {
	t         *testing.T
	repo      string
	home, cwd string
	ids       ids
	// exports is the export line the server printed.
	exports string
	// functions are the shell functions the current document defined.
	functions []string
	server    *exec.Cmd
	serverCmd string
	serverOut *bytes.Buffer
}

// run runs one documented command.
func (u *user) run(doc string, c Command) {
	t := u.t
	where := fmt.Sprintf("%s:%d", doc, c.Line)
	text := u.ids.substitute(c.Text)
	switch first := FirstWord(text); {
	case first == "scripts/dev.sh":
		u.startServer(where, text)
		return
	case strings.HasSuffix(first, "()") || strings.Contains(strings.SplitN(text, "\n", 2)[0], "() {"):
		u.functions = append(u.functions, text)
		return
	case first == "kibo" || first == "bin/kibo" || first == "curl":
	case len(u.functions) > 0 && isFunction(u.functions, first):
	default:
		t.Logf("%s: not run (not a kibo, curl or dev.sh command): %s", where, firstLine(text))
		return
	}
	if u.exports == "" {
		t.Fatalf("%s: %q comes before any scripts/dev.sh", where, firstLine(text))
	}
	want := ExpectedExit(c.Text)
	script := u.exports + "\n" + strings.Join(u.functions, "\n") + "\n" + text
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = u.cwd
	cmd.Env = u.env()
	cmd.Stdin = strings.NewReader("docs-test-password\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	u.ids.see(stdout.String())
	u.ids.see(stderr.String())
	t.Logf("%s: %s → exit %d in %v", where, firstLine(text), code, time.Since(start).Round(time.Millisecond))
	if code != want {
		t.Errorf("%s: %s\nexit %d, want %d\nstdout:\n%s\nstderr:\n%s", where, text, code, want, stdout.String(), stderr.String())
	}
}

// env is the environment of the user's second terminal: no KIBO_*
// settings of the test's own, a home of its own. Go's module and build
// caches stay those of the test (unless the environment names others):
// what the docs prove is that their commands work, and .ci/run's own first
// build is the cold one; a cold build again under a fresh home took more
// than the 8 minutes startServer allows on a loaded two-core machine.
func (u *user) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KIBO_") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	for _, name := range []string{"GOMODCACHE", "GOCACHE", "GOPATH"} {
		if os.Getenv(name) != "" {
			continue
		}
		if out, err := exec.Command("go", "env", name).Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
			env = append(env, name+"="+string(bytes.TrimSpace(out)))
		}
	}
	return append(env, "HOME="+u.home)
}

// startServer runs a documented scripts/dev.sh line in the repository and
// waits for its export line. The same line again keeps the running server;
// another one replaces it.
func (u *user) startServer(where, text string) {
	t := u.t
	if u.server != nil && text == u.serverCmd {
		return
	}
	u.stopServer()
	cmd := exec.Command("bash", "-c", text)
	cmd.Dir = u.repo
	cmd.Env = append(u.env(), "KIBOTOS_LISTEN="+freeAddr(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	u.serverOut = &bytes.Buffer{}
	cmd.Stderr = u.serverOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	u.server, u.serverCmd = cmd, text
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "export ") && !sent {
				lines <- l
				sent = true
			}
		}
		_, _ = io.Copy(io.Discard, out)
		close(lines)
	}()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatalf("%s: %s exited without printing an export line; stderr:\n%s", where, text, u.serverOut)
		}
		u.exports = l
	case <-time.After(8 * time.Minute):
		t.Fatalf("%s: %s printed no export line in 8 minutes; stderr:\n%s", where, text, u.serverOut)
	}
	t.Logf("%s: %s → %s", where, text, u.exports)
}

// stopServer stops the dev server as a user does, with Ctrl-C (SIGINT to
// its process group).
func (u *user) stopServer() {
	if u.server == nil {
		return
	}
	_ = syscall.Kill(-u.server.Process.Pid, syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- u.server.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-u.server.Process.Pid, syscall.SIGKILL)
		<-done
		u.t.Errorf("the dev server did not stop within 30s of Ctrl-C; stderr:\n%s", u.serverOut)
	}
	u.server = nil
}

// cleanUp deletes what the docs left behind, through kibo, so that no
// workspace outlives the test, and fails the test if the docs' own clean-up
// left workspaces.
func (u *user) cleanUp() {
	if u.server == nil {
		return
	}
	script := u.exports + `
set -e
left=$(kibo workspace list --all -o name)
for id in $left; do
  kibo workspace delete "$id" --expected-expiration-revision current --command-id "docs-test-cleanup-$id" >/dev/null || true
done
echo "$left"`
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir, cmd.Env = u.cwd, u.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		u.t.Errorf("clean-up: %v\n%s", err, out)
	}
	if left := strings.TrimSpace(string(out)); left != "" {
		u.t.Logf("workspaces the docs left running (deleted by the test): %s", left)
	}
	u.stopServer()
}

// freshCopy is the repository as a fresh clone of it would be: the tracked
// and the new, not ignored, files of the work tree, with its git history
// (build.sh stamps the revision), and no bin/ or .data/.
func freshCopy(t *testing.T) string {
	t.Helper()
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	src := strings.TrimSpace(string(root))
	dst := filepath.Join(t.TempDir(), "kibotos")
	if out, err := exec.Command("git", "clone", "--quiet", "--no-hardlinks", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	files, err := exec.Command("git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(files), "\x00"), "\x00") {
		fi, err := os.Lstat(filepath.Join(src, f))
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or not a file
		}
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), data, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// isFunction reports whether name is one of the shell functions defined.
func isFunction(defs []string, name string) bool {
	for _, d := range defs {
		if strings.HasPrefix(strings.TrimSpace(d), name+"()") || strings.HasPrefix(strings.TrimSpace(d), name+" ()") {
			return true
		}
	}
	return false
}
