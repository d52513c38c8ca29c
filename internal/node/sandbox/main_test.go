package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/node/template"
)

// The tests run real executions: root, cgroups, loop devices, overlayfs and
// Debian's busybox-static. Without root they skip, except under CI=true where
// that is a failure.

var (
	testGuest    string // static kibotos-guest built for the tests
	testTemplate string // default template rootfs
	// testRuns holds one directory per test run, named after the test
	// process, so that concurrent runs on one host never touch each other
	// and a later run can clean up after a crashed one.
	testRuns   = filepath.Join(os.TempDir(), "kibotos-sandbox-test")
	testBase   string
	skipReason string
)

func TestMain(m *testing.M) {
	if MaybeRunInit() {
		return
	}
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	ci := os.Getenv("CI") == "true"
	if os.Geteuid() != 0 {
		if ci {
			fmt.Fprintln(os.Stderr, "FAIL: the sandbox tests need root and CI=true is set")
			return 1
		}
		skipReason = "the sandbox runtime needs root; run the tests as root"
		return m.Run()
	}
	if os.Getenv(helperEnv) != "" {
		// A helper process of a test (helperNode): the parent's binaries.
		testGuest, testTemplate = os.Getenv("KIBOTOS_TEST_GUEST"), os.Getenv("KIBOTOS_TEST_TEMPLATE")
		return m.Run()
	}
	cleanupDeadRuns()
	self, _ := procStartTime(os.Getpid())
	testBase = filepath.Join(testRuns, fmt.Sprintf("run-%d-%d", os.Getpid(), self))
	if err := os.MkdirAll(testBase, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "kibotos-sandbox-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	testGuest = filepath.Join(tmp, "kibotos-guest")
	build := exec.Command("go", "build", "-trimpath", "-o", testGuest, "github.com/kibotos/kibotos/cmd/kibotos-guest")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build kibotos-guest: %v\n%s\n", err, out)
		return 1
	}
	testTemplate, err = template.EnsureDefault(filepath.Join(testBase, "templates"), testGuest, "")
	if err != nil {
		if !ci && strings.Contains(err.Error(), "busybox-static") {
			skipReason = err.Error()
			return m.Run()
		}
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	code := m.Run()
	cleanupRun(testBase)
	return code
}

// cleanupDeadRuns removes what test runs whose process is gone left behind.
func cleanupDeadRuns() {
	ents, err := os.ReadDir(testRuns)
	if err != nil {
		return
	}
	for _, e := range ents {
		var pid int
		var start uint64
		if _, err := fmt.Sscanf(e.Name(), "run-%d-%d", &pid, &start); err == nil {
			if st, err := procStartTime(pid); err == nil && st == start {
				continue // still running
			}
		}
		cleanupRun(filepath.Join(testRuns, e.Name()))
	}
}

func cleanupRun(base string) {
	if ents, err := os.ReadDir(base); err == nil {
		for _, e := range ents {
			if err := Cleanup(filepath.Join(base, e.Name())); err != nil {
				fmt.Fprintln(os.Stderr, "cleanup:", err)
			}
		}
	}
	os.RemoveAll(base)
}
