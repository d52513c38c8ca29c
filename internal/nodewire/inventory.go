package nodewire

import (
	"fmt"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

const (
	// MaxInventoryEntries bounds each list of an Inventory (templates,
	// platforms): ctrl ignores a larger Inventory whole.
	MaxInventoryEntries = 4096
	// MaxInventoryNameBytes bounds a template or platform ID or version in
	// an Inventory, the node's bound on such a name on disk.
	MaxInventoryNameBytes = 128
)

// CheckInventory reports whether inv is within the bounds ctrl accepts:
// at most MaxInventoryEntries templates and as many platforms. The
// entries themselves are vetted one by one with CheckInventoryEntry.
func CheckInventory(inv *nodev1.Inventory) error {
	if n := len(inv.GetTemplates()); n > MaxInventoryEntries {
		return fmt.Errorf("inventory lists %d templates (at most %d)", n, MaxInventoryEntries)
	}
	if n := len(inv.GetPlatforms()); n > MaxInventoryEntries {
		return fmt.Errorf("inventory lists %d platforms (at most %d)", n, MaxInventoryEntries)
	}
	return nil
}

// CheckInventoryEntry reports whether t can name a template or platform
// version a node holds: its ID and version 1 to MaxInventoryNameBytes
// letters, digits, '.', '_' or '-', not beginning with '.' or '-' (the
// names a node accepts as directory names), and its digest empty or
// "sha256:" and 64 lower-case hex digits.
func CheckInventoryEntry(t *nodev1.TemplateInfo) error {
	if !inventoryName(t.GetTemplateId()) || !inventoryName(t.GetVersion()) {
		return fmt.Errorf("inventory entry %q version %q is not a name a node holds",
			Cut(t.GetTemplateId(), 64), Cut(t.GetVersion(), 64))
	}
	if d := t.GetDigest(); d != "" && !inventoryDigest(d) {
		return fmt.Errorf("inventory entry %q version %q: digest %q is not sha256 and 64 lower-case hex digits",
			t.GetTemplateId(), t.GetVersion(), Cut(d, 80))
	}
	return nil
}

func inventoryName(s string) bool {
	if s == "" || len(s) > MaxInventoryNameBytes || s[0] == '.' || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func inventoryDigest(d string) bool {
	const prefix = "sha256:"
	if len(d) != len(prefix)+64 || d[:len(prefix)] != prefix {
		return false
	}
	for i := len(prefix); i < len(d); i++ {
		c := d[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
