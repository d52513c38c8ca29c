// Package artifact is ctrl's ArtifactService: the publication of Templates
// and Platforms (Begin, Upload, Commit sharing one command ID), their
// versions and default pointers, retention and reclamation, the bytes it
// streams to nodes (NodeService.FetchArtifact), and what the rest of ctrl
// reads of them: the Template version a CreateWorkspace resolves to, a
// published version's ArtifactSource and the Platform nodes boot.
//
// Records live in the resources table (JSON specs): KindArtifact (one per
// Template or Platform, ID "<kind>/<artifact_id>"), KindVersion (one per
// version, ID "<kind>/<artifact_id>@<revision>"), KindPublication (one per
// publication, ID its command ID) and KindDigest (ID a digest: the AVAILABLE
// versions with those bytes). The bytes are a blob of the store, written
// one chunk per Upload and read in short transactions.
package artifact

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// Store kinds of the records.
const (
	KindArtifact    store.ResourceKind = "artifact"
	KindVersion     store.ResourceKind = "artifact-version"
	KindPublication store.ResourceKind = "artifact-publication"
	KindDigest      store.ResourceKind = "artifact-digest"
)

// Procedures named in command records (part of their fingerprints: never
// change them).
const (
	beginMethod     = "/kibotos.ctrl.v1.ArtifactService/BeginArtifactPublication"
	setTemplateDef  = "/kibotos.ctrl.v1.ArtifactService/SetTemplateDefault"
	setPlatformDef  = "/kibotos.ctrl.v1.ArtifactService/SetPlatformDefault"
	reclaimMethod   = "/kibotos.ctrl.v1.ArtifactService/ApplyArtifactReclamation"
	objectKind      = "artifact"
	publicationBlob = "artifact-publication/"
)

// Bounds.
const (
	// MaxSize is the largest artifact: 64 GiB.
	MaxSize = 64 << 30
	// MaxUpload is the most bytes one UploadArtifactContent carries.
	MaxUpload = 4 << 20
	// MaxFetchMessage is the most bytes one FetchArtifactResponse carries.
	MaxFetchMessage = 1 << 20
	// MaxUploadRequestBytes bounds the encoded UploadArtifactContentRequest:
	// MaxUpload of data and room for the command ID and offset.
	MaxUploadRequestBytes = MaxUpload + 64<<10
)

// DefaultTemplate is the template the nodes build themselves (busybox);
// no Template may be published under its name.
const DefaultTemplate = "default"

// SandboxPlatform is the Platform whose default nodes boot new executions
// with.
const SandboxPlatform = "sandbox"

var (
	artifactIDRe  = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)
	digestRe      = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	publicationRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
)

// Service serves ArtifactService.
type Service struct {
	Engine *command.Engine
	Store  store.Store
	Now    func() time.Time
	// OnPlatformDefault is called after the default of Platform "sandbox"
	// moved (the reconciler pushes it to connected nodes); nil: nothing.
	OnPlatformDefault func()
	// OnReclaimed is called after a reclamation with the digest no AVAILABLE
	// version holds any more (the reconciler tells connected nodes); nil:
	// nothing.
	OnReclaimed func(digest string)
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC().Truncate(time.Microsecond)
	}
	return time.Now().UTC().Truncate(time.Microsecond)
}

// kindName is the key prefix of kind.
func kindName(k ctrlv1.ArtifactKind) string {
	switch k {
	case ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE:
		return "template"
	case ctrlv1.ArtifactKind_ARTIFACT_KIND_PLATFORM:
		return "platform"
	}
	return ""
}

func artifactKey(k ctrlv1.ArtifactKind, id string) string { return kindName(k) + "/" + id }

func versionKey(k ctrlv1.ArtifactKind, id string, rev uint64) string {
	return artifactKey(k, id) + "@" + strconv.FormatUint(rev, 10)
}

// checkKind validates an ArtifactKind field.
func checkKind(field string, k ctrlv1.ArtifactKind) error {
	if kindName(k) == "" {
		return fault.Invalid(field, "kind must be ARTIFACT_KIND_TEMPLATE or ARTIFACT_KIND_PLATFORM")
	}
	return nil
}

// CheckID validates an artifact ID (field is the request field).
func CheckID(field, id string) error {
	if !artifactIDRe.MatchString(id) {
		return fault.Invalid(field, "artifact ID %s must be 1 to 63 bytes of lower-case letters, digits and '-', starting with a letter", quote(id))
	}
	return nil
}

// checkRef validates an ArtifactRef.
func checkRef(field string, ref *ctrlv1.ArtifactRef) error {
	if ref == nil {
		return fault.Invalid(field, "%s is required", field)
	}
	if err := checkKind(field+".kind", ref.GetKind()); err != nil {
		return err
	}
	return CheckID(field+".artifact_id", ref.GetArtifactId())
}

// CheckDigest validates a digest's syntax.
func CheckDigest(field, d string) error {
	if !digestRe.MatchString(d) {
		return fault.Invalid(field, "digest %s must be \"sha256:\" and 64 lower-case hex digits", quote(d))
	}
	return nil
}

// quote quotes caller text for a message, cut to 80 bytes.
func quote(s string) string {
	if len(s) > 80 {
		return strconv.Quote(strings.ToValidUTF8(s[:80], "")) + "…"
	}
	return strconv.Quote(s)
}

// artifactRecord is KindArtifact's spec.
type artifactRecord struct {
	DefaultRevision uint64 `json:"default_revision,omitempty"`
	DefaultVersion  uint64 `json:"default_version,omitempty"`
	LatestRevision  uint64 `json:"latest_revision"`
}

// versionRecord is KindVersion's spec.
type versionRecord struct {
	Digest      string                      `json:"digest"`
	Size        uint64                      `json:"size"`
	Format      ctrlv1.ArtifactFormat       `json:"format"`
	State       ctrlv1.ArtifactVersionState `json:"state"`
	RetainUntil time.Time                   `json:"retain_until,omitzero"`
	ReclaimedAt time.Time                   `json:"reclaimed_at,omitzero"`
	Publication string                      `json:"publication"`
	Protocol    uint32                      `json:"protocol,omitempty"`
	Blob        string                      `json:"blob"`
}

// digestRecord is KindDigest's spec: the AVAILABLE versions (version keys)
// whose bytes have that digest, oldest first.
type digestRecord struct {
	Versions []string `json:"versions"`
}

func decode(r *store.Resource, v any) error {
	if err := json.Unmarshal(r.Spec, v); err != nil {
		return fault.Internal("decode %s %s: %v", r.Kind, r.ID, err)
	}
	return nil
}

// put inserts or updates a record (rev 0: insert).
func put(ctx context.Context, tx store.Tx, kind store.ResourceKind, id string, prior *store.Resource, v any, now time.Time) (*store.Resource, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fault.Internal("encode %s: %v", kind, err)
	}
	if prior == nil {
		r := &store.Resource{Kind: kind, ID: id, CreatedAt: now, UpdatedAt: now, Revision: 1, Spec: b,
			Labels: map[string]string{}, Annotations: map[string]string{}}
		return r, tx.InsertResource(ctx, r)
	}
	r := *prior
	r.Spec, r.UpdatedAt, r.Revision = b, now, prior.Revision+1
	return &r, tx.UpdateResource(ctx, &r)
}

// get reads a record; found is false when absent.
func get(ctx context.Context, tx store.Tx, kind store.ResourceKind, id string, v any) (*store.Resource, bool, error) {
	r, err := tx.GetResource(ctx, kind, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return r, true, decode(r, v)
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func artifactMessage(k ctrlv1.ArtifactKind, id string, r *store.Resource, a *artifactRecord) *ctrlv1.Artifact {
	return &ctrlv1.Artifact{Kind: k, ArtifactId: id, DefaultRevision: a.DefaultRevision, DefaultVersion: a.DefaultVersion,
		LatestRevision: a.LatestRevision, CreatedAt: ts(r.CreatedAt), UpdatedAt: ts(r.UpdatedAt)}
}

func versionMessage(k ctrlv1.ArtifactKind, id string, rev uint64, r *store.Resource, v *versionRecord) *ctrlv1.ArtifactVersion {
	return &ctrlv1.ArtifactVersion{Kind: k, ArtifactId: id, Revision: rev, Digest: v.Digest, SizeBytes: v.Size,
		Format: v.Format, State: v.State, RetainUntil: ts(v.RetainUntil), CreatedAt: ts(r.CreatedAt),
		ReclaimedAt: ts(v.ReclaimedAt), PublicationCommandId: v.Publication, ProtocolVersion: v.Protocol}
}

// loadArtifact reads an artifact; not_found when absent.
func loadArtifact(ctx context.Context, tx store.Tx, k ctrlv1.ArtifactKind, id string) (*store.Resource, *artifactRecord, error) {
	a := &artifactRecord{}
	r, ok, err := get(ctx, tx, KindArtifact, artifactKey(k, id), a)
	if err != nil {
		return nil, nil, err
	}
	if !ok {
		return nil, nil, fault.NotFound(kindTitle(k), id)
	}
	return r, a, nil
}

// loadVersion reads a version; not_found when absent.
func loadVersion(ctx context.Context, tx store.Tx, k ctrlv1.ArtifactKind, id string, rev uint64) (*store.Resource, *versionRecord, error) {
	v := &versionRecord{}
	r, ok, err := get(ctx, tx, KindVersion, versionKey(k, id, rev), v)
	if err != nil {
		return nil, nil, err
	}
	if !ok {
		return nil, nil, &fault.Error{Kind: fault.KindNotFound, Reason: fault.ReasonNotFound,
			Message: kindTitle(k) + " " + strconv.Quote(id) + " has no version " + strconv.FormatUint(rev, 10)}
	}
	return r, v, nil
}

func kindTitle(k ctrlv1.ArtifactKind) string {
	if k == ctrlv1.ArtifactKind_ARTIFACT_KIND_PLATFORM {
		return "Platform"
	}
	return "Template"
}

// storeErr passes faults and cancellations through and hides the rest.
func storeErr(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := fault.As(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fault.Internal("store: %v", err)
}
