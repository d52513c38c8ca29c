package daemon

import (
	"context"
	"sync/atomic"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// TestInventoryChanges: installing a published template version and
// reclaiming it each tell the agent (Runtime.OnInventoryChange); a start
// from a version the node holds does not.
func TestInventoryChanges(t *testing.T) {
	var inUse []string
	a, c := newTestArtifacts(t, &inUse)
	var n atomic.Int32
	a.changed = func() { n.Add(1) }
	good := rootfsTar(t)
	src := &nodev1.ArtifactSource{Digest: c.put(good), SizeBytes: uint64(len(good)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR}
	if _, err := a.templateDir(context.Background(), "debian", "1", src); err != nil {
		t.Fatal(err)
	}
	if got := n.Load(); got != 1 {
		t.Fatalf("after an install: %d changes, want 1", got)
	}
	if _, err := a.templateDir(context.Background(), "debian", "1", nil); err != nil {
		t.Fatal(err)
	}
	if got := n.Load(); got != 1 {
		t.Fatalf("after a start from a held version: %d changes, want 1", got)
	}
	a.mu.Lock()
	a.reclaiming[src.Digest] = true
	a.mu.Unlock()
	a.reclaimPending()
	if got := n.Load(); got != 2 {
		t.Fatalf("after a reclamation: %d changes, want 2", got)
	}
}
