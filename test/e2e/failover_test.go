package e2e

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/node/ctrlset"
	"github.com/kibotos/kibotos/internal/pki"
)

// streamLog records when the agent's streams opened, and to which URL.
type streamLog struct {
	mu   sync.Mutex
	open []streamOpen
	warn []string // the agent's last warnings, shown when a wait fails
	ch   chan struct{}
}

type streamOpen struct {
	url string
	at  time.Time
}

func (l *streamLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *streamLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *streamLog) WithGroup(string) slog.Handler            { return l }
func (l *streamLog) Handle(_ context.Context, r slog.Record) error {
	var url string
	attrs := []string{r.Message}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "url" {
			url = a.Value.String()
		}
		attrs = append(attrs, a.String())
		return true
	})
	l.mu.Lock()
	if r.Level >= slog.LevelWarn {
		l.warn = append(l.warn, r.Time.Format(time.RFC3339Nano)+" "+strings.Join(attrs, " "))
		if len(l.warn) > 20 {
			l.warn = l.warn[1:]
		}
	}
	if r.Message != "ctrl stream open" {
		l.mu.Unlock()
		return nil
	}
	l.open = append(l.open, streamOpen{url: url, at: time.Now()})
	l.mu.Unlock()
	select {
	case l.ch <- struct{}{}:
	default:
	}
	return nil
}

// waitOpen waits until a stream to url (any URL when empty) opened after
// since, and returns that opening.
func (l *streamLog) waitOpen(t *testing.T, url string, since time.Time, bound time.Duration) streamOpen {
	t.Helper()
	deadline := time.After(bound)
	for {
		l.mu.Lock()
		for _, o := range l.open {
			if (url == "" || o.url == url) && !o.at.Before(since) {
				l.mu.Unlock()
				return o
			}
		}
		l.mu.Unlock()
		select {
		case <-l.ch:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			l.mu.Lock()
			t.Fatalf("no stream to %q within %v of %v; streams opened: %v; the agent's last warnings:\n%s",
				url, bound, since.Format(time.RFC3339Nano), l.open, strings.Join(l.warn, "\n"))
		}
	}
}

// TestNodeFailsOverBetweenReplicas runs two kibotos-ctrl replicas on one
// PostgreSQL database and a node agent (the runtime double) given both
// URLs: when the replica holding the node's stream is killed, the node
// opens a stream to the other within a few seconds, and a workspace
// created through the other becomes AVAILABLE.
func TestNodeFailsOverBetweenReplicas(t *testing.T) {
	url := pgSchema(t)
	e := newSoakEnv(t, 2, "--dev-no-node", "--store", url, "--log-level", "info")

	logs := e.startDoubleNode("failover", 0, 1)

	// The replica holding the stream is the one the node's first stream
	// opened to: the set's current endpoint, read before that, may still
	// move when a first attempt fails under load.
	first := 0
	if logs.waitOpen(t, "", time.Time{}, 30*time.Second).url == e.url(1) {
		first = 1
	}
	other := 1 - first
	e.waitCapability(first, capability.WorkspaceCreate)
	before := e.createOne(first, "before")
	t.Logf("node on replica %d; a create through it: AVAILABLE in %v", first, before)

	killed := time.Now()
	_ = e.procs[first].cmd.Process.Signal(syscall.SIGKILL)
	_ = e.procs[first].cmd.Wait()
	opened := logs.waitOpen(t, e.url(other), killed, 10*time.Second)
	reconnect := opened.at.Sub(killed)
	e.waitCapability(other, capability.WorkspaceCreate)
	after := e.createOne(other, "after")
	t.Logf("replica %d SIGKILLed: the node's stream to replica %d open after %v; a create through it: AVAILABLE in %v (%v after the kill)",
		first, other, reconnect.Round(time.Millisecond), after, time.Since(killed).Round(time.Millisecond))
	if reconnect > 5*time.Second {
		t.Errorf("reconnect took %v, want at most 5s", reconnect)
	}
}

// createOne creates a workspace through replica i and waits until it is
// AVAILABLE there; it returns how long that took.
func (e *soakEnv) createOne(i int, name string) time.Duration {
	t := e.t
	start := time.Now()
	ws := e.ws(i)
	r, err := ws.CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md("failover-" + name), TemplateId: soakTemplate,
		Resources: &ctrlv1.Resources{MemoryMib: 16, CpuMillis: 100}, WritableLayerCapacityBytes: 64 << 20}))
	if err != nil {
		t.Fatalf("create through replica %d: %v", i, err)
	}
	id := r.Msg.GetWorkspace().GetWorkspaceId()
	deadline := time.Now().Add(30 * time.Second)
	for {
		g, err := ws.GetWorkspace(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err == nil && g.Msg.GetWorkspace().GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			return time.Since(start).Round(time.Millisecond)
		}
		if err == nil && strings.Contains(g.Msg.GetWorkspace().GetState().String(), "FAILED") {
			t.Fatalf("workspace %s through replica %d: %v", id, i, g.Msg.GetWorkspace())
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace %s through replica %d not AVAILABLE within 30s: %v %v", id, i, g.Msg.GetWorkspace().GetState(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startDoubleNode runs a node agent named id with the runtime double (a
// large capacity, the soak template) in the test process, given the URLs
// of the replicas listed; it returns its log.
func (e *soakEnv) startDoubleNode(id string, replicas ...int) *streamLog {
	t := e.t
	var list []string
	for _, i := range replicas {
		list = append(list, e.url(i))
	}
	p := pki.DevPathsIn(e.dataDir)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	if err := pki.IssueClient(p.CA, p.CAKey, id, pki.RoleNode, 24*time.Hour, cert, key); err != nil {
		t.Fatal(err)
	}
	tlsc, err := pki.ClientConfig(p.CA, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	urls, err := ctrlset.Parse([]string{strings.Join(list, ",")})
	if err != nil {
		t.Fatal(err)
	}
	set, err := ctrlset.New(ctrlset.Config{URLs: urls, TLS: tlsc})
	if err != nil {
		t.Fatal(err)
	}
	logs := &streamLog{ch: make(chan struct{}, 1)}
	a := agent.New(agent.Config{
		NodeID: id, Ctrl: set, Runtime: agenttest.New(),
		Capacity: &nodev1.Capacity{MemoryMib: 1 << 20, CpuMillis: 64000, StorageBytes: 1 << 40, StoragePool: id},
		Log:      slog.New(logs), Heartbeat: time.Second,
		Templates: func() []*nodev1.TemplateInfo {
			return []*nodev1.TemplateInfo{{TemplateId: soakTemplate, Version: "soak-1"}}
		},
	})
	runAgent(t, a)
	return logs
}
