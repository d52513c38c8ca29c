package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// TestBackupWhileWriting takes a backup while writers commit resources as
// fast as they can: the copy opens, passes PRAGMA integrity_check, holds
// every resource committed before Backup started, and Open (with its
// migrations) accepts it.
func TestBackupWhileWriting(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src := filepath.Join(dir, "ctrl.db")
	s, err := Open(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	var committed atomic.Int64 // resources r-0 … r-(committed-1) are committed
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var seq atomic.Int64
	var mu sync.Mutex
	done := map[int64]bool{}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := seq.Add(1) - 1
				now := time.Now().UTC().Truncate(time.Microsecond)
				err := s.InTx(ctx, func(tx store.Tx) error {
					return tx.InsertResource(ctx, &store.Resource{Kind: store.KindEgress, ID: fmt.Sprintf("r-%d", n),
						CreatedAt: now, UpdatedAt: now, Revision: 1, Spec: make([]byte, 512)})
				})
				if err != nil {
					t.Error(err)
					return
				}
				// committed is the longest prefix of sequence numbers done.
				mu.Lock()
				done[n] = true
				c := committed.Load()
				for done[c] {
					delete(done, c)
					c++
				}
				committed.Store(c)
				mu.Unlock()
			}
		}()
	}
	for committed.Load() < 500 {
		time.Sleep(time.Millisecond)
	}
	before := committed.Load()
	out := filepath.Join(dir, "backup.db")
	size, err := Backup(ctx, src, out, false)
	if err != nil {
		t.Fatal(err)
	}
	after := committed.Load()
	close(stop)
	wg.Wait()
	t.Logf("backup of %d bytes; %d resources committed before it, %d after it, %d in all", size, before, after, seq.Load())
	if after == before {
		t.Error("no write committed during the backup: the test proves nothing")
	}
	if fi, err := os.Stat(out); err != nil || fi.Size() != size || fi.Mode().Perm() != 0o600 {
		t.Errorf("backup file: %v, %v; want %d bytes, mode 0600", fi, err, size)
	}
	for _, suffix := range []string{"-wal", "-shm", "-journal"} {
		if _, err := os.Stat(out + suffix); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s beside the backup: %v", suffix, err)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".backup.db.tmp-*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}

	db, err := sql.Open("sqlite", out)
	if err != nil {
		t.Fatal(err)
	}
	var check string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		t.Errorf("integrity_check = %q, %v", check, err)
	}
	var n int64
	if err := db.QueryRow(`SELECT count(*) FROM resources`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n < before {
		t.Errorf("the backup holds %d resources, %d were committed before it started", n, before)
	}
	for i := range before {
		var one int
		if err := db.QueryRow(`SELECT 1 FROM resources WHERE kind = 'egress' AND id = ?`, fmt.Sprintf("r-%d", i)).Scan(&one); err != nil {
			t.Fatalf("r-%d, committed before the backup: %v", i, err)
		}
	}
	db.Close()

	restored, err := Open(ctx, out)
	if err != nil {
		t.Fatalf("Open the backup: %v", err)
	}
	if err := restored.View(ctx, func(tx store.Tx) error {
		_, err := tx.GetResource(ctx, store.KindEgress, "r-0")
		return err
	}); err != nil {
		t.Errorf("GetResource from the backup: %v", err)
	}
	restored.Close()
}

// TestBackupRefusals: an existing file is kept unless overwrite; a missing
// database is not created.
func TestBackupRefusals(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src := filepath.Join(dir, "ctrl.db")
	s, err := Open(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	out := filepath.Join(dir, "out.db")
	if err := os.WriteFile(out, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Backup(ctx, src, out, false); !errors.Is(err, ErrBackupExists) {
		t.Errorf("Backup over an existing file = %v, want ErrBackupExists", err)
	}
	if b, _ := os.ReadFile(out); string(b) != "keep" {
		t.Errorf("the existing file was changed")
	}
	if _, err := Backup(ctx, src, out, true); err != nil {
		t.Errorf("Backup with overwrite: %v", err)
	}
	missing := filepath.Join(dir, "missing.db")
	if _, err := Backup(ctx, missing, filepath.Join(dir, "x.db"), false); err == nil {
		t.Error("Backup of a missing database: no error")
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Backup created the missing database: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".*.tmp-*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
}
