//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/nettest"
	"github.com/kibotos/kibotos/internal/socks5"
)

// A path is one way from a client to the servers.
type path struct {
	name string
	// transfer moves n bytes up (to a Sink) or down (from a Source) and
	// says how long the bytes took, measured by the client.
	transfer func(ctx context.Context, up bool, n int64) (time.Duration, error)
	// connects makes n connects one after another and returns each one's
	// latency.
	connects func(ctx context.Context, n int) ([]time.Duration, int, error)
	// nodeCPU, for the workspace's paths, is the CPU time kibotos-node has
	// used so far (each transfer's share is reported per GiB moved).
	nodeCPU func() (time.Duration, error)
}

// pathResult is what the run measured on a path.
type pathResult struct {
	Name     string
	Up, Down []float64 // Gbit/s of each run
	// NodeUp, NodeDown: kibotos-node's CPU seconds per GiB moved, each run
	// (workspace paths only).
	NodeUp, NodeDown []float64
	Connect          []time.Duration
	ConnFailed       int
	Errors           []string
}

// servers are the server ports of the run in the server peer: one set
// reached directly, one whose ports the workspace's policy routes through
// the Egress.
type servers struct {
	sink, source, conn    *nettest.TCPServer
	sinkE, sourceE, connE *nettest.TCPServer
	hold                  *nettest.TCPServer // the idle connections
}

// probeTransfer runs netprobe up/down in a client (the workspace or the
// reference namespace) and parses its JSON.
func probeTransfer(out string, n int64) (time.Duration, error) {
	var r struct {
		Bytes   int64
		Seconds float64
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil {
		return 0, fmt.Errorf("netprobe said %q", out)
	}
	if r.Bytes != n {
		return 0, fmt.Errorf("netprobe moved %d bytes of %d", r.Bytes, n)
	}
	return time.Duration(r.Seconds * float64(time.Second)), nil
}

// probeConnects parses netprobe connect's JSON.
func probeConnects(out string) ([]time.Duration, int, error) {
	var r struct {
		Micros []float64
		Failed int
		Error  string
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil {
		return nil, 0, fmt.Errorf("netprobe said %q", out)
	}
	ds := make([]time.Duration, len(r.Micros))
	for i, us := range r.Micros {
		ds[i] = time.Duration(us * float64(time.Microsecond))
	}
	if r.Failed > 0 && len(ds) == 0 {
		return nil, r.Failed, fmt.Errorf("every connect failed: %s", r.Error)
	}
	return ds, r.Failed, nil
}

// workspacePath is netprobe inside the workspace to sink/source/conn;
// nodePID is kibotos-node's.
func workspacePath(name string, w *workspace, nodePID int, sink, source, conn netip.AddrPort) path {
	return path{
		name:    name,
		nodeCPU: func() (time.Duration, error) { return procCPU(nodePID) },
		transfer: func(ctx context.Context, up bool, n int64) (time.Duration, error) {
			dir, to := "down", source
			if up {
				dir, to = "up", sink
			}
			out, err := w.run(ctx, 10*time.Minute, "/tmp/netprobe", dir, to.String(), strconv.FormatInt(n, 10))
			if err != nil {
				return 0, err
			}
			return probeTransfer(out, n)
		},
		connects: func(ctx context.Context, n int) ([]time.Duration, int, error) {
			out, err := w.run(ctx, 10*time.Minute, "/tmp/netprobe", "connect", conn.String(), strconv.Itoa(n))
			if err != nil {
				return nil, 0, err
			}
			return probeConnects(out)
		},
	}
}

// peerPath is netprobe run inside a nettest peer (the kernel reference).
func peerPath(name string, p *nettest.Peer, probe string, sink, source, conn netip.AddrPort) path {
	run := func(ctx context.Context, args ...string) (string, error) {
		pr, err := p.Start(probe, args...)
		if err != nil {
			return "", err
		}
		select {
		case <-pr.Exited:
		case <-ctx.Done():
			pr.Stop()
			return "", ctx.Err()
		}
		if !pr.Cmd.ProcessState.Success() {
			return "", fmt.Errorf("netprobe %v: %v: %s", args, pr.Cmd.ProcessState, pr.Output())
		}
		return pr.Output(), nil
	}
	return path{
		name: name,
		transfer: func(ctx context.Context, up bool, n int64) (time.Duration, error) {
			dir, to := "down", source
			if up {
				dir, to = "up", sink
			}
			out, err := run(ctx, dir, to.String(), strconv.FormatInt(n, 10))
			if err != nil {
				return 0, err
			}
			return probeTransfer(out, n)
		},
		connects: func(ctx context.Context, n int) ([]time.Duration, int, error) {
			out, err := run(ctx, "connect", conn.String(), strconv.Itoa(n))
			if err != nil {
				return nil, 0, err
			}
			return probeConnects(out)
		},
	}
}

// hostPath is a client in this process on the host, dialing with dial
// (directly, or through the Dante with SOCKS5 CONNECT).
func hostPath(name string, dial func(ctx context.Context, dst netip.AddrPort) (net.Conn, error), sink, source, conn netip.AddrPort) path {
	return path{
		name: name,
		transfer: func(ctx context.Context, up bool, n int64) (time.Duration, error) {
			to := source
			if up {
				to = sink
			}
			c, err := dial(ctx, to)
			if err != nil {
				return 0, err
			}
			defer c.Close()
			t0 := time.Now()
			if up {
				buf := make([]byte, 256<<10)
				for left := n; left > 0; {
					k, err := c.Write(buf[:min(int64(len(buf)), left)])
					if err != nil {
						return 0, err
					}
					left -= int64(k)
				}
				c.(interface{ CloseWrite() error }).CloseWrite()
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return 0, fmt.Errorf("the sink's count: %w", err)
				}
				if got, _ := strconv.ParseInt(strings.TrimSpace(line), 10, 64); got != n {
					return 0, fmt.Errorf("the sink got %d bytes of %d", got, n)
				}
			} else {
				fmt.Fprintf(c, "%d\n", n)
				got, err := io.CopyBuffer(io.Discard, c, make([]byte, 256<<10))
				if err != nil || got != n {
					return 0, fmt.Errorf("read %d of %d: %v", got, n, err)
				}
			}
			return time.Since(t0), nil
		},
		connects: func(ctx context.Context, n int) ([]time.Duration, int, error) {
			var ds []time.Duration
			failed := 0
			for range n {
				t0 := time.Now()
				c, err := dial(ctx, conn)
				d := time.Since(t0)
				if err != nil {
					failed++
					continue
				}
				ds = append(ds, d)
				c.Close()
			}
			return ds, failed, nil
		},
	}
}

// dialDirect dials dst from the host.
func dialDirect(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", dst.String())
}

// dialVia dials dst through the Dante with SOCKS5 CONNECT.
func dialVia(d *nettest.Dante) func(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	cl := &socks5.Client{Username: d.User, Password: d.Password}
	return func(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
		var nd net.Dialer
		c, err := nd.DialContext(ctx, "tcp", d.Addr.String())
		if err != nil {
			return nil, err
		}
		if _, err := cl.Connect(ctx, c, socks5.AddrFromAddrPort(dst)); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// measurePaths runs the transfers (both directions, repeats times,
// interleaved over the paths) and the connects on every path.
func measurePaths(ctx context.Context, paths []path, bytes int64, repeats, connects int) []*pathResult {
	res := make([]*pathResult, len(paths))
	for i, p := range paths {
		res[i] = &pathResult{Name: p.name}
	}
	for r := range repeats {
		for _, up := range []bool{true, false} {
			for i, p := range paths {
				var cpu0 time.Duration
				var cpuErr error
				if p.nodeCPU != nil {
					cpu0, cpuErr = p.nodeCPU()
				}
				d, err := p.transfer(ctx, up, bytes)
				dir := "down"
				if up {
					dir = "up"
				}
				if err != nil {
					res[i].Errors = append(res[i].Errors, fmt.Sprintf("%s #%d: %v", dir, r+1, err))
					logf("  %s %s #%d: %v", p.name, dir, r+1, err)
					continue
				}
				g := float64(bytes) * 8 / d.Seconds() / 1e9
				cpu := math.NaN()
				if p.nodeCPU != nil && cpuErr == nil {
					if cpu1, err := p.nodeCPU(); err == nil {
						cpu = (cpu1 - cpu0).Seconds() / (float64(bytes) / (1 << 30))
					}
				}
				if math.IsNaN(cpu) {
					logf("  %s %s #%d: %.2f Gbit/s", p.name, dir, r+1, g)
				} else {
					logf("  %s %s #%d: %.2f Gbit/s, node CPU %.2f s/GiB", p.name, dir, r+1, g, cpu)
				}
				if up {
					res[i].Up = append(res[i].Up, g)
				} else {
					res[i].Down = append(res[i].Down, g)
				}
				if !math.IsNaN(cpu) && up {
					res[i].NodeUp = append(res[i].NodeUp, cpu)
				} else if !math.IsNaN(cpu) {
					res[i].NodeDown = append(res[i].NodeDown, cpu)
				}
			}
		}
	}
	for i, p := range paths {
		ds, failed, err := p.connects(ctx, connects)
		if err != nil {
			res[i].Errors = append(res[i].Errors, "connects: "+err.Error())
		}
		res[i].Connect, res[i].ConnFailed = ds, failed
		logf("  %s: %d connects, p50 %.3f ms", p.name, len(ds), newDist(ds).p(50))
	}
	return res
}

// idleResult is the idle-connections measurement.
type idleResult struct {
	Want, Opened, Failed, ServerOpen int
	FirstErr                         string
	RSSBefore, RSSWith, RSSAfter     int64 // the node's VmRSS
	AnonBefore, AnonWith             int64 // its RssAnon
	ThreadsBefore, ThreadsWith       int64
	Err                              string
}

// measureIdle opens n connections from the workspace to the hold server
// at once, holds them and reads the node's memory before, with and after
// them.
func measureIdle(ctx context.Context, w *workspace, hold *nettest.TCPServer, nodePID, n int, settle time.Duration) *idleResult {
	r := &idleResult{Want: n}
	sleep(ctx, settle)
	before := procStatus(nodePID)
	r.RSSBefore, r.AnonBefore, r.ThreadsBefore = before["VmRSS"], before["RssAnon"], before["Threads"]
	holdFor := 10*time.Second + 2*settle + time.Duration(n/500)*time.Second
	p, err := w.start(ctx, "/tmp/netprobe", "idle", hold.Addr.String(), strconv.Itoa(n), strconv.Itoa(int(holdFor.Seconds())))
	if err != nil {
		r.Err = err.Error()
		return r
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := p.waitFor(wctx, "\n"); err != nil {
		r.Err = err.Error()
		return r
	}
	f := strings.Fields(strings.SplitN(p.output(), "\n", 2)[0])
	if len(f) >= 3 && f[0] == "open" {
		r.Opened, _ = strconv.Atoi(f[1])
		r.Failed, _ = strconv.Atoi(f[2])
		r.FirstErr = strings.Join(f[3:], " ")
	}
	sleep(ctx, settle)
	with := procStatus(nodePID)
	r.RSSWith, r.AnonWith, r.ThreadsWith = with["VmRSS"], with["RssAnon"], with["Threads"]
	r.ServerOpen = hold.Open()
	if _, err := p.wait(wctx); err != nil {
		r.Err = err.Error()
	}
	sleep(ctx, settle)
	r.RSSAfter = procStatus(nodePID)["VmRSS"]
	return r
}

// followResult is the policy-update measurement.
type followResult struct {
	Toggles  int
	Lag      []time.Duration // call sent → the first new flow with the new outcome
	Call     []time.Duration // the call's round trip
	Missed   int             // toggles whose flip the watcher did not see
	Err      string
	WatchOut int // lines the watcher printed
}

// measureFollow toggles a deny of target n times while netprobe watch
// connects to it every millisecond from the workspace, and takes, per
// toggle, the time from sending UpdateWorkspaceNetworkPolicy to the first
// connect attempt that got the new outcome.
func measureFollow(ctx context.Context, a *api, w *workspace, base *ctrlv1.NetworkPolicy, target netip.AddrPort, n int) *followResult {
	r := &followResult{Toggles: n}
	deny := cloneWithDeny(base, target)
	secs := 5*n + 60 // ended with SIGTERM once the updates are done
	p, err := w.start(ctx, "/tmp/netprobe", "watch", target.String(), strconv.Itoa(secs))
	if err != nil {
		r.Err = err.Error()
		return r
	}
	wctx, cancel := context.WithTimeout(ctx, time.Duration(secs+60)*time.Second)
	defer cancel()
	if err := p.waitFor(wctx, " ok\n"); err != nil {
		r.Err = err.Error()
		return r
	}
	type toggle struct {
		at   time.Time
		want string
	}
	var ts []toggle
	for i := range n {
		pol, want := deny, "refused"
		if i%2 == 1 {
			pol, want = base, "ok"
		}
		t0 := time.Now()
		if _, err := a.setPolicy(ctx, w.id, pol); err != nil {
			r.Err = err.Error()
			break
		}
		r.Call = append(r.Call, time.Since(t0))
		ts = append(ts, toggle{t0, want})
		sleep(ctx, 150*time.Millisecond+rand.N(100*time.Millisecond))
	}
	// Leave the target admitted, and end the watcher.
	if len(ts)%2 == 1 {
		a.setPolicy(ctx, w.id, base)
	}
	sleep(ctx, 200*time.Millisecond)
	if err := p.signal(ctx, syscall.SIGTERM); err != nil && r.Err == "" {
		r.Err = "SIGTERM to watch: " + err.Error()
	}
	out, err := p.wait(wctx)
	if err != nil && r.Err == "" {
		r.Err = "watch: " + err.Error()
	}
	type change struct {
		at    time.Time
		class string
	}
	var cs []change
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		cs = append(cs, change{time.Unix(0, ns), f[1]})
	}
	r.WatchOut = len(cs)
	for i, t := range ts {
		end := time.Now().Add(time.Hour)
		if i+1 < len(ts) {
			end = ts[i+1].at
		}
		found := false
		for _, c := range cs {
			if !c.at.Before(t.at) && c.at.Before(end) && c.class == t.want {
				r.Lag = append(r.Lag, c.at.Sub(t.at))
				found = true
				break
			}
		}
		if !found {
			r.Missed++
		}
	}
	return r
}

// cloneWithDeny is p with a deny of target added.
func cloneWithDeny(p *ctrlv1.NetworkPolicy, target netip.AddrPort) *ctrlv1.NetworkPolicy {
	q := &ctrlv1.NetworkPolicy{Mode: p.GetMode(), Allow: p.GetAllow(), Egresses: p.GetEgresses(), Dns: p.GetDns()}
	q.Deny = append(append([]*ctrlv1.Destination(nil), p.GetDeny()...), &ctrlv1.Destination{
		Cidr: netip.PrefixFrom(target.Addr(), 32).String(), PortMin: uint32(target.Port()), PortMax: uint32(target.Port())})
	return q
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
