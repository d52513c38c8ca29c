package guest

import guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"

// Bounds of a process's buffers in the guest.
const (
	// RingBytes bounds the output a process's ring holds (stdout and
	// stderr together).
	RingBytes = 1 << 20
	// ChunkBytes bounds one output chunk (one read of a pipe, one Output
	// event).
	ChunkBytes = 128 << 10
	// InputBytes bounds a process's input buffer: input the guest has
	// accepted and not yet written to the process.
	InputBytes = 64 << 10
)

// chunk is one read of a stream, at output offset off.
type chunk struct {
	stream guestv1.Stream
	off    uint64
	data   []byte
}

// ring keeps the most recent output of a process, at most max bytes, in
// chunks of at most ChunkBytes. Offsets count every byte ever appended, so
// that a reader knows what it missed. It never blocks the writer: when it
// is full, the oldest bytes go. Not safe for concurrent use.
type ring struct {
	chunks []chunk
	start  uint64 // the offset of the first byte held
	end    uint64 // the offset after the last byte appended
	max    int
	size   int
}

func newRing(max int) *ring { return &ring{max: max} }

// append adds data (at most ChunkBytes; the ring keeps it) and drops the
// oldest bytes beyond max.
func (r *ring) append(stream guestv1.Stream, data []byte) {
	if len(data) == 0 {
		return
	}
	r.chunks = append(r.chunks, chunk{stream: stream, off: r.end, data: data})
	r.end += uint64(len(data))
	r.size += len(data)
	for r.size > r.max {
		over := r.size - r.max
		c := &r.chunks[0]
		if over >= len(c.data) {
			r.size -= len(c.data)
			r.chunks[0] = chunk{}
			r.chunks = r.chunks[1:]
		} else {
			c.data = c.data[over:]
			c.off += uint64(over)
			r.size -= over
		}
	}
	if len(r.chunks) > 0 {
		r.start = r.chunks[0].off
	} else {
		r.start = r.end
	}
}

// read returns what a reader at offset from gets next: a drop notice when
// from is older than what the ring holds, or the rest of the chunk that
// holds from, or nothing (ok false) when from is at or past the end. next
// is the offset after what it returned.
func (r *ring) read(from uint64) (ev *guestv1.EventsResponse, next uint64, ok bool) {
	if from < r.start {
		return &guestv1.EventsResponse{Event: &guestv1.EventsResponse_Dropped{Dropped: &guestv1.Dropped{
			Offset: from, Bytes: r.start - from}}}, r.start, true
	}
	if from >= r.end {
		return nil, from, false
	}
	// The chunk holding from: the last whose offset is at most from.
	lo, hi := 0, len(r.chunks)-1
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if r.chunks[mid].off <= from {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	c := r.chunks[lo]
	data := c.data[from-c.off:]
	return &guestv1.EventsResponse{Event: &guestv1.EventsResponse_Output{Output: &guestv1.Output{
		Stream: c.stream, Offset: from, Data: data}}}, from + uint64(len(data)), true
}

// inputBuffer is input the guest accepted for a process and has not yet
// written to it, at most max bytes. offset counts every byte accepted.
// Not safe for concurrent use.
type inputBuffer struct {
	buf    []byte
	max    int
	offset uint64
}

// accept takes data, whose first byte is at input offset off: bytes
// before b.offset were already accepted (a retry) and count as accepted;
// of the rest it takes what fits. It reports how many bytes of data are
// accepted; gap is true when off is past b.offset (nothing taken).
func (b *inputBuffer) accept(off uint64, data []byte) (accepted int, gap bool) {
	if off > b.offset {
		return 0, true
	}
	skip := b.offset - off
	if skip >= uint64(len(data)) {
		return len(data), false
	}
	rest := data[skip:]
	n := min(b.max-len(b.buf), len(rest))
	b.buf = append(b.buf, rest[:n]...)
	b.offset += uint64(n)
	return int(skip) + n, false
}
