package artifact

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// List serves ListArtifacts: the artifacts of a kind by ID.
func (s *Service) List(ctx context.Context, k ctrlv1.ArtifactKind) ([]*ctrlv1.Artifact, error) {
	if err := checkKind("kind", k); err != nil {
		return nil, err
	}
	prefix := kindName(k) + "/"
	var out []*ctrlv1.Artifact
	err := s.Store.View(ctx, func(tx store.Tx) error {
		out = nil
		q := store.ListQuery{Kind: KindArtifact, Limit: 500}
		for {
			page, err := tx.ListResources(ctx, q)
			if err != nil {
				return err
			}
			for _, r := range page {
				id, ok := strings.CutPrefix(r.ID, prefix)
				if !ok {
					continue
				}
				a := &artifactRecord{}
				if err := decode(r, a); err != nil {
					return err
				}
				out = append(out, artifactMessage(k, id, r, a))
			}
			if len(page) < q.Limit {
				return nil
			}
			last := page[len(page)-1]
			q.After = &store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
		}
	})
	slices.SortFunc(out, func(a, b *ctrlv1.Artifact) int { return cmp.Compare(a.GetArtifactId(), b.GetArtifactId()) })
	return out, storeErr(err)
}

// Get serves GetArtifact.
func (s *Service) Get(ctx context.Context, ref *ctrlv1.ArtifactRef) (*ctrlv1.Artifact, error) {
	if err := checkRef("artifact", ref); err != nil {
		return nil, err
	}
	var out *ctrlv1.Artifact
	err := s.Store.View(ctx, func(tx store.Tx) error {
		r, a, err := loadArtifact(ctx, tx, ref.GetKind(), ref.GetArtifactId())
		if err != nil {
			return err
		}
		out = artifactMessage(ref.GetKind(), ref.GetArtifactId(), r, a)
		return nil
	})
	return out, storeErr(err)
}

// Versions serves ListArtifactVersions: newest first.
func (s *Service) Versions(ctx context.Context, ref *ctrlv1.ArtifactRef, reclaimed bool) ([]*ctrlv1.ArtifactVersion, error) {
	if err := checkRef("artifact", ref); err != nil {
		return nil, err
	}
	k, id := ref.GetKind(), ref.GetArtifactId()
	var out []*ctrlv1.ArtifactVersion
	err := s.Store.View(ctx, func(tx store.Tx) error {
		out = nil
		_, a, err := loadArtifact(ctx, tx, k, id)
		if err != nil {
			return err
		}
		for rev := a.LatestRevision; rev >= 1; rev-- {
			r, v, err := loadVersion(ctx, tx, k, id, rev)
			if err != nil {
				return err
			}
			if v.State == ctrlv1.ArtifactVersionState_ARTIFACT_VERSION_STATE_RECLAIMED && !reclaimed {
				continue
			}
			out = append(out, versionMessage(k, id, rev, r, v))
		}
		return nil
	})
	return out, storeErr(err)
}

// available refuses a version that is not AVAILABLE.
func available(k ctrlv1.ArtifactKind, id string, rev uint64, v *versionRecord) error {
	if v.State != ctrlv1.ArtifactVersionState_ARTIFACT_VERSION_STATE_AVAILABLE {
		return fault.Precondition(fault.ReasonStateConflict, "%s %s version %d is %s", kindTitle(k), quote(id), rev, v.State)
	}
	return nil
}

// moveDefault points an artifact's default at rev (AVAILABLE) inside tx;
// the pointer's version grows when it moves.
func (s *Service) moveDefault(ctx context.Context, tx store.Tx, k ctrlv1.ArtifactKind, id string, rev uint64, cas func(*artifactRecord) error) (*ctrlv1.Artifact, bool, error) {
	r, a, err := loadArtifact(ctx, tx, k, id)
	if err != nil {
		return nil, false, err
	}
	if err := cas(a); err != nil {
		return nil, false, err
	}
	_, v, err := loadVersion(ctx, tx, k, id, rev)
	if err != nil {
		return nil, false, err
	}
	if err := available(k, id, rev, v); err != nil {
		return nil, false, err
	}
	if a.DefaultRevision == rev {
		return artifactMessage(k, id, r, a), false, nil
	}
	a.DefaultRevision = rev
	a.DefaultVersion++
	if r, err = put(ctx, tx, KindArtifact, artifactKey(k, id), r, a, s.now()); err != nil {
		return nil, false, err
	}
	return artifactMessage(k, id, r, a), true, nil
}

// SetTemplateDefault serves SetTemplateDefault.
func (s *Service) SetTemplateDefault(ctx context.Context, req *ctrlv1.SetTemplateDefaultRequest) (*ctrlv1.SetTemplateDefaultResponse, error) {
	if err := CheckID("template_id", req.GetTemplateId()); err != nil {
		return nil, err
	}
	if req.GetRevision() == 0 {
		return nil, fault.Invalid("revision", "revision is required")
	}
	switch {
	case req.GetExpectNoDefault() && req.GetExpectedRevision() != 0:
		return nil, fault.Invalid("expected_revision", "set expected_revision or expect_no_default, not both")
	case !req.GetExpectNoDefault() && req.GetExpectedRevision() == 0:
		return nil, fault.Invalid("expected_revision", "set expected_revision (the current default's revision) or expect_no_default")
	}
	k := ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE
	return command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.SetTemplateDefaultRequest, *ctrlv1.SetTemplateDefaultResponse]{
		Method: setTemplateDef, ObjectKind: objectKind, ObjectID: artifactKey(k, req.GetTemplateId()), Request: req,
		NewResponse: func() *ctrlv1.SetTemplateDefaultResponse { return &ctrlv1.SetTemplateDefaultResponse{} },
		Decide: func(ctx context.Context, tx store.Tx, _ *store.Command) (*ctrlv1.SetTemplateDefaultResponse, error) {
			a, _, err := s.moveDefault(ctx, tx, k, req.GetTemplateId(), req.GetRevision(), func(a *artifactRecord) error {
				if req.GetExpectNoDefault() {
					if a.DefaultRevision != 0 {
						return fault.RevisionMismatch("expect_no_default", 0, a.DefaultRevision)
					}
					return nil
				}
				if a.DefaultRevision != req.GetExpectedRevision() {
					return fault.RevisionMismatch("expected_revision", req.GetExpectedRevision(), a.DefaultRevision)
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
			return &ctrlv1.SetTemplateDefaultResponse{Artifact: a}, nil
		},
	})
}

// SetPlatformDefault serves SetPlatformDefault.
func (s *Service) SetPlatformDefault(ctx context.Context, req *ctrlv1.SetPlatformDefaultRequest) (*ctrlv1.SetPlatformDefaultResponse, error) {
	if err := CheckID("platform_id", req.GetPlatformId()); err != nil {
		return nil, err
	}
	if req.GetRevision() == 0 {
		return nil, fault.Invalid("revision", "revision is required")
	}
	k := ctrlv1.ArtifactKind_ARTIFACT_KIND_PLATFORM
	moved := false
	out, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.SetPlatformDefaultRequest, *ctrlv1.SetPlatformDefaultResponse]{
		Method: setPlatformDef, ObjectKind: objectKind, ObjectID: artifactKey(k, req.GetPlatformId()), Request: req,
		NewResponse: func() *ctrlv1.SetPlatformDefaultResponse { return &ctrlv1.SetPlatformDefaultResponse{} },
		Decide: func(ctx context.Context, tx store.Tx, _ *store.Command) (*ctrlv1.SetPlatformDefaultResponse, error) {
			a, m, err := s.moveDefault(ctx, tx, k, req.GetPlatformId(), req.GetRevision(), func(a *artifactRecord) error {
				if a.DefaultRevision != req.GetExpectedRevision() {
					return fault.RevisionMismatch("expected_revision", req.GetExpectedRevision(), a.DefaultRevision)
				}
				if a.DefaultVersion != req.GetExpectedDefaultVersion() {
					return fault.RevisionMismatch("expected_default_version", req.GetExpectedDefaultVersion(), a.DefaultVersion)
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
			moved = m
			return &ctrlv1.SetPlatformDefaultResponse{Artifact: a}, nil
		},
	})
	if err == nil && moved && req.GetPlatformId() == SandboxPlatform && s.OnPlatformDefault != nil {
		s.OnPlatformDefault()
	}
	return out, err
}

// Retain serves RetainLaunchRevision: retain_until becomes the later of
// the recorded instant and the requested one.
func (s *Service) Retain(ctx context.Context, req *ctrlv1.RetainLaunchRevisionRequest) (*ctrlv1.ArtifactVersion, error) {
	if err := checkRef("artifact", req.GetArtifact()); err != nil {
		return nil, err
	}
	if req.GetRevision() == 0 {
		return nil, fault.Invalid("revision", "revision is required")
	}
	if req.GetRetainUntil() == nil {
		return nil, fault.Invalid("retain_until", "retain_until is required")
	}
	if err := req.GetRetainUntil().CheckValid(); err != nil {
		return nil, fault.Invalid("retain_until", "retain_until is not a valid timestamp")
	}
	until := req.GetRetainUntil().AsTime().UTC().Truncate(time.Microsecond)
	k, id, rev := req.GetArtifact().GetKind(), req.GetArtifact().GetArtifactId(), req.GetRevision()
	var out *ctrlv1.ArtifactVersion
	err := s.Store.InTx(ctx, func(tx store.Tx) error {
		r, v, err := loadVersion(ctx, tx, k, id, rev)
		if err != nil {
			return err
		}
		if err := available(k, id, rev, v); err != nil {
			return err
		}
		if until.After(v.RetainUntil) {
			v.RetainUntil = until
			if r, err = put(ctx, tx, KindVersion, versionKey(k, id, rev), r, v, s.now()); err != nil {
				return err
			}
		}
		out = versionMessage(k, id, rev, r, v)
		return nil
	})
	return out, storeErr(err)
}

// Reclaim serves ApplyArtifactReclamation.
func (s *Service) Reclaim(ctx context.Context, req *ctrlv1.ApplyArtifactReclamationRequest) (*ctrlv1.ApplyArtifactReclamationResponse, error) {
	if strings.Contains(req.GetCommandId(), "/") {
		return nil, fault.InvalidReason(fault.ReasonInvalidCommandID, command.OperatorIDField,
			"the command ID of a reclamation must not contain '/'")
	}
	if err := checkRef("artifact", req.GetArtifact()); err != nil {
		return nil, err
	}
	if req.GetRevision() == 0 {
		return nil, fault.Invalid("revision", "revision is required")
	}
	k, id, rev := req.GetArtifact().GetKind(), req.GetArtifact().GetArtifactId(), req.GetRevision()
	var gone string
	out, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.ApplyArtifactReclamationRequest, *ctrlv1.ApplyArtifactReclamationResponse]{
		Method: reclaimMethod, ObjectKind: objectKind, ObjectID: versionKey(k, id, rev), Request: req,
		NewResponse: func() *ctrlv1.ApplyArtifactReclamationResponse { return &ctrlv1.ApplyArtifactReclamationResponse{} },
		Decide: func(ctx context.Context, tx store.Tx, _ *store.Command) (*ctrlv1.ApplyArtifactReclamationResponse, error) {
			gone = ""
			now := s.now()
			_, a, err := loadArtifact(ctx, tx, k, id)
			if err != nil {
				return nil, err
			}
			r, v, err := loadVersion(ctx, tx, k, id, rev)
			if err != nil {
				return nil, err
			}
			if err := available(k, id, rev, v); err != nil {
				return nil, err
			}
			if a.DefaultRevision == rev {
				return nil, fault.Precondition(fault.ReasonStateConflict, "%s %s version %d is the default", kindTitle(k), quote(id), rev)
			}
			if v.RetainUntil.After(now) {
				return nil, fault.Precondition(fault.ReasonStateConflict, "%s %s version %d is retained until %s",
					kindTitle(k), quote(id), rev, v.RetainUntil.Format("2006-01-02T15:04:05.999999Z07:00"))
			}
			if k == ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE {
				n, err := tx.CountWorkspacesWithTemplate(ctx, store.TemplateKey(id, formatRev(rev)))
				if err != nil {
					return nil, err
				}
				if n > 0 {
					return nil, fault.Precondition(fault.ReasonStateConflict, "Template %s version %d is the version of %d Workspace(s) that are not DELETED", quote(id), rev, n)
				}
			}
			v.State, v.ReclaimedAt = ctrlv1.ArtifactVersionState_ARTIFACT_VERSION_STATE_RECLAIMED, now
			if err := tx.DeleteBlob(ctx, v.Blob); err != nil {
				return nil, err
			}
			if r, err = put(ctx, tx, KindVersion, versionKey(k, id, rev), r, v, now); err != nil {
				return nil, err
			}
			d := &digestRecord{}
			dr, found, err := get(ctx, tx, KindDigest, v.Digest, d)
			if err != nil {
				return nil, err
			}
			if found {
				key := versionKey(k, id, rev)
				d.Versions = slices.DeleteFunc(d.Versions, func(s string) bool { return s == key })
				if len(d.Versions) == 0 {
					if err := tx.DeleteResource(ctx, KindDigest, v.Digest); err != nil {
						return nil, err
					}
					gone = v.Digest
				} else if _, err := put(ctx, tx, KindDigest, v.Digest, dr, d, now); err != nil {
					return nil, err
				}
			}
			return &ctrlv1.ApplyArtifactReclamationResponse{Version: versionMessage(k, id, rev, r, v)}, nil
		},
	})
	if err == nil && gone != "" && s.OnReclaimed != nil {
		s.OnReclaimed(gone)
	}
	return out, err
}
