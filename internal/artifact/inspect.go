package artifact

import (
	"context"
	"debug/elf"
	"errors"
	"io"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
)

// inspect checks the layout of a publication whose size and digest match,
// reading its bytes in short transactions: a TAR_GZIP starts with the gzip
// magic; an ELF is a static Linux executable (no PT_INTERP) that declares
// its guest protocol version (nodewire.GuestProtocolOf), which it returns.
// A layout that does not fit is the failure; err is the store's.
func (s *Service) inspect(ctx context.Context, id string, p *pubRecord) (protocol uint32, failure *fault.Error, err error) {
	rd := &blobReader{ctx: ctx, st: s.Store, blob: publicationBlob + id, size: p.Size}
	switch p.Format {
	case ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR_GZIP:
		head := make([]byte, 2)
		if _, err := rd.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
			return 0, nil, rd.storeErr(err)
		}
		if head[0] != 0x1f || head[1] != 0x8b {
			return 0, fault.Invalid("format", "the bytes are not gzip-compressed (format TAR_GZIP)"), nil
		}
	case ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF:
		f, err := elf.NewFile(rd)
		if err != nil {
			if rd.err != nil {
				return 0, nil, rd.storeErr(rd.err)
			}
			return 0, fault.Invalid("format", "the bytes are not an ELF file: %v", err), nil
		}
		if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
			return 0, fault.Invalid("format", "the ELF file is not an executable (type %s)", f.Type), nil
		}
		for _, ph := range f.Progs {
			if ph.Type == elf.PT_INTERP {
				return 0, fault.Invalid("format", "the ELF executable is dynamically linked (it has PT_INTERP); a Platform must be static"), nil
			}
		}
		v, ok, err := scanProtocol(rd)
		if err != nil {
			return 0, nil, rd.storeErr(err)
		}
		if !ok {
			return 0, fault.Invalid("format", "the ELF executable declares no guest protocol version (%q, the version, ';')", nodewire.GuestProtocolMarker), nil
		}
		return v, nil, nil
	}
	return 0, nil, nil
}

// scanProtocol finds the first guest protocol declaration in rd, reading it
// in pieces that overlap by the longest declaration.
func scanProtocol(rd *blobReader) (uint32, bool, error) {
	const piece = MaxFetchMessage
	overlap := len(nodewire.GuestProtocolMarker) + 11
	buf := make([]byte, 0, piece+overlap)
	for off := uint64(0); off < rd.size; {
		n := min(uint64(piece), rd.size-off)
		tail := len(buf)
		buf = buf[:tail+int(n)]
		if _, err := rd.ReadAt(buf[tail:], int64(off)); err != nil && !errors.Is(err, io.EOF) {
			return 0, false, err
		}
		if v, ok := nodewire.GuestProtocolOf(buf); ok {
			return v, true, nil
		}
		off += n
		if len(buf) > overlap {
			buf = append(buf[:0], buf[len(buf)-overlap:]...)
		}
	}
	return 0, false, nil
}

// blobReader reads a blob at offsets, one short transaction per chunk.
type blobReader struct {
	ctx  context.Context
	st   store.Store
	blob string
	size uint64
	// err is the first store error (ReadAt's callers may hide it).
	err error
	// last is the chunk read last.
	last *store.BlobChunk
}

func (b *blobReader) storeErr(err error) error {
	if b.err != nil {
		return storeErr(b.err)
	}
	return storeErr(err)
}

// ReadAt implements io.ReaderAt.
func (b *blobReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	n := 0
	for n < len(p) {
		at := uint64(off) + uint64(n)
		if at >= b.size {
			return n, io.EOF
		}
		c := b.last
		if c == nil || at < c.Offset || at >= c.Offset+uint64(len(c.Data)) {
			var chunks []store.BlobChunk
			err := b.st.View(b.ctx, func(tx store.Tx) error {
				var err error
				chunks, err = tx.BlobChunks(b.ctx, b.blob, at, 1)
				return err
			})
			if err != nil {
				b.err = err
				return n, err
			}
			if len(chunks) == 0 || chunks[0].Offset > at {
				err := errors.New("artifact bytes missing")
				b.err = err
				return n, err
			}
			b.last = &chunks[0]
			c = b.last
		}
		n += copy(p[n:], c.Data[at-c.Offset:])
	}
	return n, nil
}

var _ io.ReaderAt = (*blobReader)(nil)
