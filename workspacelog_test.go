package kibotos_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// TestReadLog: Workspace.ReadLog against a ctrl whose node keeps logs in a
// directory: all of it, its tail, and a follower that gets an appended line
// and returns nil when its context ends.
func TestReadLog(t *testing.T) {
	t.Parallel()
	rt := agenttest.New()
	rt.LogDir = t.TempDir()
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt, DataPlane: true})
	if err := waitForCapability(e, capability.WorkspaceCreate); err != nil {
		t.Fatal(err)
	}
	c, err := kibotos.NewClient(e.URL, kibotos.WithTLSFiles(e.PKI.CA, e.PKI.Operator, e.PKI.OperatorKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ws, err := c.Workspaces().Create(t.Context(), kibotos.WorkspaceSpec{MemoryMiB: 256, CPUMillis: 500})
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(rt.LogDir, ws.ID()+".log")
	if err := os.WriteFile(p, []byte("one\ntwo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := ws.ReadLog(t.Context(), &b, kibotos.LogOptions{}); err != nil || b.String() != "one\ntwo\n" {
		t.Errorf("ReadLog = %q, %v", b.String(), err)
	}
	b.Reset()
	if err := ws.ReadLog(t.Context(), &b, kibotos.LogOptions{TailBytes: 4}); err != nil || b.String() != "two\n" {
		t.Errorf("ReadLog(tail 4) = %q, %v", b.String(), err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := newLinePipe()
	done := make(chan error, 1)
	go func() { done <- ws.ReadLog(ctx, pw, kibotos.LogOptions{Follow: true, TailBytes: 4}) }()
	if got := <-pr; got != "two\n" {
		t.Errorf("follower's first write %q", got)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("three\n")
	f.Close()
	select {
	case got := <-pr:
		if got != "three\n" {
			t.Errorf("followed %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the appended line did not come")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("follower ended with %v", err)
	}
}

// linePipe passes each Write to a channel.
type linePipe chan string

func newLinePipe() (<-chan string, linePipe) {
	ch := make(chan string, 16)
	return ch, linePipe(ch)
}

func (l linePipe) Write(p []byte) (int, error) {
	l <- string(p)
	return len(p), nil
}
