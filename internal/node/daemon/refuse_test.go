package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/nodewire"
)

var errHandshake = fmt.Errorf("%w: the guest speaks protocol %d, the node %d", sandbox.ErrGuestProtocol,
	nodewire.GuestProtocolVersion+1, nodewire.GuestProtocolVersion)

// TestPlatformFailingTheHandshake: a start whose Platform guest fails the
// protocol handshake runs again with the node's own guest; the Platform is
// dropped from what the node holds (the agent is told) and not booted
// again for the same digest, while another digest is; other errors are
// the start's, with no retry.
func TestPlatformFailingTheHandshake(t *testing.T) {
	bb, err := os.ReadFile(staticStandIn(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := func(n int) []byte { // a static ELF declaring the protocol; n makes the digest
		return fmt.Appendf(append(append([]byte(nil), bb...), nodewire.GuestProtocolDeclaration...), "%d", n)
	}
	var inUse []string
	a, c := newTestArtifacts(t, &inUse)
	var changes atomic.Int32
	a.changed = func() { changes.Add(1) }
	desired := func(version string, b []byte) *nodev1.DesiredPlatform {
		return &nodev1.DesiredPlatform{PlatformId: "sandbox", Version: version, ProtocolVersion: nodewire.GuestProtocolVersion,
			Source: &nodev1.ArtifactSource{Digest: c.put(b), SizeBytes: uint64(len(b)), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF}}
	}
	// boot starts once, the platform's guest answering with platErr, the
	// node's own with ownErr; it returns the guests used ("platform",
	// "own") and the start's error.
	boot := func(platErr, ownErr error) (used []string, err error) {
		err = a.boot(context.Background(), func(g *os.File) error {
			if g == nil {
				used = append(used, "own")
				return ownErr
			}
			used = append(used, "platform")
			return platErr
		})
		return used, err
	}
	listed := func(digest string) bool {
		for _, p := range a.Platforms() {
			if p.GetDigest() == digest {
				return true
			}
		}
		return false
	}
	eq := func(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

	bad := desired("2", bin(1))
	for _, tc := range []struct {
		name           string
		set            []*nodev1.DesiredPlatform // SetPlatform calls before the start
		platErr        error
		ownErr         error
		wantUsed       []string
		wantErr        error
		wantListed     bool // bad is listed after the start
		wantNewChanges int32
	}{
		{"another start error: no retry, kept", []*nodev1.DesiredPlatform{bad}, sandbox.ErrStart, nil,
			[]string{"platform"}, sandbox.ErrStart, true, 1},
		{"handshake failed: refused, the own guest boots", nil, errHandshake, nil,
			[]string{"platform", "own"}, nil, false, 1},
		{"the same desired platform again", []*nodev1.DesiredPlatform{desired("2", bin(1))}, nil, nil,
			[]string{"own"}, nil, false, 0},
		{"the own guest, then the same digest again", []*nodev1.DesiredPlatform{nil, desired("2", bin(1))}, nil, nil,
			[]string{"own"}, nil, false, 0},
		{"the same digest as another version", []*nodev1.DesiredPlatform{desired("3", bin(1))}, nil, nil,
			[]string{"own"}, nil, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := changes.Load()
			for _, p := range tc.set {
				a.SetPlatform(p)
			}
			used, err := boot(tc.platErr, tc.ownErr)
			if !eq(used, tc.wantUsed) {
				t.Errorf("guests used %v, want %v", used, tc.wantUsed)
			}
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
			if got := listed(bad.Source.Digest); got != tc.wantListed {
				t.Errorf("listed = %v, want %v (%v)", got, tc.wantListed, a.Platforms())
			}
			if got := changes.Load() - before; got != tc.wantNewChanges {
				t.Errorf("%d inventory changes, want %d", got, tc.wantNewChanges)
			}
		})
	}
	if a.store.Has(bad.Source.Digest) {
		t.Error("the refused platform's binary is still cached")
	}

	t.Run("a new digest is booted", func(t *testing.T) {
		good := desired("4", bin(2))
		a.SetPlatform(good)
		used, err := boot(nil, nil)
		if err != nil || !eq(used, []string{"platform"}) || !listed(good.Source.Digest) {
			t.Fatalf("guests used %v, error %v, platforms %v", used, err, a.Platforms())
		}
	})
	t.Run("the own guest fails the handshake too", func(t *testing.T) {
		a.SetPlatform(desired("5", bin(3)))
		used, err := boot(errHandshake, errHandshake)
		if !errors.Is(err, sandbox.ErrGuestProtocol) || !sandbox.Permanent(err) || !eq(used, []string{"platform", "own"}) {
			t.Fatalf("guests used %v, error %v", used, err)
		}
		if listed(desired("5", bin(3)).Source.Digest) {
			t.Fatal("still listed")
		}
	})
}
