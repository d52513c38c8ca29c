package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// TestLogsCommand: "workspace logs" prints the log its node keeps (the
// rotated file, then the current one), --tail its end; -f prints what is
// appended and exits 0 when interrupted; an unknown Workspace is not_found,
// a server without workspace.exec 14.
func TestLogsCommand(t *testing.T) {
	t.Parallel()
	rt := agenttest.New()
	rt.LogDir = t.TempDir()
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt})
	c := conn(e)
	waitWorkspaceServed(t, c)
	id := strings.TrimSpace(kibo(t, args(c, "workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "-q", "--wait")...).want(t, ExitOK).stdout)
	p := filepath.Join(rt.LogDir, id+".log")
	if err := os.WriteFile(p+".1", []byte("guest: started\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("pid 1: hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := kibo(t, args(c, "workspace", "logs", id)...).want(t, ExitOK); r.stdout != "guest: started\npid 1: hello\n" {
		t.Errorf("logs: %q", r.stdout)
	}
	if r := kibo(t, args(c, "workspace", "logs", id, "--tail", "6")...).want(t, ExitOK); r.stdout != "hello\n" {
		t.Errorf("logs --tail 6: %q", r.stdout)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, testEnv(t), args(c, "workspace", "logs", id, "-f", "--tail", "6"), strings.NewReader(""), &stdout, &stderr)
	}()
	wait := func(want string) {
		t.Helper()
		for end := time.Now().Add(20 * time.Second); stdout.String() != want; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("followed %q, want %q; stderr %q", stdout.String(), want, stderr.String())
			}
		}
	}
	wait("hello\n")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("a new line\n")
	f.Close()
	wait("hello\na new line\n")
	cancel()
	select {
	case code := <-done:
		if code != ExitOK {
			t.Errorf("logs -f exit code %d after the interrupt; stderr %q", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("logs -f still runs 10s after the interrupt")
	}

	kibo(t, args(c, "workspace", "logs", "ws-unknownunknownunkn")...).want(t, int(connect.CodeNotFound))
	bare := ctrltest.New(t, ctrltest.Options{})
	kibo(t, args(conn(bare), "workspace", "logs", id)...).want(t, ExitUnavailable)
}
