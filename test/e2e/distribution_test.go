package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var (
	distMiB  = flag.Int("distribution.mib", 0, "TestTemplateDistribution: publish a template of this many MiB of random files (0: skip unless -distribution.file)")
	distFile = flag.String("distribution.file", "", "TestTemplateDistribution: publish this rootfs tarball instead (e.g. scripts/build-template.sh debian --out FILE)")
	distOut  = flag.String("distribution.out", "", "TestTemplateDistribution: append the figures to this file as one JSON line")
)

// TestTemplateDistribution measures template distribution (bench/templates
// runs it): a template published to ctrl, fetched by the second node when
// its first Workspace of that template starts, against `cp` of the same
// bytes on this machine. Skipped unless -distribution.mib or
// -distribution.file is given.
func TestTemplateDistribution(t *testing.T) {
	if *distMiB == 0 && *distFile == "" {
		t.Skip("a measurement: run with -distribution.mib N or -distribution.file FILE (bench/templates)")
	}
	var content []byte
	if *distFile != "" {
		b, err := os.ReadFile(*distFile)
		if err != nil {
			t.Fatal(err)
		}
		content = b
	} else {
		content = randomRootfs(t, *distMiB)
	}
	f := startFleet(t)

	// The reference: cp of the same bytes, from and to this machine's disk,
	// then the same followed by sync (what ctrl's store and the node do).
	dir := t.TempDir()
	src := filepath.Join(dir, "template.tar")
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	cp := func(syncAfter bool, dst string) time.Duration {
		dropCaches()
		start := time.Now()
		if out, err := exec.Command("cp", src, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v\n%s", err, out)
		}
		if syncAfter {
			if out, err := exec.Command("sync", dst).CombinedOutput(); err != nil {
				t.Fatalf("sync: %v\n%s", err, out)
			}
		}
		return time.Since(start)
	}
	cpTime := cp(false, filepath.Join(dir, "copy-1"))
	cpSyncTime := cp(true, filepath.Join(dir, "copy-2"))

	start := time.Now()
	v := f.publish("dist:1", "dist", content)
	publish := time.Since(start)

	// The first Workspace of the template on "second" fetches, verifies
	// and extracts it; the second one finds it cached.
	f.drain("dist-drain-local", "local")
	start = time.Now()
	w1 := f.create("dist-ws-1", "dist", fmt.Sprint(v.GetRevision()))
	first := time.Since(start)
	start = time.Now()
	w2 := f.create("dist-ws-2", "dist", fmt.Sprint(v.GetRevision()))
	cached := time.Since(start)
	if w1.GetPlacement().GetNodeId() != "second" || w2.GetPlacement().GetNodeId() != "second" {
		t.Fatalf("placed on %s and %s, not second", w1.GetPlacement().GetNodeId(), w2.GetPlacement().GetNodeId())
	}
	mib := float64(len(content)) / (1 << 20)
	fig := map[string]any{
		"mib": mib, "cp_s": cpTime.Seconds(), "cp_sync_s": cpSyncTime.Seconds(),
		"publish_s": publish.Seconds(), "publish_mib_s": mib / publish.Seconds(),
		"first_workspace_s": first.Seconds(), "cached_workspace_s": cached.Seconds(),
		"fetch_extract_s": (first - cached).Seconds(), "fetch_extract_mib_s": mib / (first - cached).Seconds(),
	}
	// The node's split of the first one: fetch (and verify) and extract.
	for _, line := range strings.Split(f.secondLog.String(), "\n") {
		var l struct {
			Msg         string `json:"msg"`
			FetchTook   string `json:"fetch_took"`
			ExtractTook string `json:"extract_took"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "template installed" {
			continue
		}
		fetch, err1 := time.ParseDuration(l.FetchTook)
		extract, err2 := time.ParseDuration(l.ExtractTook)
		if err1 == nil && err2 == nil {
			fig["node_fetch_s"], fig["node_fetch_mib_s"] = fetch.Seconds(), mib/fetch.Seconds()
			fig["node_extract_s"], fig["node_extract_mib_s"] = extract.Seconds(), mib/extract.Seconds()
		}
	}
	t.Logf("figures: %v", fig)
	if *distOut != "" {
		b, _ := json.Marshal(fig)
		fh, err := os.OpenFile(*distOut, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		if _, err := fh.Write(append(b, '\n')); err != nil {
			t.Fatal(err)
		}
	}
}

// randomRootfs is tinyRootfs plus mib MiB of incompressible files.
func randomRootfs(t *testing.T, mib int) []byte {
	base := tinyRootfs(t, "dist")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tr := tar.NewReader(bytes.NewReader(base))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "data/", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 8<<20)
	for i := 0; i*8 < mib; i++ {
		n := min(8, mib-i*8) << 20
		_, _ = rand.Read(chunk[:n])
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("data/blob-%03d", i), Mode: 0o644, Size: int64(n)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(chunk[:n]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// dropCaches writes back dirty pages and drops the page cache, so that
// each copy reads from the disk (best effort: needs root).
func dropCaches() {
	_ = exec.Command("sync").Run()
	_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
}
