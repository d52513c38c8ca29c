package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
)

// TestTemplatePublish: kibo template publish sends a file in 4 MiB pieces
// and prints the version; the same --command-id after an interrupted
// upload resumes from the bytes received; set-default, versions, retain
// and reclaim; a publication under an ID with '/' FAILS (exit 3).
func TestTemplatePublish(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	c := conn(e)
	dir := t.TempDir()
	data := make([]byte, 9<<20+17)
	for i := range data {
		data[i] = byte(i * 31)
	}
	file := filepath.Join(dir, "root.tar")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	r := kibo(t, args(c, "template", "publish", file, "--template", "tpl", "--command-id", "tpl:1", "-o", "json")...).want(t, ExitOK)
	var res struct {
		Publication struct{ State string }
		Version     struct{ Revision, Digest, Format string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if res.Publication.State != "PUBLICATION_STATE_COMMITTED" || res.Version.Revision != "1" || res.Version.Digest != "sha256:"+hex.EncodeToString(sum[:]) ||
		res.Version.Format != "ARTIFACT_FORMAT_TAR" {
		t.Fatalf("publish printed %s", r.stdout)
	}
	// Resent: the settled result again.
	kibo(t, args(c, "template", "publish", file, "--template", "tpl", "--command-id", "tpl:1")...).want(t, ExitOK)

	// An upload interrupted after its first piece resumes.
	a := ctrlv1connect.NewArtifactServiceClient(e.HTTP, e.URL)
	if _, err := a.BeginArtifactPublication(t.Context(), connect.NewRequest(&ctrlv1.BeginArtifactPublicationRequest{CommandId: "tpl-2",
		Artifact: &ctrlv1.ArtifactRef{Kind: ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE, ArtifactId: "tpl"},
		Format:   ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR, SizeBytes: uint64(len(data)), Digest: "sha256:" + hex.EncodeToString(sum[:])})); err != nil {
		t.Fatal(err)
	}
	if _, err := a.UploadArtifactContent(t.Context(), connect.NewRequest(&ctrlv1.UploadArtifactContentRequest{CommandId: "tpl-2", Data: data[:4<<20]})); err != nil {
		t.Fatal(err)
	}
	r = kibo(t, args(c, "template", "publish", file, "--template", "tpl", "--command-id", "tpl-2")...).want(t, ExitOK)
	if !strings.Contains(r.stdout, "Version:        2") {
		t.Fatalf("resumed publish printed %s", r.stdout)
	}

	kibo(t, args(c, "template", "set-default", "tpl", "2")...).want(t, ExitUsage)
	kibo(t, args(c, "template", "set-default", "tpl", "2", "--expect-no-default")...).want(t, ExitOK)
	kibo(t, args(c, "template", "set-default", "tpl", "1", "--expect-no-default")...).want(t, int(connect.CodeAborted))
	if r = kibo(t, args(c, "template", "list", "-o", "name")...).want(t, ExitOK); r.stdout != "tpl\n" {
		t.Fatalf("template list printed %q", r.stdout)
	}
	if r = kibo(t, args(c, "template", "versions", "tpl", "-o", "name")...).want(t, ExitOK); r.stdout != "2\n1\n" {
		t.Fatalf("template versions printed %q", r.stdout)
	}
	kibo(t, args(c, "template", "retain", "tpl", "1", "--for", "1h")...).want(t, ExitOK)
	kibo(t, args(c, "template", "reclaim", "tpl", "1")...).want(t, int(connect.CodeFailedPrecondition))
	kibo(t, args(c, "template", "reclaim", "tpl", "1", "--command-id", "a/b")...).want(t, ExitUsage)

	r = kibo(t, args(c, "template", "publish", file, "--template", "tpl", "--command-id", "team/tpl-3")...).want(t, int(connect.CodeInvalidArgument))
	if !strings.Contains(r.stdout, "State:          failed") {
		t.Fatalf("a '/' publication printed %s", r.stdout)
	}
	kibo(t, args(c, "platform", "publish", file, "--platform", "sandbox")...).want(t, int(connect.CodeInvalidArgument))
	if r = kibo(t, args(c, "platform", "list", "-o", "name")...).want(t, ExitOK); r.stdout != "" {
		t.Fatalf("platform list printed %q", r.stdout)
	}
}
