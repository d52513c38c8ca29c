package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/kibotos/kibotos/internal/store"
)

// blobTests are the conformance tests of store.BlobTx.
var blobTests = []struct {
	name string
	fn   func(*testing.T, store.Store)
}{
	{"BlobChunks", testBlobChunks},
	{"BlobPutRefused", testBlobPutRefused},
	{"BlobWritesInView", testBlobWritesInView},
	{"BlobLarge", testBlobLarge},
}

// blobBytes returns n bytes that differ from those of any other (blob, offset).
func blobBytes(seed string, offset uint64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(uint64(i)+offset) ^ byte(len(seed)*31)
	}
	return b
}

func putChunks(t *testing.T, s store.Store, blobID string, chunks ...store.BlobChunk) {
	t.Helper()
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for _, c := range chunks {
			if err := tx.PutBlobChunk(ctx, blobID, c.Offset, c.Data); err != nil {
				return err
			}
		}
		return nil
	})
}

func blobChunks(t *testing.T, s store.Store, blobID string, from uint64, limit int) []store.BlobChunk {
	t.Helper()
	var out []store.BlobChunk
	view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
		out, err = tx.BlobChunks(ctx, blobID, from, limit)
		return err
	})
	return out
}

func chunkOffsets(cs []store.BlobChunk) []uint64 {
	out := []uint64{}
	for _, c := range cs {
		out = append(out, c.Offset)
	}
	return out
}

// testBlobChunks: BlobChunks returns the chunk containing from and those
// after it, in offset order, up to limit, their bytes as put; blobs are
// apart (one's ID a prefix of another's included); DeleteBlob removes one
// blob's chunks only, and deleting none is no error.
func testBlobChunks(t *testing.T, s store.Store) {
	// Chunks of "a" at 0 (10 bytes), 10 (5), 15 (1), then a gap, 100 (20);
	// put out of order, in two transactions.
	a := []store.BlobChunk{
		{Offset: 0, Data: blobBytes("a", 0, 10)},
		{Offset: 10, Data: blobBytes("a", 10, 5)},
		{Offset: 15, Data: blobBytes("a", 15, 1)},
		{Offset: 100, Data: blobBytes("a", 100, 20)},
	}
	putChunks(t, s, "a", a[3], a[1])
	putChunks(t, s, "a", a[0], a[2])
	putChunks(t, s, "ab", store.BlobChunk{Offset: 5, Data: blobBytes("ab", 5, 7)})
	for _, tc := range []struct {
		from  uint64
		limit int
		want  []uint64
	}{
		{0, 10, []uint64{0, 10, 15, 100}},
		{0, 2, []uint64{0, 10}},
		{0, 1, []uint64{0}},
		{9, 10, []uint64{0, 10, 15, 100}}, // inside the first
		{10, 2, []uint64{10, 15}},
		{14, 10, []uint64{10, 15, 100}},
		{15, 10, []uint64{15, 100}},
		{16, 10, []uint64{100}}, // in the gap: from the next chunk
		{99, 10, []uint64{100}},
		{100, 10, []uint64{100}},
		{119, 10, []uint64{100}},
		{120, 10, []uint64{}}, // at the end
		{1 << 40, 10, []uint64{}},
		{math.MaxInt64, 10, []uint64{}},
		{math.MaxUint64, 10, []uint64{}},
		{0, 0, []uint64{}},
		{0, -1, []uint64{}},
	} {
		got := blobChunks(t, s, "a", tc.from, tc.limit)
		if fmt.Sprint(chunkOffsets(got)) != fmt.Sprint(tc.want) {
			t.Errorf("BlobChunks(a, %d, %d) = offsets %v, want %v", tc.from, tc.limit, chunkOffsets(got), tc.want)
			continue
		}
		for _, c := range got {
			want := blobBytes("a", c.Offset, len(c.Data))
			for _, p := range a {
				if p.Offset == c.Offset {
					want = p.Data
				}
			}
			if !bytes.Equal(c.Data, want) {
				t.Errorf("BlobChunks(a, %d, %d): chunk at %d holds %x, want %x", tc.from, tc.limit, c.Offset, c.Data, want)
			}
		}
	}
	if got := blobChunks(t, s, "ab", 0, 10); len(got) != 1 || got[0].Offset != 5 || !bytes.Equal(got[0].Data, blobBytes("ab", 5, 7)) {
		t.Errorf("BlobChunks(ab, 0) = %+v, want the chunk at 5", got)
	}
	if got := blobChunks(t, s, "nothing", 0, 10); len(got) != 0 {
		t.Errorf("BlobChunks of a blob never put = %+v, want none", got)
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := tx.DeleteBlob(ctx, "a"); err != nil {
			return err
		}
		if got, err := tx.BlobChunks(ctx, "a", 0, 10); err != nil || len(got) != 0 {
			t.Errorf("BlobChunks(a) after DeleteBlob in the transaction: %+v, %v; want none", got, err)
		}
		return tx.DeleteBlob(ctx, "never-put")
	})
	if got := blobChunks(t, s, "a", 0, 10); len(got) != 0 {
		t.Errorf("BlobChunks(a) after DeleteBlob: %+v, want none", got)
	}
	if got := blobChunks(t, s, "ab", 0, 10); len(got) != 1 {
		t.Errorf("BlobChunks(ab) after DeleteBlob(a): %+v, want its chunk", got)
	}
	// A deleted blob's offsets can be put again.
	putChunks(t, s, "a", a[0])
	if got := blobChunks(t, s, "a", 0, 10); len(got) != 1 || !bytes.Equal(got[0].Data, a[0].Data) {
		t.Errorf("BlobChunks(a) after putting again: %+v", got)
	}
}

// testBlobPutRefused: a chunk at an offset where one of the blob starts is
// ErrDuplicate, keeps the stored bytes and leaves the transaction usable;
// an empty or too large chunk, one ending beyond 2^63-1 or of no blob ID is
// refused and stores nothing.
func testBlobPutRefused(t *testing.T, s store.Store) {
	ctx := context.Background()
	first := blobBytes("b", 0, 8)
	putChunks(t, s, "b", store.BlobChunk{Offset: 0, Data: first})
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		err := tx.PutBlobChunk(ctx, "b", 0, []byte("other"))
		wantErr(t, "PutBlobChunk at a taken offset", err, store.ErrDuplicate)
		// Usable after the duplicate: a chunk at another offset is stored.
		return tx.PutBlobChunk(ctx, "b", 8, []byte("next"))
	})
	if got := blobChunks(t, s, "b", 0, 10); len(got) != 2 || !bytes.Equal(got[0].Data, first) || string(got[1].Data) != "next" {
		t.Errorf("BlobChunks(b) after a duplicate: %+v", got)
	}
	for name, c := range map[string]struct {
		blob   string
		offset uint64
		data   []byte
	}{
		"empty":          {"c", 0, []byte{}},
		"nil":            {"c", 0, nil},
		"over 4 MiB":     {"c", 0, make([]byte, store.MaxBlobChunk+1)},
		"ends past 2^63": {"c", math.MaxInt64 - 1, []byte{1, 2}},
		"offset 2^63":    {"c", math.MaxInt64 + 1, []byte{1}},
		"no blob ID":     {"", 0, []byte{1}},
	} {
		err := s.InTx(ctx, func(tx store.Tx) error { return tx.PutBlobChunk(ctx, c.blob, c.offset, c.data) })
		if err == nil || errors.Is(err, store.ErrDuplicate) {
			t.Errorf("PutBlobChunk %s: error %v, want a refusal", name, err)
		}
	}
	if got := blobChunks(t, s, "c", 0, 10); len(got) != 0 {
		t.Errorf("BlobChunks(c) after refused puts: %+v, want none", got)
	}
	// The largest chunk, and the last byte a chunk may hold, are stored.
	top := uint64(math.MaxInt64 - 1)
	putChunks(t, s, "c",
		store.BlobChunk{Offset: 0, Data: blobBytes("c", 0, store.MaxBlobChunk)},
		store.BlobChunk{Offset: top, Data: []byte{7}})
	if got := blobChunks(t, s, "c", top, 10); len(got) != 1 || got[0].Offset != top || !bytes.Equal(got[0].Data, []byte{7}) {
		t.Errorf("BlobChunks(c, 2^63-2) = %+v, want the 1-byte chunk there", got)
	}
	if got := blobChunks(t, s, "c", store.MaxBlobChunk-1, 1); len(got) != 1 || got[0].Offset != 0 || len(got[0].Data) != store.MaxBlobChunk {
		t.Errorf("BlobChunks(c, 4 MiB - 1, 1) = %d chunks, want the 4 MiB chunk at 0", len(got))
	}
}

// testBlobWritesInView: PutBlobChunk and DeleteBlob in View are
// ErrReadOnly and change nothing.
func testBlobWritesInView(t *testing.T, s store.Store) {
	ctx := context.Background()
	putChunks(t, s, "v", store.BlobChunk{Offset: 0, Data: []byte("kept")})
	for name, write := range map[string]func(tx store.Tx) error{
		"PutBlobChunk": func(tx store.Tx) error { return tx.PutBlobChunk(ctx, "v", 4, []byte("more")) },
		"DeleteBlob":   func(tx store.Tx) error { return tx.DeleteBlob(ctx, "v") },
	} {
		err := s.View(ctx, func(tx store.Tx) error { return write(tx) })
		wantErr(t, name+" in View", err, store.ErrReadOnly)
	}
	if got := blobChunks(t, s, "v", 0, 10); len(got) != 1 || string(got[0].Data) != "kept" {
		t.Errorf("BlobChunks(v) after writes in View: %+v, want the one chunk", got)
	}
}

// testBlobLarge streams a 24 MiB blob put in 1 MiB chunks (one
// transaction each, as an upload does) back 3 chunks at a time from each
// call's end, and from an offset inside a chunk.
func testBlobLarge(t *testing.T, s store.Store) {
	const chunk, n = 1 << 20, 24
	for i := range n {
		off := uint64(i * chunk)
		putChunks(t, s, "big", store.BlobChunk{Offset: off, Data: blobBytes("big", off, chunk)})
	}
	var next uint64
	calls := 0
	for {
		got := blobChunks(t, s, "big", next, 3)
		if len(got) == 0 {
			break
		}
		calls++
		for _, c := range got {
			if c.Offset != next || !bytes.Equal(c.Data, blobBytes("big", next, chunk)) {
				t.Fatalf("chunk at %d (%d bytes), want the one at %d", c.Offset, len(c.Data), next)
			}
			next += uint64(len(c.Data))
		}
	}
	if next != n*chunk || calls != n/3 {
		t.Errorf("streamed %d bytes in %d calls, want %d in %d", next, calls, n*chunk, n/3)
	}
	if got := blobChunks(t, s, "big", 5*chunk+12345, 2); fmt.Sprint(chunkOffsets(got)) != fmt.Sprint([]uint64{5 * chunk, 6 * chunk}) {
		t.Errorf("BlobChunks(big, inside chunk 5, 2) = offsets %v", chunkOffsets(got))
	}
}
