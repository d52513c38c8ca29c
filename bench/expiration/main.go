// Command expiration runs the long soak of the expiration engine and writes
// its figures: test/e2e's TestExpirationSoak with 10,000 STOP deadlines on
// workspaces of the runtime double (internal/node/agent/agenttest) plus 20
// on real sandboxes, spread over 10 minutes across 20 SIGKILL-and-restarts
// of kibotos-ctrl --dev (SQLite); ctrl's CPU while idle with 10 and with
// 10,000 deadlines armed an hour ahead; then TestExpirationSoakReplicas,
// the two-replica variant on PostgreSQL with the runtime double.
//
// Counted: deadlines fired early (the command's creation before the
// deadline), missed (no command), fired twice (a second command, or two
// engines logging the firing); lateness from the later of the deadline and
// ctrl being ready again (its "serving" line after a restart), p50/p99/max.
//
// It needs root for the real sandboxes (without root: -real 0) and
// KIBOTOS_TEST_POSTGRES_URL for the replicas (skipped without it).
//
//	go run ./bench/expiration [-fake 10000] [-real 20] [-window 10m] [-restarts 20] [-idle 60s] [-out FILE]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	fake := flag.Int("fake", 10000, "deadlines on workspaces of the runtime double")
	real := flag.Int("real", 20, "deadlines on real sandboxes (root)")
	window := flag.Duration("window", 10*time.Minute, "the deadlines are spread over this window")
	restarts := flag.Int("restarts", 20, "ctrl SIGKILL-and-restarts during the window")
	idle := flag.Duration("idle", time.Minute, "how long to measure ctrl's idle CPU with 10 and with every deadline armed")
	out := flag.String("out", filepath.Join("bench", "results", time.Now().Format("2006-01-02")+"-expiration.md"), "the markdown report")
	flag.Parse()
	if err := run(*fake, *real, *window, *restarts, *idle, *out); err != nil {
		fmt.Fprintln(os.Stderr, "expiration:", err)
		os.Exit(1)
	}
}

func run(fake, real int, window time.Duration, restarts int, idle time.Duration, out string) error {
	figures, err := os.CreateTemp("", "expiration-*.json")
	if err != nil {
		return err
	}
	figures.Close()
	defer os.Remove(figures.Name())
	args := []string{"test", "./test/e2e", "-run", "^(TestExpirationSoak|TestExpirationSoakReplicas)$", "-count=1", "-v",
		"-timeout", (window*3 + 2*time.Hour).String(), "-args",
		fmt.Sprintf("-expiration.fake=%d", fake), fmt.Sprintf("-expiration.real=%d", real),
		"-expiration.window=" + window.String(), fmt.Sprintf("-expiration.restarts=%d", restarts),
		"-expiration.idle=" + idle.String(), "-expiration.out=" + figures.Name()}
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
	fmt.Fprintf(&b, "# Expiration soak, %s\n\n", started.Format("2006-01-02 15:04"))
	fmt.Fprintf(&b, "`go run ./bench/expiration -fake %d -real %d -window %v -restarts %d -idle %v` (%s, test outcome: %v).\n\n",
		fake, real, window, restarts, idle, time.Since(started).Round(time.Second), outcome(testErr))
	b.WriteString("| store | replicas | deadlines (real) | window | restarts | early | missed | twice | lateness p50 | p99 | max | idle CPU, 10 armed | idle CPU, all armed |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return err
		}
		idleCol := func(k string) string {
			if v, ok := r[k].(float64); ok {
				return fmt.Sprintf("%.2f %% of a core", v)
			}
			return "—"
		}
		fmt.Fprintf(&b, "| %v | %v | %v (%v) | %vs | %v | %v | %v | %v | %.1f ms | %.1f ms | %.1f ms | %s | %s |\n",
			r["store"], r["replicas"], r["deadlines"], r["real_sandboxes"], r["window_s"], r["restarts"],
			r["fired_early"], r["missed"], r["fired_twice"], r["lateness_p50_ms"], r["lateness_p99_ms"], r["lateness_max_ms"],
			idleCol("idle_cpu_pct_10_armed"), idleCol("idle_cpu_pct_all_armed"))
	}
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Print(b.String())
	return testErr
}

func outcome(err error) string {
	if err == nil {
		return "pass"
	}
	return "FAIL: " + err.Error()
}
