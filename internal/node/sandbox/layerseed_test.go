package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func needMkfs(tb testing.TB) {
	tb.Helper()
	if _, err := findTool("mkfs.ext4"); err != nil {
		tb.Skip(err)
	}
}

// checkLayerImage checks that image is a sparse, clean ext4 image of
// exactly capacity bytes.
func checkLayerImage(t *testing.T, image string, capacity uint64) {
	t.Helper()
	fi, err := os.Stat(image)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(fi.Size()) != capacity {
		t.Fatalf("%s: %d bytes, want %d", image, fi.Size(), capacity)
	}
	if alloc := fi.Sys().(*syscall.Stat_t).Blocks * 512; uint64(alloc) > capacity/8 {
		t.Errorf("%s: %d bytes allocated of %d: not sparse", image, alloc, capacity)
	}
	if fs, err := ext4Size(image); err != nil || fs != capacity {
		t.Fatalf("%s: filesystem size %d, %v; want %d", image, fs, err, capacity)
	}
	if _, err := findTool("e2fsck"); err == nil {
		out, code, err := runTool(context.Background(), "e2fsck", "-f", "-n", image)
		if err != nil {
			t.Fatalf("e2fsck -fn %s (exit %d): %v\n%s", image, code, err, out)
		}
	}
}

func TestCreateLayerFromSeed(t *testing.T) {
	needMkfs(t)
	ctx := context.Background()
	dir := t.TempDir()
	seeds := filepath.Join(dir, seedDirName)
	const capacity = 32 << 20
	for i := 0; i < 2; i++ {
		img := filepath.Join(dir, fmt.Sprintf("ws-%d.img", i))
		seeded, seedErr, err := createLayerImage(ctx, seeds, img, capacity)
		if err != nil || seedErr != nil || !seeded {
			t.Fatalf("create %s: seeded %v, seed error %v, error %v", img, seeded, seedErr, err)
		}
		checkLayerImage(t, img, capacity)
		if _, err := os.Stat(img + ".new"); !os.IsNotExist(err) {
			t.Fatalf("%s.new left behind: %v", img, err)
		}
	}
	checkLayerImage(t, seedPath(seeds, capacity), capacity)

	// A broken seed falls back to mkfs.ext4 and is replaced for the next one.
	if err := os.Truncate(seedPath(seeds, capacity), 4096); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "ws-broken.img")
	seeded, _, err := createLayerImage(ctx, seeds, img, capacity)
	if err != nil {
		t.Fatal(err)
	}
	checkLayerImage(t, img, capacity)
	checkLayerImage(t, seedPath(seeds, capacity), capacity)
	if !seeded {
		t.Log("broken seed: made with mkfs.ext4")
	}

	// An unusable seed directory falls back to mkfs.ext4.
	blocker := filepath.Join(dir, "not-a-dir")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	img = filepath.Join(dir, "ws-fallback.img")
	seeded, seedErr, err := createLayerImage(ctx, blocker, img, capacity)
	if err != nil || seeded || seedErr == nil {
		t.Fatalf("fallback: seeded %v, seed error %v, error %v", seeded, seedErr, err)
	}
	checkLayerImage(t, img, capacity)
}

func TestCreateLayerSeedConcurrent(t *testing.T) {
	needMkfs(t)
	ctx := context.Background()
	dir := t.TempDir()
	seeds := filepath.Join(dir, seedDirName)
	const capacity = 16 << 20
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = createLayerImage(ctx, seeds, filepath.Join(dir, fmt.Sprintf("ws-%d.img", i)), capacity)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		checkLayerImage(t, filepath.Join(dir, fmt.Sprintf("ws-%d.img", i)), capacity)
	}
	ents, err := os.ReadDir(seeds)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "16777216.img" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("seed directory holds %v, want only the seed", names)
	}
}

func TestStaleSeedBuildsRemoved(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, ".16777216.img.1.2.3")
	fresh := filepath.Join(dir, ".16777216.img.1.2.4")
	for _, p := range []string{stale, fresh} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * seedStaleAfter)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	removeStaleSeedBuilds(dir)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale build kept: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh build removed: %v", err)
	}
}

// TestSeedsNotLeaks checks that a started and deleted workspace leaves its
// seed, which Leaks does not report and Cleanup keeps.
func TestSeedsNotLeaks(t *testing.T) {
	r, root := newRuntime(t)
	ctx := context.Background()
	spec := testSpec("ws-seed")
	start(t, r, spec)
	if err := r.Delete(ctx, spec.WorkspaceID); err != nil {
		t.Fatal(err)
	}
	seed := seedPath(filepath.Join(r.root, seedDirName), spec.CapacityBytes)
	if _, err := os.Stat(seed); err != nil {
		t.Fatalf("no seed after a first start: %v", err)
	}
	leaks, err := Leaks(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leaks {
		if strings.Contains(l, seedDirName) {
			t.Errorf("seed reported as a leak: %s", l)
		}
	}
	if err := Cleanup(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(seed); err != nil {
		t.Fatalf("Cleanup removed the seed: %v", err)
	}
}

// BenchmarkCreateLayer measures a first start's writable layer creation
// (made aside, fsync'd, renamed in, directory fsync'd) of a 64 MiB layer:
// mkfs.ext4 of a sparse file, against a clone of the capacity's seed (made
// before the timer starts). Needs mkfs.ext4, not root:
//
//	go test -run '^$' -bench CreateLayer -benchtime 200x ./internal/node/sandbox/
func BenchmarkCreateLayer(b *testing.B) {
	needMkfs(b)
	ctx := context.Background()
	const capacity = 64 << 20
	for _, bc := range []struct {
		name string
		seed bool
	}{{"mkfs", false}, {"seed", true}} {
		b.Run(bc.name, func(b *testing.B) {
			dir := b.TempDir()
			seeds := ""
			if bc.seed {
				seeds = filepath.Join(dir, seedDirName)
				f, err := openSeed(ctx, seeds, capacity)
				if err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				img := filepath.Join(dir, fmt.Sprintf("ws-%d.img", i))
				seeded, seedErr, err := createLayerImage(ctx, seeds, img, capacity)
				if err != nil || seedErr != nil || seeded != bc.seed {
					b.Fatalf("seeded %v, seed error %v, error %v", seeded, seedErr, err)
				}
				b.StopTimer()
				if err := os.Remove(img); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
