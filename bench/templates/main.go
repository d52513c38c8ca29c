// Command templates measures template distribution and writes its figures:
// test/e2e's TestTemplateDistribution, which publishes a template of -mib
// MiB of incompressible files (or the rootfs tarball -file) to
// kibotos-ctrl --dev through the ArtifactService, in 4 MiB pieces, and
// starts the first Workspace of it on a second kibotos-node, which fetches,
// verifies and extracts it, then a second Workspace (the template cached).
// The reference is `cp` of the same bytes on this machine, from a cold page
// cache, without and with `sync`.
//
// Reported per run: publish (time and MiB/s), the first Workspace on the
// second node, fetch+extract (the first Workspace less the cached one) and
// the node's own split of it (fetch and verify, extract, from its
// "template installed" log line), the cached Workspace; each time also as a
// multiple of cp and of cp+sync.
//
// It needs root (the second node runs real sandboxes).
//
//	go run ./bench/templates [-mib 200] [-file ROOTFS.tar] [-runs 1] [-out FILE]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

func main() {
	mib := flag.Int("mib", 200, "publish a template of this many MiB of random files")
	file := flag.String("file", "", "publish this rootfs tarball instead of -mib (e.g. scripts/build-template.sh debian --out FILE)")
	runs := flag.Int("runs", 1, "runs of the test, each with a new ctrl, node and template")
	out := flag.String("out", filepath.Join("bench", "results", time.Now().UTC().Format("2006-01-02")+"-templates.md"), "the markdown report (empty: stdout only)")
	flag.Parse()
	if err := run(*mib, *file, *runs, *out); err != nil {
		fmt.Fprintln(os.Stderr, "templates:", err)
		os.Exit(1)
	}
}

func run(mib int, file string, runs int, out string) error {
	figures, err := os.CreateTemp("", "templates-*.json")
	if err != nil {
		return err
	}
	figures.Close()
	defer os.Remove(figures.Name())
	var extra []string
	if file != "" {
		abs, err := filepath.Abs(file)
		if err != nil {
			return err
		}
		extra = append(extra, "-distribution.file="+abs)
	} else {
		extra = append(extra, fmt.Sprintf("-distribution.mib=%d", mib))
	}
	args := append([]string{"test", "./test/e2e", "-run", "^TestTemplateDistribution$", fmt.Sprintf("-count=%d", runs), "-v",
		"-timeout", "30m", "-args", "-distribution.out=" + figures.Name()}, extra...)
	load := loadAvg()
	cmd := exec.Command("go", args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	started := time.Now()
	testErr := cmd.Run()
	f, err := os.Open(figures.Name())
	if err != nil {
		return err
	}
	defer f.Close()

	var b strings.Builder
	fmt.Fprintf(&b, "# Template distribution, %s\n\n", started.UTC().Format("2006-01-02 15:04 UTC"))
	what := fmt.Sprintf("-mib %d", mib)
	if file != "" {
		what = "-file " + filepath.Base(file)
	}
	fmt.Fprintf(&b, "`go run ./bench/templates %s -runs %d` (`go %s`; %s, test outcome: %v), at %s, on %d cores (load average %s at the start).\n\n",
		what, runs, strings.Join(args, " "), time.Since(started).Round(time.Second), outcome(testErr), revision(), runtime.NumCPU(), load)
	b.WriteString("| MiB | cp | cp+sync | publish | first Workspace | fetch+extract | node: fetch+verify | node: extract | cached Workspace |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	var rows []map[string]float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		r := map[string]float64{}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return err
		}
		rows = append(rows, r)
		cp, cps, m := r["cp_s"], r["cp_sync_s"], r["mib"]
		col := func(k string) string {
			s, ok := r[k]
			if !ok || s <= 0 {
				return "—"
			}
			return fmt.Sprintf("%.2f s, %.0f MiB/s (%.1f× cp, %.1f× cp+sync)", s, m/s, s/cp, s/cps)
		}
		fmt.Fprintf(&b, "| %.1f | %.2f s (%.0f MiB/s) | %.2f s (%.0f MiB/s) | %s | %s | %s | %s | %s | %.3f s |\n",
			m, cp, m/cp, cps, m/cps, col("publish_s"), col("first_workspace_s"), col("fetch_extract_s"),
			col("node_fetch_s"), col("node_extract_s"), r["cached_workspace_s"])
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(rows) == 0 {
		b.WriteString("\nNo figures: the test wrote none (see its output).\n")
	}
	b.WriteString("\nfetch+extract is the first Workspace less the cached one (what the fetch, the digest's check and the extraction add); " +
		"the node's split is from its \"template installed\" log line. A multiple of cp is the time over cp's time.\n")
	fmt.Print(b.String())
	if out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return testErr
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func revision() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "the working tree"
	}
	return "the working tree at " + strings.TrimSpace(string(out))
}

func outcome(err error) string {
	if err == nil {
		return "pass"
	}
	return "FAIL: " + err.Error()
}
