package dataplane_test

import (
	"context"
	"crypto/ed25519"
	"os"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/dataplane"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/workspace"
)

// TestRevocationAcrossReplicas: two stores on one PostgreSQL schema, as two
// ctrl replicas hold; a token verified (its generation cached) on replica
// B is refused there soon after a revocation through replica A: the
// notification crosses (LISTEN/NOTIFY), well before MaxStale, set here
// to an hour so that only the notification can do it.
func TestRevocationAcrossReplicas(t *testing.T) {
	base := os.Getenv("KIBOTOS_TEST_POSTGRES_URL")
	if base == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KIBOTOS_TEST_POSTGRES_URL is not set; CI must run the PostgreSQL tests")
		}
		t.Skip("KIBOTOS_TEST_POSTGRES_URL is not set: this test needs PostgreSQL")
	}
	ctx := t.Context()
	var url string
	a, cleanup, err := pgtest.Open(ctx, base, func(ctx context.Context, u string) (*postgres.Store, error) {
		url = u
		return postgres.Open(ctx, u)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cleanup() })
	b, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })

	engine := &command.Engine{Store: a}
	seed := make([]byte, ed25519.SeedSize)
	key, err := dataplane.KeyFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	ws := &workspace.Service{Engine: engine, Store: a, Pages: paging.NewCodec(make([]byte, 32)),
		Templates:   func(id string) (string, bool) { return "v1", id == workspace.DefaultTemplate },
		MaxCapacity: func() workspace.Capacity { return workspace.Capacity{MemoryMiB: 4096, CPUMillis: 4000} }}
	dpA := &dataplane.Service{Engine: engine, Store: a, Key: key, Endpoint: "https://dp.test"}
	vB := &dataplane.Verifier{Key: key.Public().(ed25519.PublicKey), Store: b, MaxStale: time.Hour}
	defer vB.Close()

	cr, err := ws.Create(ctx, &ctrlv1.CreateWorkspaceRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "c"},
		Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}})
	if err != nil {
		t.Fatal(err)
	}
	id := cr.GetWorkspace().GetWorkspaceId()
	for round := range 5 {
		s, err := dpA.Create(ctx, &ctrlv1.CreateDataPlaneSessionRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: "s" + string(rune('0'+round))},
			WorkspaceId: id, Scopes: []ctrlv1.DataPlaneScope{ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC}})
		if err != nil {
			t.Fatal(err)
		}
		tok := s.GetSession().GetToken()
		if _, err := vB.Verify(ctx, tok, id, dataplane.ScopeExec); err != nil {
			t.Fatalf("replica B before the revocation: %v", err)
		}
		if _, err := ws.RevokeDataPlane(ctx, &ctrlv1.RevokeWorkspaceDataPlaneRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: "r" + string(rune('0'+round))}, WorkspaceId: id}); err != nil {
			t.Fatal(err)
		}
		answered := time.Now()
		for {
			_, err := vB.Verify(ctx, tok, id, dataplane.ScopeExec)
			if err != nil {
				if f, ok := fault.As(err); !ok || f.Kind != fault.KindUnauthenticated || f.Reason != fault.ReasonSessionExpired {
					t.Fatalf("replica B after the revocation: %v, want SESSION_EXPIRED", err)
				}
				break
			}
			if time.Since(answered) > time.Second {
				t.Fatalf("round %d: replica B still accepts the token 1 s after the revocation through A", round)
			}
			time.Sleep(100 * time.Microsecond)
		}
		t.Logf("round %d: refused at replica B %v after the revocation through A answered", round, time.Since(answered).Round(10*time.Microsecond))
	}
}
