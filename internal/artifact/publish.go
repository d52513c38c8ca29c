package artifact

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"hash"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/caller"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/commandid"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// pubRecord is KindPublication's spec.
type pubRecord struct {
	Kind       ctrlv1.ArtifactKind     `json:"kind"`
	ArtifactID string                  `json:"artifact_id"`
	Format     ctrlv1.ArtifactFormat   `json:"format"`
	Size       uint64                  `json:"size"`
	Digest     string                  `json:"digest"`
	Received   uint64                  `json:"received"`
	State      ctrlv1.PublicationState `json:"state"`
	Failure    []byte                  `json:"failure,omitempty"` // ErrorDetail, binary proto
	Revision   uint64                  `json:"revision,omitempty"`
	Hash       []byte                  `json:"hash,omitempty"` // sha256 state of the bytes received
}

func (p *pubRecord) message(id string, r *store.Resource) *ctrlv1.ArtifactPublication {
	m := &ctrlv1.ArtifactPublication{CommandId: id, Artifact: &ctrlv1.ArtifactRef{Kind: p.Kind, ArtifactId: p.ArtifactID},
		Format: p.Format, SizeBytes: p.Size, Digest: p.Digest, ReceivedBytes: p.Received, State: p.State,
		Revision: p.Revision, CreatedAt: ts(r.CreatedAt), UpdatedAt: ts(r.UpdatedAt)}
	if len(p.Failure) > 0 {
		d := &ctrlv1.ErrorDetail{}
		if proto.Unmarshal(p.Failure, d) == nil {
			m.Failure = d
		}
	}
	return m
}

// checkPublicationID validates the command ID of BeginArtifactPublication:
// the Operator API's format, or the publication pattern (which allows
// ':'); reserved prefixes are refused.
func checkPublicationID(field, id string) error {
	err := commandid.Validate(field, id)
	if err == nil {
		return nil
	}
	if fe, ok := fault.As(err); ok && fe.Reason == fault.ReasonReservedCommandID {
		return err
	}
	if publicationRe.MatchString(id) {
		return nil
	}
	return err
}

// checkExistingID validates the command ID of Upload, Commit and
// GetArtifactPublication: anything Begin may have accepted.
func checkExistingID(field, id string) error {
	if err := commandid.ValidateFormat(id); err == nil || publicationRe.MatchString(id) {
		return nil
	}
	return fault.InvalidReason(fault.ReasonInvalidCommandID, field, "command ID %s is not one a publication can have", quote(id))
}

func formatFits(k ctrlv1.ArtifactKind, f ctrlv1.ArtifactFormat) bool {
	switch k {
	case ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE:
		return f == ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR || f == ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR_GZIP
	case ctrlv1.ArtifactKind_ARTIFACT_KIND_PLATFORM:
		return f == ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF
	}
	return false
}

// Begin serves BeginArtifactPublication.
func (s *Service) Begin(ctx context.Context, req *ctrlv1.BeginArtifactPublicationRequest) (*ctrlv1.ArtifactPublication, error) {
	id := req.GetCommandId()
	if err := checkPublicationID(command.OperatorIDField, id); err != nil {
		return nil, err
	}
	if err := checkRef("artifact", req.GetArtifact()); err != nil {
		return nil, err
	}
	k, aid := req.GetArtifact().GetKind(), req.GetArtifact().GetArtifactId()
	if k == ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE && aid == DefaultTemplate {
		return nil, fault.Invalid("artifact.artifact_id", "the Template %q is the one the nodes build; publish under another ID", DefaultTemplate)
	}
	if !formatFits(k, req.GetFormat()) {
		return nil, fault.Invalid("format", "a Template is TAR or TAR_GZIP, a Platform ELF; not %s", req.GetFormat())
	}
	if req.GetSizeBytes() < 1 || req.GetSizeBytes() > MaxSize {
		return nil, fault.Invalid("size_bytes", "size_bytes must be from 1 byte to 64 GiB, not %d", req.GetSizeBytes())
	}
	if err := CheckDigest("digest", req.GetDigest()); err != nil {
		return nil, err
	}
	fp, err := command.Fingerprint(beginMethod, req, nil)
	if err != nil {
		return nil, fault.Internal("fingerprint: %v", err)
	}
	now := s.now()
	var out *ctrlv1.ArtifactPublication
	err = s.Store.InTx(ctx, func(tx store.Tx) error {
		if err := tx.LockCommand(ctx, id); err != nil {
			return err
		}
		prior, err := tx.GetCommand(ctx, id)
		switch {
		case err == nil:
			if prior.Method != beginMethod || !bytes.Equal(prior.Fingerprint, fp) {
				return &fault.Error{Kind: fault.KindAlreadyExists, Reason: fault.ReasonCommandIDReused, Field: command.OperatorIDField,
					Message: "command ID was already used with a different request; use a new command ID"}
			}
			p := &pubRecord{}
			r, ok, err := get(ctx, tx, KindPublication, id, p)
			if err != nil {
				return err
			}
			if !ok {
				return fault.Internal("publication %q has a command but no record", id)
			}
			out = p.message(id, r)
			return nil
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		st, _ := sha256.New().(encoding.BinaryMarshaler).MarshalBinary()
		p := &pubRecord{Kind: k, ArtifactID: aid, Format: req.GetFormat(), Size: req.GetSizeBytes(), Digest: req.GetDigest(),
			State: ctrlv1.PublicationState_PUBLICATION_STATE_UPLOADING, Hash: st}
		r, err := put(ctx, tx, KindPublication, id, nil, p, now)
		if err != nil {
			return err
		}
		if err := tx.InsertCommand(ctx, &store.Command{ID: id, Method: beginMethod, Fingerprint: fp,
			ObjectKind: objectKind, ObjectID: artifactKey(k, aid),
			Initiator: int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_CALLER), Status: store.CommandProcessing, CreatedAt: now,
			Caller: caller.From(ctx)}); err != nil {
			return err
		}
		out = p.message(id, r)
		return nil
	})
	return out, storeErr(err)
}

// loadPublication reads a publication; not_found when absent.
func loadPublication(ctx context.Context, tx store.Tx, id string) (*store.Resource, *pubRecord, error) {
	p := &pubRecord{}
	r, ok, err := get(ctx, tx, KindPublication, id, p)
	if err != nil {
		return nil, nil, err
	}
	if !ok {
		return nil, nil, fault.NotFound("publication", id)
	}
	return r, p, nil
}

// GetPublication serves GetArtifactPublication.
func (s *Service) GetPublication(ctx context.Context, id string) (*ctrlv1.ArtifactPublication, error) {
	if err := checkExistingID(command.OperatorIDField, id); err != nil {
		return nil, err
	}
	var out *ctrlv1.ArtifactPublication
	err := s.Store.View(ctx, func(tx store.Tx) error {
		r, p, err := loadPublication(ctx, tx, id)
		if err != nil {
			return err
		}
		out = p.message(id, r)
		return nil
	})
	return out, storeErr(err)
}

func restoreHash(st []byte) (hash.Hash, error) {
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(st); err != nil {
		return nil, fault.Internal("restore digest state: %v", err)
	}
	return h, nil
}

// Upload serves UploadArtifactContent: data at offset, which must equal
// the bytes received; an exact resend of bytes received changes nothing.
func (s *Service) Upload(ctx context.Context, req *ctrlv1.UploadArtifactContentRequest) (*ctrlv1.ArtifactPublication, error) {
	id, off, data := req.GetCommandId(), req.GetOffset(), req.GetData()
	if err := checkExistingID(command.OperatorIDField, id); err != nil {
		return nil, err
	}
	if len(data) == 0 {
		return nil, fault.Invalid("data", "data is empty")
	}
	if len(data) > MaxUpload {
		return nil, fault.Invalid("data", "data is %d bytes, at most %d are allowed per call", len(data), MaxUpload)
	}
	now := s.now()
	var out *ctrlv1.ArtifactPublication
	err := s.Store.InTx(ctx, func(tx store.Tx) error {
		r, p, err := loadPublication(ctx, tx, id)
		if err != nil {
			return err
		}
		end := off + uint64(len(data))
		if end < off || end > p.Size {
			return fault.Invalid("data", "offset %d and %d bytes go beyond size_bytes %d", off, len(data), p.Size)
		}
		if p.State != ctrlv1.PublicationState_PUBLICATION_STATE_UPLOADING {
			return fault.Precondition(fault.ReasonStateConflict, "publication %s is %s: it takes no more bytes", quote(id), p.State)
		}
		if end <= p.Received {
			same, err := sameBytes(ctx, tx, publicationBlob+id, off, data)
			if err != nil {
				return err
			}
			if !same {
				return fault.Invalid("offset", "bytes %d to %d were received already, and differ; the next offset is %d", off, end, p.Received)
			}
			out = p.message(id, r)
			return nil
		}
		if off != p.Received {
			return fault.Invalid("offset", "offset is %d; the bytes received so far are %d", off, p.Received)
		}
		h, err := restoreHash(p.Hash)
		if err != nil {
			return err
		}
		h.Write(data)
		if p.Hash, err = h.(encoding.BinaryMarshaler).MarshalBinary(); err != nil {
			return fault.Internal("save digest state: %v", err)
		}
		if err := tx.PutBlobChunk(ctx, publicationBlob+id, off, data); err != nil {
			return err
		}
		p.Received = end
		if r, err = put(ctx, tx, KindPublication, id, r, p, now); err != nil {
			return err
		}
		out = p.message(id, r)
		return nil
	})
	return out, storeErr(err)
}

// sameBytes reports whether the blob holds data at off.
func sameBytes(ctx context.Context, tx store.Tx, blob string, off uint64, data []byte) (bool, error) {
	for len(data) > 0 {
		chunks, err := tx.BlobChunks(ctx, blob, off, 4)
		if err != nil {
			return false, err
		}
		if len(chunks) == 0 {
			return false, nil
		}
		for _, c := range chunks {
			if c.Offset > off {
				return false, nil
			}
			piece := c.Data[off-c.Offset:]
			n := min(len(piece), len(data))
			if !bytes.Equal(piece[:n], data[:n]) {
				return false, nil
			}
			data, off = data[n:], off+uint64(n)
			if len(data) == 0 {
				return true, nil
			}
		}
	}
	return true, nil
}

// Commit serves CommitArtifactPublication: the manifest (a new version),
// or the publication FAILED, which is settled; a resend replays.
func (s *Service) Commit(ctx context.Context, id string) (*ctrlv1.CommitArtifactPublicationResponse, error) {
	if err := checkExistingID(command.OperatorIDField, id); err != nil {
		return nil, err
	}
	// What is judged before the transaction: the bytes of a Platform are
	// read (in short transactions) only when they are complete and match.
	var p *pubRecord
	if err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		_, p, err = loadPublication(ctx, tx, id)
		return err
	}); err != nil {
		return nil, storeErr(err)
	}
	var protocol uint32
	var failure *fault.Error
	if p.State == ctrlv1.PublicationState_PUBLICATION_STATE_UPLOADING {
		failure = s.judge(id, p)
		if failure == nil {
			var err error
			protocol, failure, err = s.inspect(ctx, id, p)
			if err != nil {
				return nil, err
			}
		}
	}
	now := s.now()
	var out *ctrlv1.CommitArtifactPublicationResponse
	err := s.Store.InTx(ctx, func(tx store.Tx) error {
		r, p, err := loadPublication(ctx, tx, id)
		if err != nil {
			return err
		}
		rec, err := tx.GetCommand(ctx, id)
		if err != nil {
			return err
		}
		if p.State != ctrlv1.PublicationState_PUBLICATION_STATE_UPLOADING {
			out = &ctrlv1.CommitArtifactPublicationResponse{}
			if err := proto.Unmarshal(rec.Result, out); err != nil {
				return fault.Internal("decode recorded result: %v", err)
			}
			return nil
		}
		if f := s.judge(id, p); f != nil {
			failure = f
		}
		out = &ctrlv1.CommitArtifactPublicationResponse{}
		if failure != nil {
			_, d, err := fault.Encode(failure)
			if err != nil {
				return fault.Internal("encode failure: %v", err)
			}
			p.State, p.Failure, p.Hash = ctrlv1.PublicationState_PUBLICATION_STATE_FAILED, d, nil
			if err := tx.DeleteBlob(ctx, publicationBlob+id); err != nil {
				return err
			}
		} else {
			v, err := s.manifest(ctx, tx, id, p, protocol, now)
			if err != nil {
				return err
			}
			out.Version = v
			p.State, p.Revision, p.Hash = ctrlv1.PublicationState_PUBLICATION_STATE_COMMITTED, v.GetRevision(), nil
		}
		if r, err = put(ctx, tx, KindPublication, id, r, p, now); err != nil {
			return err
		}
		out.Publication = p.message(id, r)
		if rec.Result, err = proto.Marshal(out); err != nil {
			return fault.Internal("encode result: %v", err)
		}
		rec.Status, rec.CompletedAt = store.CommandCompleted, now
		return tx.UpdateCommand(ctx, rec)
	})
	if err != nil {
		return nil, storeErr(err)
	}
	return out, nil
}

// judge is what fails a publication without reading its bytes: its command
// ID, its size and its digest.
func (s *Service) judge(id string, p *pubRecord) *fault.Error {
	if !publicationRe.MatchString(id) {
		return fault.InvalidReason(fault.ReasonInvalidCommandID, command.OperatorIDField,
			"a publication's command ID must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$ ('/' is not allowed); %s does not", quote(id))
	}
	if p.Received != p.Size {
		return fault.Invalid("size_bytes", "%d bytes were received of the %d declared", p.Received, p.Size)
	}
	h, err := restoreHash(p.Hash)
	if err != nil {
		return err.(*fault.Error)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != p.Digest {
		return fault.Invalid("digest", "the bytes received have digest %s, not the declared %s", got, p.Digest)
	}
	return nil
}

// manifest writes the new version of a verified publication: revision
// latest+1, the artifact created at its first version. A new version is
// never the default by itself.
func (s *Service) manifest(ctx context.Context, tx store.Tx, id string, p *pubRecord, protocol uint32, now time.Time) (*ctrlv1.ArtifactVersion, error) {
	a := &artifactRecord{}
	ar, found, err := get(ctx, tx, KindArtifact, artifactKey(p.Kind, p.ArtifactID), a)
	if err != nil {
		return nil, err
	}
	if !found {
		ar = nil
	}
	a.LatestRevision++
	if _, err := put(ctx, tx, KindArtifact, artifactKey(p.Kind, p.ArtifactID), ar, a, now); err != nil {
		return nil, err
	}
	v := &versionRecord{Digest: p.Digest, Size: p.Size, Format: p.Format, State: ctrlv1.ArtifactVersionState_ARTIFACT_VERSION_STATE_AVAILABLE,
		Publication: id, Protocol: protocol, Blob: publicationBlob + id}
	key := versionKey(p.Kind, p.ArtifactID, a.LatestRevision)
	vr, err := put(ctx, tx, KindVersion, key, nil, v, now)
	if err != nil {
		return nil, err
	}
	d := &digestRecord{}
	dr, found, err := get(ctx, tx, KindDigest, p.Digest, d)
	if err != nil {
		return nil, err
	}
	if !found {
		dr = nil
	}
	d.Versions = append(d.Versions, key)
	if _, err := put(ctx, tx, KindDigest, p.Digest, dr, d, now); err != nil {
		return nil, err
	}
	return versionMessage(p.Kind, p.ArtifactID, a.LatestRevision, vr, v), nil
}
