package template

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Published template versions: a version fetched from ctrl (an archive
// verified by its digest, internal/node/artifact) is extracted into
// dir/<template_id>/<version>/rootfs like any other, built aside in
// dir/<template_id>/.build-* and renamed in, and its digest is recorded
// next to its rootfs in dir/<template_id>/<version>/digest. The names come
// from ctrl and are checked with CheckName before they become paths.

// digestFile records a published version's digest.
const digestFile = "digest"

// maxNameBytes bounds a template ID or version used as a directory name.
const maxNameBytes = 128

// CheckName reports whether s can be a template ID or version on disk:
// 1 to 128 bytes of letters, digits, '.', '_' and '-', not beginning with
// '.'.
func CheckName(s string) error {
	if s == "" || len(s) > maxNameBytes || s[0] == '.' || s[0] == '-' {
		return fmt.Errorf("template: name %q is not 1 to %d letters, digits, '.', '_' or '-' (not beginning with '.' or '-')", cutName(s), maxNameBytes)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("template: name %q has a character other than letters, digits, '.', '_' or '-'", cutName(s))
		}
	}
	return nil
}

// Install extracts the archive at archive (format f) as version version of
// template id in dir, recording digest, and returns its rootfs; a version
// that is there already is returned as is. Concurrent callers are safe:
// each builds aside and the first rename wins.
func Install(dir, id, version, digest, archive string, f Format, lim Limits) (string, error) {
	if err := CheckName(id); err != nil {
		return "", err
	}
	if err := CheckName(version); err != nil {
		return "", err
	}
	if id == DefaultName {
		return "", fmt.Errorf("template: %q is built on the node, not published", DefaultName)
	}
	return buildAside(dir, id, version, func(build string) error {
		rootfs := filepath.Join(build, "rootfs")
		if err := os.MkdirAll(rootfs, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(rootfs, 0o755); err != nil {
			return err
		}
		in, err := os.Open(archive)
		if err != nil {
			return fmt.Errorf("template: %w", err)
		}
		err = Extract(in, f, rootfs, lim)
		in.Close()
		if err != nil {
			return fmt.Errorf("template %s version %s: %w", id, version, err)
		}
		if err := os.WriteFile(filepath.Join(build, digestFile), []byte(digest+"\n"), 0o644); err != nil {
			return err
		}
		return syncTree(build)
	})
}

// Published lists every published version under dir (those with a
// recorded digest), with its digest.
func Published(dir string) ([]Info, error) {
	var out []Info
	err := eachTemplate(dir, func(_ string, versions []installed) {
		for _, v := range versions {
			if v.info.Digest != "" {
				out = append(out, v.info)
			}
		}
	})
	return out, err
}

// Remove deletes a version of a template: renamed aside first (so it is
// never seen half removed), then removed.
func Remove(dir, id, version string) error {
	if err := CheckName(id); err != nil {
		return err
	}
	if err := CheckName(version); err != nil {
		return err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	trash := filepath.Join(dir, id, ".trash-"+hex.EncodeToString(rnd[:]))
	if err := os.Rename(filepath.Join(dir, id, version), trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	return os.RemoveAll(trash)
}
