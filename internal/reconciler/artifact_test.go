package reconciler

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// publish commits data as the next version of an artifact.
func publish(t *testing.T, svc *artifact.Service, id string, k ctrlv1.ArtifactKind, aid string, f ctrlv1.ArtifactFormat, data []byte) *ctrlv1.ArtifactVersion {
	t.Helper()
	sum := sha256.Sum256(data)
	if _, err := svc.Begin(t.Context(), &ctrlv1.BeginArtifactPublicationRequest{CommandId: id, Artifact: &ctrlv1.ArtifactRef{Kind: k, ArtifactId: aid},
		Format: f, SizeBytes: uint64(len(data)), Digest: "sha256:" + hex.EncodeToString(sum[:])}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Upload(t.Context(), &ctrlv1.UploadArtifactContentRequest{CommandId: id, Data: data}); err != nil {
		t.Fatal(err)
	}
	res, err := svc.Commit(t.Context(), id)
	if err != nil || res.GetVersion() == nil {
		t.Fatalf("Commit = %v, %v", res, err)
	}
	return res.GetVersion()
}

// TestArtifactDesiredState: reclaimed digests reach every connected node
// and the full states of the next hour; the default of Platform "sandbox"
// is in every full state and pushed when it moves; a Workspace of a
// published Template carries its version and source.
func TestArtifactDesiredState(t *testing.T) {
	r, st, clock := newTest(t, Config{})
	svc := &artifact.Service{Engine: &command.Engine{Store: st, Now: clock.Now}, Store: st, Now: clock.Now,
		OnPlatformDefault: r.PlatformChanged, OnReclaimed: r.ArtifactReclaimed}
	n1 := connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))

	full, err := r.fullState(t.Context(), n1)
	if err != nil || full.GetDesired().GetPlatform() != nil {
		t.Fatalf("full state without a Platform = %v, %v", full, err)
	}
	// The ELF header, one PT_LOAD, the declaration.
	elfBytes := []byte("\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x3e\x00\x01\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00" +
		"\x40\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40\x00\x38\x00\x01\x00\x40\x00\x00\x00\x00\x00" +
		"\x01\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00" +
		"\x40\x00\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00" + nodewire.GuestProtocolDeclaration)
	pv := publish(t, svc, "sb-1", ctrlv1.ArtifactKind_ARTIFACT_KIND_PLATFORM, artifact.SandboxPlatform, ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF, elfBytes)
	if _, err := svc.SetPlatformDefault(t.Context(), &ctrlv1.SetPlatformDefaultRequest{CommandId: "sb-default", PlatformId: artifact.SandboxPlatform, Revision: 1}); err != nil {
		t.Fatal(err)
	}
	wantPlatform := &nodev1.DesiredPlatform{PlatformId: "sandbox", Version: "1", ProtocolVersion: nodewire.GuestProtocolVersion,
		Source: &nodev1.ArtifactSource{Digest: pv.GetDigest(), SizeBytes: pv.GetSizeBytes(), Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF}}
	select {
	case m := <-n1.send:
		if diff := cmp.Diff(&nodev1.DesiredState{Platform: wantPlatform}, m.GetDesired(), protocmp.Transform()); diff != "" {
			t.Errorf("pushed platform (-want +got):\n%s", diff)
		}
	default:
		t.Error("the new default was not pushed")
	}
	if full, err = r.fullState(t.Context(), n1); err != nil || !cmp.Equal(wantPlatform, full.GetDesired().GetPlatform(), protocmp.Transform()) {
		t.Errorf("full state platform = %v, %v", full.GetDesired().GetPlatform(), err)
	}

	// A Workspace of a published Template.
	tv := publish(t, svc, "tpl-1", ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE, "tpl", ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR, []byte("a tar"))
	for _, tc := range []struct {
		ref  *ctrlv1.TemplateRef
		want *nodev1.ArtifactSource
	}{
		{&ctrlv1.TemplateRef{TemplateId: "tpl", Version: "1"}, &nodev1.ArtifactSource{Digest: tv.GetDigest(), SizeBytes: 5, Format: ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR}},
		{&ctrlv1.TemplateRef{TemplateId: workspace.DefaultTemplate, Version: "default-v1"}, nil},
	} {
		w := &store.Workspace{ID: "ws-" + tc.ref.GetTemplateId(), CreatedAt: t0, Generation: 1}
		if err := workspace.Save(w, &ctrlv1.Workspace{WorkspaceId: w.ID, Template: tc.ref}, t0); err != nil {
			t.Fatal(err)
		}
		var d *nodev1.DesiredWorkspace
		if err := st.View(t.Context(), func(tx store.Tx) error {
			var err error
			d, err = newNetReader(t.Context(), tx, r.log).desired(w)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		wantVersion := ""
		if tc.want != nil {
			wantVersion = tc.ref.GetVersion()
		}
		if d.GetTemplateVersion() != wantVersion || !cmp.Equal(tc.want, d.GetTemplateSource(), protocmp.Transform()) {
			t.Errorf("%v: template_version %q, source %v; want %q, %v", tc.ref, d.GetTemplateVersion(), d.GetTemplateSource(), wantVersion, tc.want)
		}
	}

	// Reclamations: at once to connected nodes, in full states for an hour.
	old := publish(t, svc, "tpl-2", ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE, "tpl", ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR, []byte("old tar"))
	if _, err := svc.Reclaim(t.Context(), &ctrlv1.ApplyArtifactReclamationRequest{CommandId: "r-2", Artifact: &ctrlv1.ArtifactRef{Kind: ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE, ArtifactId: "tpl"}, Revision: 2}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-n1.send:
		if diff := cmp.Diff(&nodev1.DesiredState{ReclaimedDigests: []string{old.GetDigest()}}, m.GetDesired(), protocmp.Transform()); diff != "" {
			t.Errorf("pushed reclamation (-want +got):\n%s", diff)
		}
	default:
		t.Error("the reclamation was not pushed")
	}
	clock.Set(t0.Add(30 * time.Minute))
	full, err = r.fullState(t.Context(), connectNode(t, r, hello("n2", 4096, 4000, "", workspace.DefaultTemplate)))
	if err != nil || !cmp.Equal(full.GetDesired().GetReclaimedDigests(), []string{old.GetDigest()}) {
		t.Errorf("full state reclaimed = %v, %v", full.GetDesired().GetReclaimedDigests(), err)
	}
	clock.Set(t0.Add(time.Hour + time.Second))
	full, err = r.fullState(t.Context(), connectNode(t, r, hello("n3", 4096, 4000, "", workspace.DefaultTemplate)))
	if err != nil || len(full.GetDesired().GetReclaimedDigests()) != 0 {
		t.Errorf("an hour later the full state names %v, %v", full.GetDesired().GetReclaimedDigests(), err)
	}
}
