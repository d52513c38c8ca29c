package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
)

// PutBlobChunk implements store.Tx.
func (t *txn) PutBlobChunk(ctx context.Context, blobID string, offset uint64, data []byte) error {
	off, err := rowcodec.BlobChunkArgs(blobID, offset, data)
	if err != nil {
		return err
	}
	return t.insertUnique(ctx,
		fmt.Sprintf("chunk of blob %q at offset %d", blobID, offset),
		stmt{`SELECT EXISTS (SELECT 1 FROM artifact_chunks WHERE blob_id = $1 AND start_offset = $2)`, []any{blobID, off}},
		stmt{`INSERT INTO artifact_chunks (blob_id, start_offset, data) VALUES ($1, $2, $3)`, []any{blobID, off, data}})
}

// blobChunksSQL is one range scan of the primary key of artifact_chunks:
// from the last chunk starting at or before $2 (the subquery, a probe of
// the same index that reads no chunk's bytes), keeping it only when it
// contains $2 (octet_length of an uncompressed out-of-line value reads
// its size, not its bytes), and the chunks after it.
const blobChunksSQL = `SELECT start_offset, data FROM artifact_chunks
	WHERE blob_id = $1
		AND start_offset >= COALESCE((SELECT c.start_offset FROM artifact_chunks c
			WHERE c.blob_id = $1 AND c.start_offset <= $2 ORDER BY c.start_offset DESC LIMIT 1), $2)
		AND (start_offset > $2 OR start_offset + octet_length(data) > $2)
	ORDER BY start_offset LIMIT $3`

// BlobChunks implements store.Tx.
func (t *txn) BlobChunks(ctx context.Context, blobID string, from uint64, limit int) ([]store.BlobChunk, error) {
	if limit <= 0 {
		return nil, nil
	}
	var out []store.BlobChunk
	err := t.query(ctx, blobChunksSQL, []any{blobID, rowcodec.BlobFrom(from), limit}, func(rows pgx.Rows) error {
		var (
			off  int64
			data []byte
		)
		if err := rows.Scan(&off, &data); err != nil {
			return err
		}
		out = append(out, store.BlobChunk{Offset: uint64(off), Data: data})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteBlob implements store.Tx.
func (t *txn) DeleteBlob(ctx context.Context, blobID string) error {
	_, err := t.exec(ctx, `DELETE FROM artifact_chunks WHERE blob_id = $1`, blobID)
	return err
}
