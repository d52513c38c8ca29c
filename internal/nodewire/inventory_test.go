package nodewire

import (
	"strings"
	"testing"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

func TestCheckInventoryEntry(t *testing.T) {
	digest := "sha256:" + strings.Repeat("0f", 32)
	for _, tc := range []struct {
		id, version, digest string
		ok                  bool
	}{
		{"tiny", "1", digest, true},
		{"default", "v1-0123abcd", "", true},
		{"My_Template.x", strings.Repeat("9", MaxInventoryNameBytes), "", true},
		{"", "1", "", false},
		{"tiny", "", "", false},
		{"tiny", strings.Repeat("9", MaxInventoryNameBytes+1), "", false},
		{".hidden", "1", "", false},
		{"-flag", "1", "", false},
		{"a/b", "1", "", false},
		{"..", "1", "", false},
		{"tiny", "1\x00", "", false},
		{"tiny", "1", "sha256:" + strings.Repeat("0F", 32), false},
		{"tiny", "1", "sha512:" + strings.Repeat("0f", 32), false},
		{"tiny", "1", digest + "0", false},
	} {
		err := CheckInventoryEntry(&nodev1.TemplateInfo{TemplateId: tc.id, Version: tc.version, Digest: tc.digest})
		if (err == nil) != tc.ok {
			t.Errorf("CheckInventoryEntry(%q, %q, %q) = %v, want ok %v", tc.id, tc.version, tc.digest, err, tc.ok)
		}
	}
}

func TestCheckInventory(t *testing.T) {
	full := make([]*nodev1.TemplateInfo, MaxInventoryEntries)
	over := make([]*nodev1.TemplateInfo, MaxInventoryEntries+1)
	for _, tc := range []struct {
		inv *nodev1.Inventory
		ok  bool
	}{
		{&nodev1.Inventory{}, true},
		{&nodev1.Inventory{Templates: full, Platforms: full}, true},
		{&nodev1.Inventory{Templates: over}, false},
		{&nodev1.Inventory{Platforms: over}, false},
	} {
		if err := CheckInventory(tc.inv); (err == nil) != tc.ok {
			t.Errorf("CheckInventory(%d templates, %d platforms) = %v", len(tc.inv.GetTemplates()), len(tc.inv.GetPlatforms()), err)
		}
	}
}
