package rowcodec

import (
	"fmt"
	"math"

	"github.com/kibotos/kibotos/internal/store"
)

// BlobChunkArgs checks a chunk PutBlobChunk is given (store.BlobTx) and
// returns its offset as a column value.
func BlobChunkArgs(blobID string, offset uint64, data []byte) (int64, error) {
	if blobID == "" {
		return 0, fmt.Errorf("store: a blob chunk needs its blob ID")
	}
	if len(data) == 0 || len(data) > store.MaxBlobChunk {
		return 0, fmt.Errorf("store: blob chunk of %d bytes, want 1 to %d", len(data), store.MaxBlobChunk)
	}
	if offset > math.MaxInt64-uint64(len(data)) {
		return 0, fmt.Errorf("store: blob chunk at offset %d of %d bytes ends out of range", offset, len(data))
	}
	return int64(offset), nil
}

// BlobFrom returns the from of BlobChunks as a column value: an offset
// beyond every storable one is clamped to the last (no chunk contains it).
func BlobFrom(from uint64) int64 {
	if from > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(from)
}
