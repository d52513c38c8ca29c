package api

import (
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/tunnel"
)

// TestNoTunnelIsNodeUnreachable: a replica without a data tunnel to the
// Workspace's node answers unavailable, retryable, NODE_UNREACHABLE,
// without naming the node.
func TestNoTunnelIsNodeUnreachable(t *testing.T) {
	g := guestv1connect.NewProcessServiceClient(&http.Client{Transport: &tunnel.Registry{}}, tunnel.NodeURL("node-secret-7"),
		connect.WithGRPC())
	_, err := g.Start(t.Context(), connect.NewRequest(&guestv1.StartRequest{Argv: []string{"true"}}))
	if err == nil {
		t.Fatal("Start through an empty registry succeeded")
	}
	f, ok := fault.As(guestError(err))
	if !ok || f.Kind != fault.KindUnavailable || f.Reason != fault.ReasonNodeUnreachable || !f.Retryable {
		t.Fatalf("guestError = %#v, want unavailable NODE_UNREACHABLE retryable", guestError(err))
	}
	if strings.Contains(f.Message, "node-secret-7") {
		t.Errorf("the message names the route: %q", f.Message)
	}
}
