package artifact

import (
	"context"
	"strconv"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

func formatRev(rev uint64) string { return strconv.FormatUint(rev, 10) }

// parseRev parses a version name: a revision in decimal, no sign, no
// leading zero.
func parseRev(s string) (uint64, bool) {
	if s == "" || s[0] == '0' || len(s) > 20 {
		return 0, false
	}
	rev, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false
	}
	return rev, true
}

// availableByDigest returns an AVAILABLE version with digest d; nil when
// none.
func availableByDigest(ctx context.Context, tx store.Tx, d string) (*versionRecord, error) {
	idx := &digestRecord{}
	_, ok, err := get(ctx, tx, KindDigest, d, idx)
	if err != nil || !ok {
		return nil, err
	}
	for _, key := range idx.Versions {
		v := &versionRecord{}
		_, ok, err := get(ctx, tx, KindVersion, key, v)
		if err != nil {
			return nil, err
		}
		if ok && v.State == ctrlv1.ArtifactVersionState_ARTIFACT_VERSION_STATE_AVAILABLE {
			return v, nil
		}
	}
	return nil, nil
}

// Fetch serves NodeService.FetchArtifact (the caller checked the node
// peer): an AVAILABLE version's bytes by digest from offset, in messages
// of at most MaxFetchMessage bytes, each chunk read in its own short
// transaction, one ahead of the one sent. An unknown or reclaimed digest
// is not_found, also when the version is reclaimed during the fetch.
func (s *Service) Fetch(ctx context.Context, req *nodev1.FetchArtifactRequest, send func(*nodev1.FetchArtifactResponse) error) error {
	d, off := req.GetDigest(), req.GetOffset()
	if err := CheckDigest("digest", d); err != nil {
		return err
	}
	notFound := &fault.Error{Kind: fault.KindNotFound, Reason: fault.ReasonNotFound, Message: "no AVAILABLE artifact version has digest " + d}
	var v *versionRecord
	if err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		v, err = availableByDigest(ctx, tx, d)
		return err
	}); err != nil {
		return storeErr(err)
	}
	if v == nil {
		return notFound
	}
	if off > v.Size {
		return fault.Invalid("offset", "offset %d is beyond the size %d", off, v.Size)
	}
	if off == v.Size {
		return send(&nodev1.FetchArtifactResponse{SizeBytes: v.Size})
	}
	// One chunk is read ahead while the one before is sent, so the store's
	// read and the wire overlap (at most three chunks in memory).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pieces := make(chan fetchPiece, 1)
	go s.readAhead(ctx, v, off, pieces)
	for p := range pieces {
		if p.err != nil {
			return p.err
		}
		for data := p.data; len(data) > 0; {
			n := min(len(data), MaxFetchMessage)
			if err := send(&nodev1.FetchArtifactResponse{SizeBytes: v.Size, Data: data[:n]}); err != nil {
				return err
			}
			data = data[n:]
		}
	}
	// readAhead stops without an error piece only when ctx is done: never
	// a clean end before the size.
	return ctx.Err()
}

// fetchPiece is the bytes of one stored chunk from where the fetch is, or
// the error that ends it.
type fetchPiece struct {
	data []byte
	err  error
}

// readAhead reads v's bytes from off to its end into pieces, each chunk in
// its own short transaction, and closes pieces; it ends early (after an
// error piece, or without one when ctx is done).
func (s *Service) readAhead(ctx context.Context, v *versionRecord, off uint64, pieces chan<- fetchPiece) {
	defer close(pieces)
	notFound := &fault.Error{Kind: fault.KindNotFound, Reason: fault.ReasonNotFound, Message: "no AVAILABLE artifact version has digest " + v.Digest}
	for off < v.Size {
		var chunks []store.BlobChunk
		p := fetchPiece{}
		if err := s.Store.View(ctx, func(tx store.Tx) error {
			var err error
			chunks, err = tx.BlobChunks(ctx, v.Blob, off, 1)
			return err
		}); err != nil {
			p.err = storeErr(err)
		} else if len(chunks) == 0 || chunks[0].Offset > off {
			p.err = notFound // reclaimed meanwhile
		} else {
			p.data = chunks[0].Data[off-chunks[0].Offset:]
			if rest := v.Size - off; uint64(len(p.data)) > rest {
				p.data = p.data[:rest]
			}
			off += uint64(len(p.data))
		}
		select {
		case pieces <- p:
		case <-ctx.Done():
			return
		}
		if p.err != nil {
			return
		}
	}
}

// ResolveTemplate resolves the template of a CreateWorkspace inside tx to
// the version the Workspace records. A Template that was not published is
// one the nodes build (nodes resolves it: reconciler.Template); it takes
// no template_version but the one the nodes hold. A published Template
// without template_version resolves to its default (none:
// failed_precondition); a named version must exist (else invalid_argument
// on template_version) and be AVAILABLE (else failed_precondition).
func ResolveTemplate(ctx context.Context, tx store.Tx, templateID, version string, nodes func(string) (string, bool)) (string, error) {
	a := &artifactRecord{}
	_, published, err := get(ctx, tx, KindArtifact, artifactKey(ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE, templateID), a)
	if err != nil {
		return "", storeErr(err)
	}
	if !published {
		v, ok := nodes(templateID)
		if !ok {
			return "", fault.Invalid("template_id", "unknown template %s", quote(templateID))
		}
		if version != "" && version != v {
			return "", fault.Invalid("template_version", "template %s is built by the nodes (version %s); template_version must be empty", quote(templateID), quote(v))
		}
		return v, nil
	}
	k := ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE
	if version == "" {
		if a.DefaultRevision == 0 {
			return "", fault.Precondition(fault.ReasonStateConflict, "Template %s has no default version; name one in template_version", quote(templateID))
		}
		return formatRev(a.DefaultRevision), nil
	}
	rev, ok := parseRev(version)
	v := &versionRecord{}
	found := false
	if ok {
		if _, found, err = get(ctx, tx, KindVersion, versionKey(k, templateID, rev), v); err != nil {
			return "", storeErr(err)
		}
	}
	if !found {
		return "", fault.Invalid("template_version", "Template %s has no version %s", quote(templateID), quote(version))
	}
	if err := available(k, templateID, rev, v); err != nil {
		return "", err
	}
	return version, nil
}

// TemplateSource returns where a node fetches version of Template
// templateID: nil when it is not a published version (the default
// template, built by the nodes).
func TemplateSource(ctx context.Context, tx store.Tx, templateID, version string) (*nodev1.ArtifactSource, error) {
	if templateID == DefaultTemplate || templateID == "" {
		return nil, nil
	}
	rev, ok := parseRev(version)
	if !ok {
		return nil, nil
	}
	v := &versionRecord{}
	_, found, err := get(ctx, tx, KindVersion, versionKey(ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE, templateID, rev), v)
	if err != nil || !found {
		return nil, err
	}
	return &nodev1.ArtifactSource{Digest: v.Digest, SizeBytes: v.Size, Format: v.Format}, nil
}

// DesiredPlatform returns the default version of Platform "sandbox" as
// nodes receive it; nil when it has none.
func DesiredPlatform(ctx context.Context, tx store.Tx) (*nodev1.DesiredPlatform, error) {
	k := ctrlv1.ArtifactKind_ARTIFACT_KIND_PLATFORM
	a := &artifactRecord{}
	_, ok, err := get(ctx, tx, KindArtifact, artifactKey(k, SandboxPlatform), a)
	if err != nil || !ok || a.DefaultRevision == 0 {
		return nil, err
	}
	v := &versionRecord{}
	_, ok, err = get(ctx, tx, KindVersion, versionKey(k, SandboxPlatform, a.DefaultRevision), v)
	if err != nil || !ok {
		return nil, err
	}
	return &nodev1.DesiredPlatform{PlatformId: SandboxPlatform, Version: formatRev(a.DefaultRevision),
		Source:          &nodev1.ArtifactSource{Digest: v.Digest, SizeBytes: v.Size, Format: v.Format},
		ProtocolVersion: v.Protocol}, nil
}
