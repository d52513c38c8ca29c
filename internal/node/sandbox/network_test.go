package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/guest"
	"github.com/kibotos/kibotos/internal/node/netattach"
	"github.com/kibotos/kibotos/internal/node/netstack"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// linkOpts is every test workspace's link (the addressing of
// internal/node/network).
var linkOpts = netattach.Options{
	Address: netip.MustParsePrefix("169.254.77.2/30"),
	Gateway: netip.MustParseAddr("169.254.77.1"),
	MTU:     netstack.DefaultMTU,
}

// testNetworks is a Networking whose Networks send every connection to
// one server of the test (no policy: the runtime's part is under test, not
// the policy's), and count themselves.
type testNetworks struct {
	target string
	open   atomic.Int32
}

// testNet is one test Network.
type testNet struct {
	nets   *testNetworks
	st     *netstack.Stack
	mu     sync.Mutex
	rev    uint64
	closed bool
}

func (n *testNetworks) networking() *Networking {
	return &Networking{Link: linkOpts, New: n.new}
}

func (n *testNetworks) new(_ string, ep stack.LinkEndpoint, nc *nodev1.NetworkConfig) (Network, error) {
	st, err := netstack.New(netstack.Config{Link: ep, Address: linkOpts.Address, Gateway: linkOpts.Gateway, MTU: linkOpts.MTU,
		Decide: func(context.Context, netip.AddrPort) (netstack.Decision, error) {
			return netstack.Decision{Path: "direct", Dial: func(ctx context.Context) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", n.target)
			}}, nil
		}})
	if err != nil {
		return nil, err
	}
	n.open.Add(1)
	return &testNet{nets: n, st: st, rev: nc.GetPolicy().GetRevision()}, nil
}

func (t *testNet) Apply(nc *nodev1.NetworkConfig) error {
	if nc.GetPolicy().GetRevision() == 999 {
		return errors.New("revision 999 is refused")
	}
	t.mu.Lock()
	t.rev = nc.GetPolicy().GetRevision()
	t.mu.Unlock()
	return nil
}

func (t *testNet) Status() *nodev1.NetworkStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	return &nodev1.NetworkStatus{AppliedRevision: t.rev}
}

func (t *testNet) CloseEgress(string) int { return 0 }

func (t *testNet) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	t.nets.open.Add(-1)
	return t.st.Close()
}

func netConfig(mode ctrlv1.NetworkMode, rev uint64) *nodev1.NetworkConfig {
	return &nodev1.NetworkConfig{Policy: &ctrlv1.NetworkPolicy{Mode: mode, Revision: rev}}
}

const (
	public = ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET
	none   = ctrlv1.NetworkMode_NETWORK_MODE_NONE
)

// httpServer serves "hello from the host" on loopback.
func httpServer(tb testing.TB) string {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello from the host\n")
	}))
	tb.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// links lists the workspace's interfaces.
func links(t *testing.T, r *Runtime, ws string) string {
	t.Helper()
	out, code := run(t, r, ws, "ip", "-o", "link")
	if code != 0 {
		t.Fatalf("ip -o link: exit %d: %s", code, out)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			names = append(names, strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":"))
		}
	}
	return strings.Join(names, " ")
}

// fetch is wget of a destination behind the workspace's network.
func fetch(t *testing.T, r *Runtime, ws string) (string, int) {
	t.Helper()
	// (busybox 1.35's wget -T crashes: timeout instead)
	return run(t, r, ws, "timeout", "10", "wget", "-q", "-O", "-", "http://198.51.100.7/")
}

func wantNetStatus(t *testing.T, r *Runtime, ws string, rev uint64, dns uint32) {
	t.Helper()
	st, ok := r.Status(ws)
	if !ok || st.Network == nil || st.Network.GetAppliedRevision() != rev || st.Network.GetDnsConfigVersion() != dns {
		t.Fatalf("status of %s: %+v, want applied revision %d, DNS configuration %d", ws, st.Network, rev, dns)
	}
}

// TestNetworkModes: an execution started in mode PUBLIC_INTERNET has eth0
// configured before its guest answers and reaches the network through it;
// NONE has lo only. Switching a running execution NONE → PUBLIC_INTERNET →
// NONE adds and removes eth0 (an open connection ends); a failed Apply keeps
// the previous configuration. /etc/resolv.conf names the node's DNS server,
// and the DNS configuration version is reported. Stop and Delete leave no
// network, TAP or goroutine.
func TestNetworkModes(t *testing.T) {
	nets := &testNetworks{target: httpServer(t)}
	r, root := newRuntime(t, func(c *Config) { c.Network = nets.networking() })
	ctx := context.Background()
	before := runtime.NumGoroutine()

	s := testSpec("ws-net-public")
	s.Network = netConfig(public, 3)
	start(t, r, s)
	wantNetStatus(t, r, s.WorkspaceID, 3, nodewire.DNSConfigVersion)
	if got := links(t, r, s.WorkspaceID); got != "lo eth0" {
		t.Errorf("interfaces in PUBLIC_INTERNET: %q", got)
	}
	if out, code := fetch(t, r, s.WorkspaceID); code != 0 || out != "hello from the host\n" {
		t.Errorf("wget through the network: exit %d: %q", code, out)
	}
	if got := sh(t, r, s.WorkspaceID, "cat /etc/resolv.conf"); got != guest.ResolvConf {
		t.Errorf("/etc/resolv.conf: %q", got)
	}
	if got := sh(t, r, s.WorkspaceID, "ip -o -4 addr show dev eth0 | awk '{print $4}'; ip route"); !strings.Contains(got, "169.254.77.2/30") || !strings.Contains(got, "default via 169.254.77.1") {
		t.Errorf("eth0's configuration: %q", got)
	}

	n := testSpec("ws-net-none")
	n.Network = netConfig(none, 1)
	start(t, r, n)
	wantNetStatus(t, r, n.WorkspaceID, 1, nodewire.DNSConfigVersion)
	if got := links(t, r, n.WorkspaceID); got != "lo" {
		t.Errorf("interfaces in NONE: %q", got)
	}
	if out, code := fetch(t, r, n.WorkspaceID); code == 0 {
		t.Errorf("wget in NONE succeeded: %q", out)
	}
	if nets.open.Load() != 1 {
		t.Errorf("%d networks open, want 1", nets.open.Load())
	}

	// NONE → PUBLIC_INTERNET → (refused Apply) → NONE while running.
	st, err := r.ApplyNetwork(ctx, n.WorkspaceID, netConfig(public, 2))
	if err != nil || st.GetAppliedRevision() != 2 {
		t.Fatalf("NONE → PUBLIC_INTERNET: %v, %v", st, err)
	}
	if got := links(t, r, n.WorkspaceID); got != "lo eth0" {
		t.Errorf("interfaces after NONE → PUBLIC_INTERNET: %q", got)
	}
	if out, code := fetch(t, r, n.WorkspaceID); code != 0 || out != "hello from the host\n" {
		t.Errorf("wget after NONE → PUBLIC_INTERNET: exit %d: %q", code, out)
	}
	st, err = r.ApplyNetwork(ctx, n.WorkspaceID, netConfig(public, 999))
	if err == nil || st.GetAppliedRevision() != 2 {
		t.Errorf("refused Apply: %v, %v; want an error and revision 2 still applied", st, err)
	}
	// An open connection ends with the switch to NONE.
	sh(t, r, n.WorkspaceID, "(nc 198.51.100.7 80 </dev/zero >/dev/null 2>&1; echo ended >/tmp/nc) >/dev/null 2>&1 &")
	time.Sleep(200 * time.Millisecond)
	st, err = r.ApplyNetwork(ctx, n.WorkspaceID, netConfig(none, 3))
	if err != nil || st.GetAppliedRevision() != 3 {
		t.Fatalf("PUBLIC_INTERNET → NONE: %v, %v", st, err)
	}
	if got := links(t, r, n.WorkspaceID); got != "lo" {
		t.Errorf("interfaces after PUBLIC_INTERNET → NONE: %q", got)
	}
	if out, _ := run(t, r, n.WorkspaceID, "sh", "-c", "for i in $(seq 50); do [ -e /tmp/nc ] && break; sleep 0.1; done; cat /tmp/nc"); out != "ended\n" {
		t.Errorf("the open connection did not end with the switch to NONE: %q", out)
	}
	if nets.open.Load() != 1 {
		t.Errorf("%d networks open, want 1", nets.open.Load())
	}
	if _, err := r.ApplyNetwork(ctx, "ws-net-absent", netConfig(public, 1)); !errors.Is(err, ErrNotRunning) {
		t.Errorf("ApplyNetwork without execution: %v", err)
	}

	// Stop and Delete close it all.
	if err := r.Stop(ctx, s.WorkspaceID, false); err != nil {
		t.Fatal(err)
	}
	if nets.open.Load() != 0 {
		t.Errorf("%d networks open after the stop", nets.open.Load())
	}
	for _, ws := range []string{s.WorkspaceID, n.WorkspaceID} {
		if err := r.Delete(ctx, ws); err != nil {
			t.Fatal(err)
		}
	}
	assertNoLeaks(t, root)
	waitGoroutines(t, before)
}

// waitGoroutines waits until no more goroutines run than before.
func waitGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNetworkWithoutNetworking: a runtime without networking refuses a
// PUBLIC_INTERNET spec as invalid and reports no network status.
func TestNetworkWithoutNetworking(t *testing.T) {
	r, _ := newRuntime(t)
	s := testSpec("ws-net-nonet")
	s.Network = netConfig(public, 1)
	if err := r.Start(context.Background(), s); !errors.Is(err, ErrInvalidSpec) || !Permanent(err) {
		t.Fatalf("start: %v, want a permanent ErrInvalidSpec", err)
	}
	s.Network = netConfig(none, 1)
	start(t, r, s)
	if st, _ := r.Status(s.WorkspaceID); st.Network != nil {
		t.Errorf("network status without networking: %v", st.Network)
	}
	if err := r.Delete(context.Background(), s.WorkspaceID); err != nil {
		t.Fatal(err)
	}
}

// TestNetworkAdopt: a runtime that goes away (its TAPs with it) and a new
// one that re-adopts: the execution has no eth0 and no applied revision
// until ApplyNetwork attaches again; the DNS configuration version it
// started with is still reported, and one recorded without (an earlier
// release) reports 0.
func TestNetworkAdopt(t *testing.T) {
	nets := &testNetworks{target: httpServer(t)}
	r1, root := newRuntime(t, func(c *Config) { c.Network = nets.networking() })
	ctx := context.Background()
	s, old := testSpec("ws-net-adopt"), testSpec("ws-net-old")
	s.Network = netConfig(public, 4)
	start(t, r1, s)
	start(t, r1, old)
	// old looks like an earlier release's execution: no DNS version.
	st, err := r1.readState(old.WorkspaceID)
	if err != nil {
		t.Fatal(err)
	}
	st.DNSVersion = 0
	if err := r1.writeState(st); err != nil {
		t.Fatal(err)
	}
	r1.Close()
	if nets.open.Load() != 0 {
		t.Errorf("%d networks open after Close", nets.open.Load())
	}

	r2, err := New(Config{Root: root, GuestBinary: testGuest, Log: r1.cfg.Log, Network: nets.networking()})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if err := r2.Adopt(ctx); err != nil {
		t.Fatal(err)
	}
	wantNetStatus(t, r2, s.WorkspaceID, 0, nodewire.DNSConfigVersion)
	wantNetStatus(t, r2, old.WorkspaceID, 0, 0)
	if got := links(t, r2, s.WorkspaceID); got != "lo" {
		t.Errorf("interfaces after adoption, before the desired state: %q", got)
	}
	if _, err := r2.ApplyNetwork(ctx, s.WorkspaceID, netConfig(public, 4)); err != nil {
		t.Fatal(err)
	}
	wantNetStatus(t, r2, s.WorkspaceID, 4, nodewire.DNSConfigVersion)
	if out, code := fetch(t, r2, s.WorkspaceID); code != 0 || out != "hello from the host\n" {
		t.Errorf("wget after adoption: exit %d: %q", code, out)
	}
	for _, ws := range []string{s.WorkspaceID, old.WorkspaceID} {
		if err := r2.Delete(ctx, ws); err != nil {
			t.Fatal(err)
		}
	}
	if nets.open.Load() != 0 {
		t.Errorf("%d networks open after Delete", nets.open.Load())
	}
	assertNoLeaks(t, root)
}

// helperEnv marks a helper process of a test (TestMain then builds
// nothing); its value names the helper.
const helperEnv = "KIBOTOS_SANDBOX_HELPER"

// TestNetworkNodeKilled: the node agent holding a workspace's network is
// killed (SIGKILL): its TAP goes with it, the execution keeps running with
// lo only; the next agent re-adopts it, attaches again when applying the
// configuration, and Delete leaves nothing.
func TestNetworkNodeKilled(t *testing.T) {
	nets := &testNetworks{target: httpServer(t)}
	r, root := newRuntime(t, func(c *Config) { c.Network = nets.networking() })
	ctx := context.Background()
	const ws = "ws-net-killed"

	node := exec.Command(os.Args[0], "-test.run=^TestHelperNetworkNode$", "-test.count=1", "-test.v")
	node.Env = append(os.Environ(), helperEnv+"=network-node", "KIBOTOS_TEST_GUEST="+testGuest, "KIBOTOS_TEST_TEMPLATE="+testTemplate,
		"KIBOTOS_TEST_ROOT="+root, "KIBOTOS_TEST_TARGET="+nets.target, "KIBOTOS_TEST_WS="+ws)
	out, err := node.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := node.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	node.Stderr = testLogWriter{t}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "started "+ws {
				started <- nil
				io.Copy(io.Discard, out)
				return
			}
			t.Log("helper node:", sc.Text())
		}
		started <- errors.New("the helper node ended before starting the workspace")
	}()
	select {
	case err = <-started:
	case <-time.After(60 * time.Second):
		err = errors.New("the helper node did not start the workspace in 60s")
	}
	if err != nil {
		node.Process.Kill()
		node.Wait()
		t.Fatal(err)
	}
	node.Process.Signal(unix.SIGKILL)
	node.Wait()

	if err := r.Adopt(ctx); err != nil {
		t.Fatal(err)
	}
	wantNetStatus(t, r, ws, 0, nodewire.DNSConfigVersion)
	if got := links(t, r, ws); got != "lo" {
		t.Errorf("interfaces after the node was killed: %q", got)
	}
	if _, err := r.ApplyNetwork(ctx, ws, netConfig(public, 7)); err != nil {
		t.Fatal(err)
	}
	if out, code := fetch(t, r, ws); code != 0 || out != "hello from the host\n" {
		t.Errorf("wget after the new node applied the network: exit %d: %q", code, out)
	}
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
	if nets.open.Load() != 0 {
		t.Errorf("%d networks open after Delete", nets.open.Load())
	}
	assertNoLeaks(t, root)
}

// TestHelperNetworkNode is the node agent of TestNetworkNodeKilled: it
// starts the workspace with a network and waits to be killed.
func TestHelperNetworkNode(t *testing.T) {
	if os.Getenv(helperEnv) != "network-node" {
		t.Skip("helper of TestNetworkNodeKilled")
	}
	nets := &testNetworks{target: os.Getenv("KIBOTOS_TEST_TARGET")}
	r, err := New(Config{Root: os.Getenv("KIBOTOS_TEST_ROOT"), GuestBinary: testGuest, Network: nets.networking(),
		Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s := testSpec(os.Getenv("KIBOTOS_TEST_WS"))
	s.Network = netConfig(public, 6)
	if err := r.Start(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if links(t, r, s.WorkspaceID) != "lo eth0" {
		t.Fatal("no eth0 in the helper node's workspace")
	}
	fmt.Println("started " + s.WorkspaceID)
	_, _ = os.Stdin.Read(make([]byte, 1)) // until killed
}

// TestNetworkHostileWorkspace: root in the workspace tries to reconfigure
// eth0 (other MTU, another address, down, deleted; it lacks CAP_NET_ADMIN,
// and netattach's tests cover a namespace whose owner deletes the TAP):
// eth0 keeps working, nothing in the node spins, the execution stops and is
// deleted cleanly, and a new start has its eth0 again.
func TestNetworkHostileWorkspace(t *testing.T) {
	nets := &testNetworks{target: httpServer(t)}
	r, root := newRuntime(t, func(c *Config) { c.Network = nets.networking() })
	ctx := context.Background()
	before := runtime.NumGoroutine()
	s := testSpec("ws-net-hostile")
	s.Network = netConfig(public, 1)
	start(t, r, s)
	out, _ := run(t, r, s.WorkspaceID, "sh", "-c",
		"ip link set eth0 mtu 1280; ip addr add 10.0.0.5/24 dev eth0; ip link set eth0 down; ip link del eth0; true")
	t.Logf("root in the workspace:\n%s", out)
	if got := links(t, r, s.WorkspaceID); got != "lo eth0" {
		t.Errorf("interfaces after the workspace's attempts: %q", got)
	}
	if out, code := fetch(t, r, s.WorkspaceID); code != 0 || out != "hello from the host\n" {
		t.Errorf("wget after the workspace's attempts: exit %d: %q", code, out)
	}
	var ru0, ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	t0 := time.Now()
	time.Sleep(500 * time.Millisecond)
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	used := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	if wall := time.Since(t0); used > wall/4 {
		t.Errorf("the node used %v of CPU in %v while the workspace idled", used, wall)
	}
	if err := r.Stop(ctx, s.WorkspaceID, true); err != nil {
		t.Fatal(err)
	}
	start(t, r, s)
	if got := links(t, r, s.WorkspaceID); got != "lo eth0" {
		t.Errorf("interfaces after a new start: %q", got)
	}
	if err := r.Delete(ctx, s.WorkspaceID); err != nil {
		t.Fatal(err)
	}
	if nets.open.Load() != 0 {
		t.Errorf("%d networks open after Delete", nets.open.Load())
	}
	assertNoLeaks(t, root)
	waitGoroutines(t, before)
}
