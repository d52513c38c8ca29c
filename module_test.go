package kibotos_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLocalCheckoutRecipe proves the recipe of docs/sdk.md for using the SDK
// from a local checkout, offline: a new module, a replace directive to this
// checkout, go get, go build — with GOPROXY=off, so that only the module
// cache serves the SDK's dependencies, and the checkout's go.sum copied
// first, so that nothing asks the checksum database. The program built is
// the one docs/sdk.md shows; it then runs against the in-process server of
// TestMain, with the KIBO_* variables a dev.sh export line sets.
func TestLocalCheckoutRecipe(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH: cannot check the local-checkout recipe")
	}
	checkout, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(checkout, "docs", "sdk.md"))
	if err != nil {
		t.Fatal(err)
	}
	program := goProgram(string(doc))
	if program == "" {
		t.Fatal("docs/sdk.md has no ```go fence holding a package main")
	}

	dir := t.TempDir()
	env := append(os.Environ(),
		"GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local",
		"GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"))
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(goCmd, args...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run("mod", "init", "example.com/sdkdemo")
	sums, err := os.ReadFile(filepath.Join(checkout, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sums))
	write("main.go", program)
	run("mod", "edit", "-replace", "github.com/kibotos/kibotos="+checkout)
	run("get", "github.com/kibotos/kibotos")
	bin := filepath.Join(dir, "sdkdemo")
	run("build", "-o", bin, ".")

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Dir = t.TempDir()
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the program of docs/sdk.md: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	states := regexp.MustCompile(`ws-\S+ (WORKSPACE_STATE_\w+)`).FindAllStringSubmatch(stdout.String(), -1)
	var got []string
	for _, m := range states {
		got = append(got, m[1])
	}
	want := []string{"WORKSPACE_STATE_AVAILABLE", "WORKSPACE_STATE_STOPPED", "WORKSPACE_STATE_AVAILABLE", "WORKSPACE_STATE_DELETED"}
	if !slices.Equal(got, want) {
		t.Errorf("the program printed the states %v, want %v\nstdout:\n%s", got, want, stdout.String())
	}
	if !strings.Contains(stderr.String(), "command ID cmd-") {
		t.Errorf("the program did not print the command ID before creating; stderr:\n%s", stderr.String())
	}
}

// goProgram returns the first ```go fence of a Markdown document that holds
// a package main.
func goProgram(doc string) string {
	for _, block := range strings.Split(doc, "```go\n")[1:] {
		body, _, ok := strings.Cut(block, "\n```")
		if ok && strings.Contains(body, "package main\n") {
			return body + "\n"
		}
	}
	return ""
}
