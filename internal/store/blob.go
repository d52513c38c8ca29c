package store

import "context"

// MaxBlobChunk is the largest chunk PutBlobChunk stores: 4 MiB.
const MaxBlobChunk = 4 << 20

// BlobChunk is a piece of an artifact's bytes.
type BlobChunk struct {
	Offset uint64
	Data   []byte
}

// BlobTx are the operations on artifact bytes of a transaction. A blob is
// the chunks stored under its ID (table artifact_chunks), each starting at
// an offset; what the chunks of a blob mean together (no gap, no overlap,
// its length and digest) is the caller's business.
type BlobTx interface {
	// PutBlobChunk stores data (1 byte to MaxBlobChunk) starting at offset
	// of blob blobID; ErrDuplicate when a chunk of that blob starts at
	// offset already. offset+len(data) must not exceed 2^63-1.
	PutBlobChunk(ctx context.Context, blobID string, offset uint64, data []byte) error
	// BlobChunks returns up to limit chunks of blobID in offset order: the
	// one containing from (offset <= from < offset+len) and those after it.
	// It is one range scan of the chunks' primary key. A limit of 0 or less
	// returns nothing.
	BlobChunks(ctx context.Context, blobID string, from uint64, limit int) ([]BlobChunk, error)
	// DeleteBlob removes every chunk of blobID (none is not an error).
	DeleteBlob(ctx context.Context, blobID string) error
}
