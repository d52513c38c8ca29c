package kibotos_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/guest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// TestMain runs an in-process ctrl with its data plane and a node (the
// runtime double of agenttest, whose guests are a fakeGuest) for the
// examples, and points the KIBO_* variables at it, so
// that the examples connect with kibotos.NewClientFromEnv exactly as a
// program run after scripts/dev.sh's export line does. Tests that read
// the environment set every variable they depend on.
func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runWithExampleServer(m))
}

func runWithExampleServer(m *testing.M) int {
	tb := &mainTB{name: "TestMain"}
	defer tb.cleanup()
	rt := agenttest.New()
	rt.Guest = newFakeGuest() // the guests of ExampleWorkspace_ExecCommand
	filesPath, files := guestv1connect.NewFileServiceHandler(guest.NewFileService(tb.TempDir()))
	rt.GuestServices = map[string]http.Handler{filesPath: files} // ExampleWorkspace_Files
	tb.Cleanup(rt.Close)
	e := ctrltest.New(tb, ctrltest.Options{Runtime: rt, DataPlane: true})
	if tb.Failed() {
		return 1
	}
	if err := waitForCapability(e, capability.WorkspaceCreate); err != nil {
		fmt.Fprintln(os.Stderr, "TestMain:", err)
		return 1
	}
	profile := filepath.Join(tb.TempDir(), "profile.json")
	if err := os.WriteFile(profile, []byte("{}\n"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "TestMain:", err)
		return 1
	}
	for k, v := range map[string]string{
		"KIBO_ENDPOINT": e.URL, "KIBO_CA": e.PKI.CA, "KIBO_CERT": e.PKI.Operator, "KIBO_KEY": e.PKI.OperatorKey,
		"KIBO_PROFILE": profile, // not the user's own default profile
	} {
		os.Setenv(k, v)
	}
	return m.Run()
}

// waitForCapability waits until the server lists name: ctrl lists the
// workspace capabilities once a node registered.
func waitForCapability(e *ctrltest.Env, name string) error {
	c := e.Clients(e.HTTP)
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := c.ServerInfo.GetServerInfo(context.Background(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err == nil && slices.Contains(res.Msg.GetCapabilities(), name) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server does not list %s after 20s (last error: %v)", name, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mainTB is the testing.TB of TestMain, which has none: enough for
// ctrltest to set up a server that lives as long as the test binary.
// Failures are printed and remembered; FailNow ends the process.
type mainTB struct {
	testing.TB // nil; only its unexported method is used

	name string

	mu       sync.Mutex
	failed   bool
	cleanups []func()
	dirs     []string
	ctx      context.Context
	cancel   context.CancelFunc
}

func (tb *mainTB) Name() string               { return tb.name }
func (tb *mainTB) Helper()                    {}
func (tb *mainTB) Attr(key, value string)     {}
func (tb *mainTB) Output() io.Writer          { return os.Stderr }
func (tb *mainTB) Log(args ...any)            { fmt.Fprintln(os.Stderr, append([]any{tb.name + ":"}, args...)...) }
func (tb *mainTB) Logf(f string, args ...any) { tb.Log(fmt.Sprintf(f, args...)) }
func (tb *mainTB) Error(args ...any)          { tb.Log(args...); tb.Fail() }
func (tb *mainTB) Errorf(f string, a ...any)  { tb.Logf(f, a...); tb.Fail() }
func (tb *mainTB) Fatal(args ...any)          { tb.Log(args...); tb.FailNow() }
func (tb *mainTB) Fatalf(f string, a ...any)  { tb.Logf(f, a...); tb.FailNow() }
func (tb *mainTB) Skip(args ...any)           { tb.Fatal(append([]any{"skip:"}, args...)...) }
func (tb *mainTB) Skipf(f string, a ...any)   { tb.Fatalf("skip: "+f, a...) }
func (tb *mainTB) SkipNow()                   { tb.Fatal("skip") }
func (tb *mainTB) Skipped() bool              { return false }
func (tb *mainTB) Setenv(key, value string)   { os.Setenv(key, value) }
func (tb *mainTB) Chdir(dir string)           { tb.Fatal("Chdir is not supported in TestMain") }

func (tb *mainTB) Fail() {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.failed = true
}

func (tb *mainTB) Failed() bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.failed
}

func (tb *mainTB) FailNow() {
	tb.cleanup()
	os.Exit(1)
}

func (tb *mainTB) Cleanup(f func()) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.cleanups = append(tb.cleanups, f)
}

func (tb *mainTB) TempDir() string {
	dir, err := os.MkdirTemp("", "kibotos-example-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.mu.Lock()
	tb.dirs = append(tb.dirs, dir)
	tb.mu.Unlock()
	return dir
}

func (tb *mainTB) ArtifactDir() string { return tb.TempDir() }

func (tb *mainTB) Context() context.Context {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.ctx == nil {
		tb.ctx, tb.cancel = context.WithCancel(context.Background())
	}
	return tb.ctx
}

// cleanup runs the cleanups, last first, then removes the temporary
// directories.
func (tb *mainTB) cleanup() {
	tb.mu.Lock()
	cleanups, dirs, cancel := tb.cleanups, tb.dirs, tb.cancel
	tb.cleanups, tb.dirs, tb.cancel = nil, nil, nil
	tb.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	for _, f := range slices.Backward(cleanups) {
		f()
	}
	for _, d := range dirs {
		os.RemoveAll(d)
	}
}
