package reconciler

import (
	"fmt"
	"strings"
	"testing"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/paging"
)

// TestInventory: an Inventory replaces the templates and platforms of the
// stored Hello (what GetNode shows) and the templates placement reads;
// the rest of the node row stays. An oversized Inventory is ignored
// whole, an entry that cannot name a version is left out, and an
// Inventory from a replaced stream changes nothing.
func TestInventory(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	tiny := &nodev1.TemplateInfo{TemplateId: "tiny", Version: "1", Digest: digest}
	plat := &nodev1.TemplateInfo{TemplateId: "sandbox", Version: "3", Digest: digest}
	builtin := &nodev1.TemplateInfo{TemplateId: "default", Version: "v1-abc"}
	many := make([]*nodev1.TemplateInfo, nodewire.MaxInventoryEntries+1)
	for i := range many {
		many[i] = &nodev1.TemplateInfo{TemplateId: fmt.Sprintf("t%d", i), Version: "1", Digest: digest}
	}
	type want struct {
		templates []string // id/version as GetNode shows them (published only)
		platforms []string
		tiny      bool // placement: the node holds tiny version 1
	}
	for _, tc := range []struct {
		name     string
		inv      *nodev1.Inventory
		replaced bool
		want     want
	}{
		{"installed", &nodev1.Inventory{Templates: []*nodev1.TemplateInfo{builtin, tiny}, Platforms: []*nodev1.TemplateInfo{plat}},
			false, want{[]string{"tiny/1"}, []string{"sandbox/3"}, true}},
		{"reclaimed", &nodev1.Inventory{Templates: []*nodev1.TemplateInfo{builtin}},
			false, want{nil, nil, false}},
		{"oversized is ignored", &nodev1.Inventory{Templates: append([]*nodev1.TemplateInfo{tiny}, many...)},
			false, want{[]string{"old/7"}, nil, false}},
		{"bad entries are left out", &nodev1.Inventory{Templates: []*nodev1.TemplateInfo{builtin, tiny,
			{TemplateId: "../etc", Version: "1", Digest: digest},
			{TemplateId: "x", Version: strings.Repeat("9", 129), Digest: digest},
			{TemplateId: "y", Version: "1", Digest: "md5:00"},
			{TemplateId: "-z", Version: "1"},
		}}, false, want{[]string{"tiny/1"}, nil, true}},
		{"replaced stream", &nodev1.Inventory{Templates: []*nodev1.TemplateInfo{tiny}},
			true, want{[]string{"old/7"}, nil, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, st, _ := newTest(t, Config{})
			h := hello("n1", 4096, 4000, "default")
			h.Templates = []*nodev1.TemplateInfo{builtin, {TemplateId: "old", Version: "7", Digest: digest}}
			h.Features = []string{nodewire.FeatureNetwork}
			nc := connectNode(t, r, h)
			if tc.replaced {
				connectNode(t, r, h)
			}
			r.inventory(t.Context(), nc, tc.inv)

			svc := &fleet.Service{Engine: &command.Engine{Store: st}, Store: st, Pages: paging.NewCodec(make([]byte, 32))}
			n, err := svc.Get(t.Context(), "n1")
			if err != nil {
				t.Fatal(err)
			}
			var gotT, gotP []string
			for _, a := range n.GetTemplates() {
				gotT = append(gotT, a.GetArtifactId()+"/"+a.GetVersion())
			}
			for _, a := range n.GetPlatforms() {
				gotP = append(gotP, a.GetArtifactId()+"/"+a.GetVersion())
			}
			if fmt.Sprint(gotT) != fmt.Sprint(tc.want.templates) || fmt.Sprint(gotP) != fmt.Sprint(tc.want.platforms) {
				t.Errorf("GetNode templates %v platforms %v, want %v %v", gotT, gotP, tc.want.templates, tc.want.platforms)
			}
			if n.GetCapacity().GetMemoryMib() != 4096 {
				t.Errorf("GetNode capacity %v: the inventory changed more than the holdings", n.GetCapacity())
			}
			var c *candidate
			for _, cc := range r.connected() {
				if cc.id == "n1" {
					c = &cc
				}
			}
			if c == nil {
				t.Fatal("n1 is not a candidate")
			}
			d := demand{template: "tiny", version: "1", published: true}
			if got := c.holds(d); got != tc.want.tiny {
				t.Errorf("holds(tiny 1) = %v, want %v", got, tc.want.tiny)
			}
			if !c.holds(demand{template: "default"}) {
				t.Error("the built-in default is no longer held")
			}
			if !c.network {
				t.Error("the features were lost")
			}
		})
	}
}

// TestCheckHello: a Hello's holdings follow the Inventory rules before
// anything of it is recorded.
func TestCheckHello(t *testing.T) {
	digest := "sha256:" + strings.Repeat("cd", 32)
	good := &nodev1.TemplateInfo{TemplateId: "tiny", Version: "1", Digest: digest}
	r := New(Config{})
	h := &nodev1.Hello{NodeId: "n", Templates: []*nodev1.TemplateInfo{good, {TemplateId: "../etc", Version: "1"}},
		Platforms: []*nodev1.TemplateInfo{{TemplateId: "sandbox", Version: "2", Digest: "md5:00"}}}
	r.checkHello(h)
	if len(h.GetTemplates()) != 1 || h.GetTemplates()[0].GetTemplateId() != "tiny" || len(h.GetPlatforms()) != 0 {
		t.Fatalf("after checkHello: templates %v, platforms %v", h.GetTemplates(), h.GetPlatforms())
	}
	many := make([]*nodev1.TemplateInfo, nodewire.MaxInventoryEntries+1)
	for i := range many {
		many[i] = good
	}
	h = &nodev1.Hello{NodeId: "n", Templates: many}
	r.checkHello(h)
	if len(h.GetTemplates()) != 0 {
		t.Fatalf("an oversized Hello kept %d templates", len(h.GetTemplates()))
	}
}
