package memwatch

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

const (
	none     = nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_NONE
	moderate = nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_MODERATE
	critical = nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_CRITICAL
	unset    = nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_UNSPECIFIED
)

func TestLevel(t *testing.T) {
	const budget = 1000 * mib
	for _, tc := range []struct {
		name   string
		used   uint64
		budget uint64
		psi    uint32
		want   nodev1.MemoryPressureLevel
	}{
		{"idle", 0, budget, 0, none},
		{"just below moderate", 900*mib - 1, budget, 0, none},
		{"moderate at 90 %", 900 * mib, budget, 0, moderate},
		{"just below critical", 950*mib - 1, budget, 0, moderate},
		{"critical at 95 %", 950 * mib, budget, 0, critical},
		{"past the budget", 2 * budget, budget, 0, critical},
		{"PSI below its moderate threshold", 0, budget, PSIModerate - 1, none},
		{"PSI alone is moderate", 0, budget, PSIModerate, moderate},
		{"PSI alone is never critical", 0, budget, 10000, moderate},
		{"PSI critical below 90 % stays moderate", 900*mib - 1, budget, PSICritical, moderate},
		{"PSI critical past 90 % is critical", 900 * mib, budget, PSICritical, critical},
		{"PSI just below critical past 90 %", 900 * mib, budget, PSICritical - 1, moderate},
		{"no budget is not measured", 5 * mib, 0, 0, unset},
		{"huge values do not overflow", 1 << 63, 1<<63 + 1<<59, 0, moderate},
		{"huge values, critical", 1<<64 - 1, 1<<64 - 1, 0, critical},
	} {
		if got := Level(tc.used, tc.budget, tc.psi); got != tc.want {
			t.Errorf("%s: Level(%d, %d, %d) = %v, want %v", tc.name, tc.used, tc.budget, tc.psi, got, tc.want)
		}
	}
}

// fakeCgroup writes the files of a memory cgroup below root.
func fakeCgroup(t *testing.T, dir string, version int, usage, inactive uint64) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	usageFile, stat := "memory.current", fmt.Sprintf("anon 1\nfile 2\ninactive_file %d\nactive_file 3\n", inactive)
	if version == 1 {
		usageFile = "memory.usage_in_bytes"
		// The local inactive_file must not be taken for the hierarchical one.
		stat = fmt.Sprintf("cache 5\ninactive_file 7\ntotal_cache 9\ntotal_inactive_file %d\n", inactive)
	}
	if err := os.WriteFile(filepath.Join(dir, usageFile), fmt.Appendf(nil, "%d\n", usage), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSample(t *testing.T) {
	for _, version := range []int{1, 2} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			root := t.TempDir()
			parent := filepath.Join(root, "kibotos", "0123abcd")
			psi := filepath.Join(root, "pressure")
			if err := os.WriteFile(psi, []byte("some avg10=12.34 avg60=1.00 avg300=0.00 total=99\nfull avg10=50.00 avg60=0.00 avg300=0.00 total=1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			// 1000 MiB used, 50 MiB of it inactive file cache: 950 MiB.
			fakeCgroup(t, parent, version, 1000*mib, 50*mib)
			fakeCgroup(t, filepath.Join(parent, "ws-small"), version, 100*mib, 10*mib)
			fakeCgroup(t, filepath.Join(parent, "ws-big"), version, 800*mib, 40*mib)
			fakeCgroup(t, filepath.Join(parent, "ws-tie"), version, 90*mib, 0)
			fakeCgroup(t, filepath.Join(parent, "ws-cache"), version, 10*mib, 20*mib) // more inactive than usage
			running := []string{"ws-small", "ws-big", "ws-tie", "ws-cache", "ws-gone", "..", "a/b", ""}
			w := New(Config{Cgroup: Cgroup{Dir: parent, Version: version, PSIFile: psi}, BudgetMiB: 1000,
				Workspaces: func() []string { return running }})
			got := w.Sample()
			want := &nodev1.MemoryCondition{
				Level: critical, UsedMib: 950, LimitMib: 1000, PsiSomeAvg10: 1234,
				Workspaces: []*nodev1.WorkspaceMemory{
					{WorkspaceId: "ws-big", UsedMib: 760},
					{WorkspaceId: "ws-small", UsedMib: 90},
					{WorkspaceId: "ws-tie", UsedMib: 90},
				},
			}
			if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
				t.Errorf("Sample() (-want +got):\n%s", d)
			}

			// The budget decides the level.
			w.cfg.BudgetMiB = 1100
			if got := w.Sample(); got.GetLevel() != moderate || got.GetLimitMib() != 1100 {
				t.Errorf("Sample() with a budget of 1100 MiB = %v, want MODERATE (950 MiB is 86 %%, PSI 12.34 %%)", got)
			}
			w.cfg.Cgroup.PSIFile = filepath.Join(root, "no-psi")
			if got := w.Sample(); got.GetLevel() != none || got.GetPsiSomeAvg10() != 0 {
				t.Errorf("Sample() without PSI = %v, want NONE and PSI 0", got)
			}
		})
	}
}

func TestSampleParentGone(t *testing.T) {
	// No workspace runs: the runtime removed the parent.
	w := New(Config{Cgroup: Cgroup{Dir: filepath.Join(t.TempDir(), "missing"), Version: 2}, BudgetMiB: 512,
		Workspaces: func() []string { return nil }})
	want := &nodev1.MemoryCondition{Level: none, LimitMib: 512}
	if d := cmp.Diff(want, w.Sample(), protocmp.Transform()); d != "" {
		t.Errorf("Sample() (-want +got):\n%s", d)
	}
}

func TestSampleUnreadable(t *testing.T) {
	dir := t.TempDir()
	// memory.current is a directory: reading it fails.
	if err := os.Mkdir(filepath.Join(dir, "memory.current"), 0o755); err != nil {
		t.Fatal(err)
	}
	w := New(Config{Cgroup: Cgroup{Dir: dir, Version: 2}, BudgetMiB: 512})
	if got := w.Sample(); got != nil {
		t.Errorf("Sample() of an unreadable cgroup = %v, want nil (not measured)", got)
	}
	// A usage that is not a number.
	dir2 := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir2, "memory.current"), []byte("max\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w = New(Config{Cgroup: Cgroup{Dir: dir2, Version: 2}, BudgetMiB: 512})
	if got := w.Sample(); got != nil {
		t.Errorf("Sample() of a malformed usage = %v, want nil", got)
	}
}

// TestSampleChildrenCount: a parent whose usage is below its children's
// (not hierarchical) counts the children.
func TestSampleChildrenCount(t *testing.T) {
	parent := t.TempDir()
	fakeCgroup(t, parent, 1, 1*mib, 0)
	fakeCgroup(t, filepath.Join(parent, "ws-a"), 1, 300*mib, 0)
	fakeCgroup(t, filepath.Join(parent, "ws-b"), 1, 200*mib, 0)
	w := New(Config{Cgroup: Cgroup{Dir: parent, Version: 1}, BudgetMiB: 1000,
		Workspaces: func() []string { return []string{"ws-a", "ws-b"} }})
	if got := w.Sample().GetUsedMib(); got != 500 {
		t.Errorf("used_mib = %d, want 500 (the children's sum)", got)
	}
}

func TestSampleAtMost256(t *testing.T) {
	parent := t.TempDir()
	fakeCgroup(t, parent, 2, 0, 0)
	var ids []string
	for i := range MaxWorkspaces + 10 {
		id := fmt.Sprintf("ws-%03d", i)
		ids = append(ids, id)
		fakeCgroup(t, filepath.Join(parent, id), 2, uint64(i+1)*mib, 0)
	}
	w := New(Config{Cgroup: Cgroup{Dir: parent, Version: 2}, BudgetMiB: 1 << 20, Workspaces: func() []string { return ids }})
	list := w.Sample().GetWorkspaces()
	if len(list) != MaxWorkspaces {
		t.Fatalf("%d workspaces listed, want %d", len(list), MaxWorkspaces)
	}
	if list[0].GetWorkspaceId() != "ws-265" || list[MaxWorkspaces-1].GetWorkspaceId() != "ws-010" {
		t.Errorf("listed %s .. %s, want the largest: ws-265 .. ws-010", list[0].GetWorkspaceId(), list[MaxWorkspaces-1].GetWorkspaceId())
	}
}

func TestParsePSI(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint32
		ok   bool
	}{
		{"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 0, true},
		{"some avg10=12.34 avg60=1.00 avg300=0.00 total=5\n", 1234, true},
		{"full avg10=99.00 avg60=0 avg300=0 total=0\nsome avg10=7.5 avg60=0 avg300=0 total=0", 750, true},
		{"some avg10=100.00 avg60=0.00 avg300=0.00 total=0", 10000, true},
		{"some avg10=250.00", 10000, true},
		{"some avg10=3", 300, true},
		{"some avg60=1.00", 0, false},
		{"some avg10=", 0, false},
		{"some avg10=.5", 0, false},
		{"some avg10=1.234", 0, false},
		{"some avg10=-1.00", 0, false},
		{"some avg10=1e3", 0, false},
		{"some avg10=99999999999999999999.00", 0, false},
		{"", 0, false},
		{"some", 0, false},
	} {
		got, ok := ParsePSI([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParsePSI(%q) = %d, %v, want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzParsePSI(f *testing.F) {
	f.Add([]byte("some avg10=12.34 avg60=1.00 avg300=0.00 total=5\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, ok := ParsePSI(b)
		if v > 10000 || (!ok && v != 0) {
			t.Fatalf("ParsePSI(%q) = %d, %v", b, v, ok)
		}
	})
}

func TestLocate(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(dir, "runtime.json"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Locate(dir); err == nil {
		t.Error("Locate without runtime.json succeeded")
	}
	for _, bad := range []string{`{}`, `{"cgroup":"/abs"}`, `{"cgroup":"../up"}`, `{"cgroup":"a/../../b"}`, `not json`} {
		write(bad)
		if cg, err := Locate(dir); err == nil {
			t.Errorf("Locate with runtime.json %s = %+v, want an error", bad, cg)
		}
	}
	write(`{"cgroup_parent":"kibotos","cgroup":"kibotos/0123abcd"}`)
	cg, err := Locate(dir)
	if _, v2 := os.Stat("/sys/fs/cgroup/cgroup.controllers"); v2 != nil && err != nil && strings.Contains(err.Error(), "no cgroup") {
		t.Skipf("no memory controller on this machine: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(cg.Dir, "/kibotos/0123abcd") || (cg.Version != 1 && cg.Version != 2) || cg.PSIFile == "" {
		t.Errorf("Locate = %+v", cg)
	}
}
