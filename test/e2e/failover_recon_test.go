package e2e

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/node/ctrlset"
	"github.com/kibotos/kibotos/internal/pki"
)

// TestReplicaLearnsNodeOfAnother: two kibotos-ctrl replicas on one
// PostgreSQL database, both started before any node; a node agent given
// only replica 1's address registers there. Replica 0, which never holds
// its stream, advertises workspace.create within 2 s (it learns the node
// from the notification of the registering commit), and a create through
// it completes on the node connected to replica 1.
func TestReplicaLearnsNodeOfAnother(t *testing.T) {
	url := pgSchema(t)
	e := newSoakEnv(t, 2, "--dev-no-node", "--store", url, "--log-level", "info")
	info0 := ctrlv1connect.NewServerInfoServiceClient(e.hc, e.url(0))
	serves := func() bool {
		r, err := info0.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		return err == nil && slices.Contains(r.Msg.GetCapabilities(), capability.WorkspaceCreate)
	}
	if serves() {
		t.Fatal("replica 0 advertises workspace.create before any node registered")
	}

	p := pki.DevPathsIn(e.dataDir)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	if err := pki.IssueClient(p.CA, p.CAKey, "recon", pki.RoleNode, 24*time.Hour, cert, key); err != nil {
		t.Fatal(err)
	}
	tlsc, err := pki.ClientConfig(p.CA, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	urls, err := ctrlset.Parse([]string{e.url(1)})
	if err != nil {
		t.Fatal(err)
	}
	set, err := ctrlset.New(ctrlset.Config{URLs: urls, TLS: tlsc})
	if err != nil {
		t.Fatal(err)
	}
	logs := &streamLog{ch: make(chan struct{}, 1)}
	a := agent.New(agent.Config{
		NodeID: "recon", Ctrl: set, Runtime: agenttest.New(),
		Capacity: &nodev1.Capacity{MemoryMib: 1 << 20, CpuMillis: 64000, StorageBytes: 1 << 40, StoragePool: "recon"},
		Log:      slog.New(logs), Heartbeat: time.Second,
		Templates: func() []*nodev1.TemplateInfo {
			return []*nodev1.TemplateInfo{{TemplateId: soakTemplate, Version: "soak-1"}}
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	opened := logs.waitOpen(t, e.url(1), time.Time{}, 30*time.Second)
	for !serves() {
		if time.Since(opened) > 2*time.Second {
			t.Fatal("replica 0 does not advertise workspace.create 2 s after the node's stream to replica 1 opened")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("replica 0 advertises workspace.create %v after the node's stream to replica 1 opened",
		time.Since(opened).Round(time.Millisecond))
	took := e.createOne(0, "through-0")
	t.Logf("a create through replica 0, placed on the node connected to replica 1: AVAILABLE in %v", took)
}
