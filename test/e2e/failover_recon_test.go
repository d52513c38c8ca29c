package e2e

import (
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
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

	logs := e.startDoubleNode("recon", 1)

	opened := logs.waitOpen(t, e.url(1), time.Time{}, 30*time.Second).at
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
