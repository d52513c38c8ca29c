package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// ErrBackupExists is returned by Backup when dst exists and overwrite is
// false.
var ErrBackupExists = errors.New("the backup file exists")

// Backup writes a consistent copy of the SQLite database at src to dst while
// other connections (a running ctrl) may read and write it, and returns the
// copy's size in bytes.
//
// The copy is made with VACUUM INTO on a connection of its own: one read
// transaction, so it holds exactly the transactions committed before that
// transaction's snapshot (every InTx that had returned when Backup started),
// never part of one, and it does not stop the writer (WAL). The copy is a
// single file without -wal or -shm, written to a temporary file beside dst,
// fsync'd, checked with PRAGMA integrity_check, then moved to dst: a crash or
// an error leaves dst as it was. When dst exists Backup refuses with
// ErrBackupExists unless overwrite. Backup never migrates src nor creates it.
func Backup(ctx context.Context, src, dst string, overwrite bool) (size int64, err error) {
	if src == "" || strings.ContainsRune(src, '?') {
		return 0, fmt.Errorf("store/sqlite: invalid database path %q", src)
	}
	if dst == "" {
		return 0, errors.New("store/sqlite: no backup file")
	}
	fi, err := os.Stat(src)
	if err != nil {
		return 0, fmt.Errorf("store/sqlite: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("store/sqlite: %s is not a regular file", src)
	}
	if !overwrite {
		if _, err := os.Lstat(dst); err == nil {
			return 0, fmt.Errorf("store/sqlite: %s: %w", dst, ErrBackupExists)
		}
	}
	dir := filepath.Dir(dst)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dst)+".tmp-*") // mode 0600: the store holds token hashes and keys' hashes
	if err != nil {
		return 0, fmt.Errorf("store/sqlite: %w", err)
	}
	tmpName := tmp.Name()
	if err := tmp.Close(); err != nil {
		os.Remove(tmpName)
		return 0, fmt.Errorf("store/sqlite: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmpName)
		}
	}()

	if err := vacuumInto(ctx, src, tmpName); err != nil {
		return 0, fmt.Errorf("store/sqlite: copy %s: %w", src, err)
	}
	// SQLite does not fsync the file VACUUM INTO writes.
	if err := syncFile(tmpName); err != nil {
		return 0, fmt.Errorf("store/sqlite: %w", err)
	}
	if err := checkIntegrity(ctx, tmpName); err != nil {
		return 0, fmt.Errorf("store/sqlite: the copy of %s: %w", src, err)
	}
	if fi, err = os.Stat(tmpName); err != nil {
		return 0, fmt.Errorf("store/sqlite: %w", err)
	}
	if overwrite {
		err = os.Rename(tmpName, dst)
	} else {
		// A link fails when dst has appeared meanwhile: never clobbered.
		if err = os.Link(tmpName, dst); err == nil {
			err = os.Remove(tmpName)
		} else if errors.Is(err, os.ErrExist) {
			err = fmt.Errorf("%s: %w", dst, ErrBackupExists)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("store/sqlite: %w", err)
	}
	if err := syncFile(dir); err != nil {
		return 0, fmt.Errorf("store/sqlite: %w", err)
	}
	return fi.Size(), nil
}

// vacuumInto copies the database at src into the empty file dst.
func vacuumInto(ctx context.Context, src, dst string) error {
	v := url.Values{}
	v.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	db, err := sql.Open("sqlite", src+"?"+v.Encode())
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	_, err = db.ExecContext(ctx, `VACUUM INTO ?`, dst)
	return err
}

// checkIntegrity runs PRAGMA integrity_check on the database file path.
func checkIntegrity(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return err
	}
	defer db.Close()
	var res string
	if err := db.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&res); err != nil {
		return err
	}
	if res != "ok" {
		return fmt.Errorf("integrity_check: %s", res)
	}
	return db.Close()
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	return errors.Join(err, f.Close())
}
