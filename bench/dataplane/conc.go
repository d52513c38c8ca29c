//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// memSample is the resident memory of kibotos-ctrl (with its embedded
// node) and of the guests (the PID 1 of each workspace), in KiB.
type memSample struct {
	Ctrl, Guests uint64
	GuestsFound  int
}

// concResult is measurement 5.
type concResult struct {
	Workspaces, Streams int
	BytesEach           int64
	Completed           int
	Wall                time.Duration
	Latencies           []time.Duration
	Output, Dropped     int64
	Before, Peak, After memSample
	Samples             int
	CPU                 cpuUse // during the streams: this client, kibotos-ctrl, the machine
	Errors              []string
}

// concPhase runs cfg.concStreams exec streams at once over cfg.concWS new
// workspaces (stream i in workspace i mod concWS), each `sh -c 'head -c N
// /dev/zero; echo done'` read to its exited event, while the resident memory
// of kibotos-ctrl and of the workspaces' guests is sampled from /proc.
func (b *bench) concPhase(ctx context.Context) error {
	cfg := b.cfg
	r := &concResult{Workspaces: cfg.concWS, Streams: cfg.concStreams, BytesEach: cfg.concBytes}
	b.conc = r
	logf("concurrency: %d workspaces, %d streams of %d MiB at once", cfg.concWS, cfg.concStreams, cfg.concBytes>>20)
	ids := make([]string, cfg.concWS)
	toks := make([]string, cfg.concWS)
	for i := range ids {
		c, err := b.api.create(ctx)
		if err != nil {
			return err
		}
		ids[i] = c.ID
		if err := b.api.checkAvailable(ctx, c.ID); err != nil {
			return err
		}
		if toks[i], err = b.api.session(ctx, c.ID); err != nil {
			return err
		}
		// One command each, so every guest and the node's connection to it
		// are warm before the baseline.
		if _, _, err := b.api.run(ctx, toks[i], c.ID, "true"); err != nil {
			return err
		}
	}
	defer func() {
		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		for _, id := range ids {
			wg.Go(func() {
				if err := b.api.deleteWorkspace(context.WithoutCancel(ctx), id); err != nil {
					mu.Lock()
					b.notes = append(b.notes, err.Error())
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}()
	base, err := cgroupBase(filepath.Join(b.dataDir, "node"))
	if err != nil {
		return err
	}
	guests := func() []int { return guestPIDs(base, ids) }
	if g := guests(); len(g) != len(ids) {
		return fmt.Errorf("found %d guest PID 1s for %d workspaces (cgroup base %s)", len(g), len(ids), base)
	}
	pid := b.srv.PID()
	time.Sleep(2 * time.Second)
	r.Before = readMem(pid, guests())

	// Sample until the streams are done.
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		g := guests()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			m := readMem(pid, g)
			r.Samples++
			r.Peak.Ctrl = max(r.Peak.Ctrl, m.Ctrl)
			if m.Guests > r.Peak.Guests {
				r.Peak.Guests, r.Peak.GuestsFound = m.Guests, m.GuestsFound
			}
		}
	}()

	script := fmt.Sprintf("head -c %d /dev/zero; echo done", cfg.concBytes)
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		rel = make(chan struct{})
	)
	for i := range cfg.concStreams {
		w := i % cfg.concWS
		wg.Go(func() {
			<-rel
			t0, o, err := b.api.run(ctx, toks[w], ids[w], "sh", "-c", script)
			mu.Lock()
			defer mu.Unlock()
			r.Output += o.Output
			r.Dropped += o.Dropped
			switch {
			case err != nil:
				r.Errors = append(r.Errors, err.Error())
			case o.Exit.GetExitCode() != 0 || !bytes.HasSuffix(o.Tail, []byte("done\n")):
				r.Errors = append(r.Errors, fmt.Sprintf("stream %d: exit %d, output ends %q", i, o.Exit.GetExitCode(), o.Tail))
			default:
				r.Completed++
				r.Latencies = append(r.Latencies, o.Exited.Sub(t0))
			}
		})
	}
	probe := cpuProbe{ctrlPID: pid}
	m := probe.mark()
	t0 := time.Now()
	close(rel)
	wg.Wait()
	r.Wall = time.Since(t0)
	r.CPU = probe.since(m)
	close(stop)
	<-sampled
	time.Sleep(2 * time.Second)
	r.After = readMem(pid, guests())
	logf("concurrency: %d/%d completed in %.2f s; ctrl RSS %d → %d (peak) → %d KiB; guests %d → %d → %d KiB",
		r.Completed, r.Streams, r.Wall.Seconds(), r.Before.Ctrl, r.Peak.Ctrl, r.After.Ctrl, r.Before.Guests, r.Peak.Guests, r.After.Guests)
	return nil
}

// cgroupBase reads the cgroup base the node's runtime recorded in its state
// directory (runtime.json).
func cgroupBase(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "runtime.json"))
	if err != nil {
		return "", err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	base, _ := m["cgroup"].(string)
	if base == "" {
		return "", fmt.Errorf("no cgroup in %s/runtime.json", root)
	}
	return strings.Trim(base, "/"), nil
}

// guestPIDs returns the PID 1 (a live process whose innermost NSpid is 1)
// of every execution of the given workspaces: their cgroups are
// BASE/WORKSPACE_ID[/...]. The guest runs from a memfd, so its name is not
// matched.
func guestPIDs(base string, ids []string) []int {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	prefix := "/" + base + "/"
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile("/proc/" + e.Name() + "/cgroup")
		if err != nil {
			continue
		}
		mine := false
		for _, l := range strings.Split(string(cg), "\n") {
			parts := strings.SplitN(l, ":", 3)
			if len(parts) != 3 {
				continue
			}
			if rest, ok := strings.CutPrefix(parts[2], prefix); ok {
				ws, _, _ := strings.Cut(rest, "/")
				if want[ws] {
					mine = true
					break
				}
			}
		}
		if !mine {
			continue
		}
		st := procStatus(pid)
		ns := strings.Fields(st["NSpid"])
		state := strings.Fields(st["State"])
		if len(ns) >= 2 && ns[len(ns)-1] == "1" && len(state) > 0 && state[0] != "Z" && state[0] != "X" {
			out = append(out, pid)
		}
	}
	return out
}

// readMem reads VmRSS of ctrl and of the guests.
func readMem(ctrlPID int, guests []int) memSample {
	m := memSample{Ctrl: vmRSS(ctrlPID)}
	for _, g := range guests {
		if v := vmRSS(g); v > 0 {
			m.Guests += v
			m.GuestsFound++
		}
	}
	return m
}

func vmRSS(pid int) uint64 {
	v := procStatus(pid)["VmRSS"]
	n, _ := strconv.ParseUint(strings.TrimSuffix(v, " kB"), 10, 64)
	return n
}

// procStatus returns the fields of /proc/PID/status, values trimmed.
func procStatus(pid int) map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return out
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// procCPU returns the CPU time of pid and of its waited-for children
// (utime, stime, cutime, cstime of /proc/PID/stat).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0
	}
	var ticks int64
	for _, v := range f[11:15] { // fields 14-17 of the whole line
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// cgroupThrottled returns the time the CPU quota of cgroup rel throttled
// it (cgroup v2 cpu.stat throttled_usec, v1 cpu.stat throttled_time).
func cgroupThrottled(rel string) time.Duration {
	for _, c := range []struct {
		path, key string
		unit      time.Duration
	}{
		{filepath.Join("/sys/fs/cgroup", rel, "cpu.stat"), "throttled_usec", time.Microsecond},
		{filepath.Join("/sys/fs/cgroup/cpu", rel, "cpu.stat"), "throttled_time", time.Nanosecond},
	} {
		b, err := os.ReadFile(c.path)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, c.key+" "); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return time.Duration(n) * c.unit
			}
		}
	}
	return 0
}
