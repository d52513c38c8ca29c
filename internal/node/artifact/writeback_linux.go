package artifact

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteBack starts writing n bytes of f from off to the disk without
// waiting for them (best effort: the fsync that follows is what counts).
func startWriteBack(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}
