//go:build linux

package nettest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Range is the private range every Peer's subnet is taken from. Tests
// allow-list it (kibotos-node and kibotos-ctrl --allow-endpoint-ranges).
var Range = netip.MustParsePrefix("10.231.0.0/16")

// lockDir holds one lock file per subnet number; a Peer holds the flock of
// its number for its lifetime (released by the kernel if the process dies).
const lockDir = "/run/kibotos-nettest"

// Names of what a Peer creates, derived from its subnet number so that a
// later Peer on the same number can remove what a crashed run left.
func nsName(n int) string     { return "kbnt-" + strconv.Itoa(n) }
func hostLink(n int) string   { return "kbnt" + strconv.Itoa(n) + "h" }
func peerLink(n int) string   { return "kbnt" + strconv.Itoa(n) + "p" }
func userPrefix(n int) string { return "kbnt" + strconv.Itoa(n) + "u" }

// Peer is a network namespace joined to the host by a veth pair on
// 10.231.N.0/24: HostAddr (.1) on the host's end, Addr (.2) on the peer's.
// Its servers are closed, its processes killed and its namespace, links and
// system users removed by Close.
type Peer struct {
	N        int          // the subnet number
	Name     string       // the namespace (ip netns), "kbnt-N"
	HostLink string       // the host's end of the veth pair
	Link     string       // the peer's end, inside the namespace
	Prefix   netip.Prefix // 10.231.N.0/24
	Addr     netip.Addr   // 10.231.N.2, the peer's address
	HostAddr netip.Addr   // 10.231.N.1, the host's address on the link

	ip   string
	lock *os.File
	dir  string // tempDir, once made

	mu      sync.Mutex
	closers []func() error
	closed  bool
	users   int
}

// RequireRoot skips tb when the process is not root, and fails it instead
// under CI=true (CI runs as root: these tests must not skip there).
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal("nettest: CI runs as root: the network tests must not skip")
	}
	tb.Skip("nettest: needs root (network namespaces, veth pairs, system users)")
}

// RequireTools skips tb when one of the programs is not installed, and
// fails it instead under CI=true (.ci/run installs them: iproute2's ip,
// dante-server's danted, socat).
func RequireTools(tb testing.TB, names ...string) {
	tb.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			if os.Getenv("CI") == "true" {
				tb.Fatalf("nettest: %s not found; .ci/run installs it", n)
			}
			tb.Skipf("nettest: %s not found (apt-get install iproute2 dante-server socat)", n)
		}
	}
}

// NewPeer is OpenPeer for a test: it skips when not root (see RequireRoot)
// and closes the Peer when tb ends, failing tb if something could not be
// removed.
func NewPeer(tb testing.TB) *Peer {
	tb.Helper()
	RequireRoot(tb)
	RequireTools(tb, "ip")
	p, err := OpenPeer()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("nettest: closing peer %s: %v", p.Name, err)
		}
	})
	return p
}

// OpenPeer creates a Peer on a free subnet number. The caller must Close it.
func OpenPeer() (*Peer, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("nettest: needs root (network namespaces, veth pairs, system users)")
	}
	ipPath, err := exec.LookPath("ip")
	if err != nil {
		return nil, fmt.Errorf("nettest: the ip command (iproute2) is needed: %w", err)
	}
	return openPeer(ipPath, 0)
}

// openPeer creates a Peer on subnet number only (1..254), or on a free one
// when only is 0.
func openPeer(ipPath string, only int) (*Peer, error) {
	if err := os.MkdirAll(lockDir, 0o700); err != nil {
		return nil, fmt.Errorf("nettest: %w", err)
	}
	p := &Peer{ip: ipPath}
	start := rand.IntN(254)
	for i := range 254 {
		n := 1 + (start+i)%254
		if only != 0 {
			if i > 0 {
				break
			}
			n = only
		}
		f, err := os.OpenFile(filepath.Join(lockDir, "subnet-"+strconv.Itoa(n)+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("nettest: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		p.N, p.lock = n, f
		break
	}
	if p.lock == nil {
		if only != 0 {
			return nil, fmt.Errorf("nettest: subnet %d is in use", only)
		}
		return nil, errors.New("nettest: all 254 subnets of 10.231.0.0/16 are in use")
	}
	p.Name, p.HostLink, p.Link = nsName(p.N), hostLink(p.N), peerLink(p.N)
	p.Prefix = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 231, byte(p.N), 0}), 24)
	p.HostAddr = netip.AddrFrom4([4]byte{10, 231, byte(p.N), 1})
	p.Addr = netip.AddrFrom4([4]byte{10, 231, byte(p.N), 2})
	if err := p.removeStale(); err != nil {
		p.unlock()
		return nil, err
	}
	if err := p.setUp(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// setUp creates the namespace and the veth pair: addresses, routes (the peer
// routes only Range, through the host) and forwarding on the host's end.
func (p *Peer) setUp() error {
	hostSide := netip.PrefixFrom(p.HostAddr, 24).String()
	peerSide := netip.PrefixFrom(p.Addr, 24).String()
	for _, args := range [][]string{
		{"netns", "add", p.Name},
		{"link", "add", p.HostLink, "type", "veth", "peer", "name", p.Link, "netns", p.Name},
		{"addr", "add", hostSide, "dev", p.HostLink},
		{"link", "set", p.HostLink, "up"},
		{"-n", p.Name, "link", "set", "lo", "up"},
		{"-n", p.Name, "addr", "add", peerSide, "dev", p.Link},
		{"-n", p.Name, "link", "set", p.Link, "up"},
		{"-n", p.Name, "route", "add", Range.String(), "via", p.HostAddr.String()},
	} {
		if err := p.run(args...); err != nil {
			return err
		}
	}
	// IPv4 forwarding is decided by the interface a packet arrives on: the
	// host forwards what comes from its peers only (to other peers: they
	// route nothing else to it), whatever net.ipv4.ip_forward says.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+p.HostLink+"/forwarding", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("nettest: forwarding on %s: %w", p.HostLink, err)
	}
	return nil
}

// run runs ip with args and reports its output on failure.
func (p *Peer) run(args ...string) error {
	out, err := exec.Command(p.ip, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nettest: ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// removeStale removes what a crashed run left on this subnet number: its
// processes, namespace, host link and system users. Holding the number's
// lock means no live Peer owns them.
func (p *Peer) removeStale() error {
	var errs []error
	if err := p.remove(); err != nil {
		errs = append(errs, err)
	}
	for _, u := range usersWithPrefix(userPrefix(p.N)) {
		if out, err := exec.Command("userdel", u).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("nettest: userdel %s: %v: %s", u, err, out))
		}
	}
	return errors.Join(errs...)
}

// remove kills the processes left in the namespace and removes the veth
// pair (both ends at once: waiting for the namespace's deletion to take
// the peer's end takes seconds) and the namespace.
func (p *Peer) remove() error {
	var errs []error
	ns := false
	if _, err := os.Stat("/run/netns/" + p.Name); err == nil {
		ns = true
		p.killAll()
	}
	if _, err := net.InterfaceByName(p.HostLink); err == nil {
		if err := p.run("link", "del", p.HostLink); err != nil {
			errs = append(errs, err)
		}
	}
	if ns {
		if err := p.run("netns", "del", p.Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killAll SIGKILLs every process in the namespace and waits (up to 5 s)
// until none is left.
func (p *Peer) killAll() {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		out, _ := exec.Command(p.ip, "netns", "pids", p.Name).Output()
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			return
		}
		for _, s := range pids {
			if pid, err := strconv.Atoi(s); err == nil && pid > 1 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// usersWithPrefix lists the users of /etc/passwd whose name starts with
// prefix.
func usersWithPrefix(prefix string) []string {
	b, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		name, _, _ := strings.Cut(line, ":")
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out
}

// onClose registers f to run at Close (last registered first).
func (p *Peer) onClose(f func() error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closers = append(p.closers, f)
}

// Close stops the Peer's servers and processes, removes its system users,
// namespace and links, and releases its subnet number. It is idempotent.
func (p *Peer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	closers := p.closers
	p.closers = nil
	p.mu.Unlock()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	if p.Name != "" {
		if err := p.remove(); err != nil {
			errs = append(errs, err)
		}
	}
	p.unlock()
	return errors.Join(errs...)
}

func (p *Peer) unlock() {
	if p.lock != nil {
		unix.Flock(int(p.lock.Fd()), unix.LOCK_UN)
		p.lock.Close()
		p.lock = nil
	}
}

// Do runs fn on an OS thread that has joined the Peer's network namespace.
// Sockets fn opens belong to that namespace for their whole life, whichever
// goroutine uses them later.
func (p *Peer) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + p.Name)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("nettest: setns %s: %w", p.Name, err)
			return
		}
		ferr := fn()
		// A thread that cannot go back stays locked and ends with this
		// goroutine.
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// Listen opens a TCP listener inside the namespace on the Peer's address
// and port (0: any free port). It is closed with the Peer.
func (p *Peer) Listen(port uint16) (*net.TCPListener, error) {
	var ln *net.TCPListener
	err := p.Do(func() error {
		var err error
		ln, err = net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.AddrPortFrom(p.Addr, port)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nettest: listen in %s: %w", p.Name, err)
	}
	p.onClose(func() error { ln.Close(); return nil })
	return ln, nil
}

// ListenUDP opens a UDP socket inside the namespace on the Peer's address
// and port (0: any free port). It is closed with the Peer.
func (p *Peer) ListenUDP(port uint16) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := p.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(p.Addr, port)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nettest: listen udp in %s: %w", p.Name, err)
	}
	p.onClose(func() error { c.Close(); return nil })
	return c, nil
}

// DialContext dials from inside the namespace (from the Peer's address):
// the Peer as a client, for example of a server in another Peer.
func (p *Peer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var c net.Conn
	err := p.Do(func() error {
		var err error
		var d net.Dialer
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Proc is a process running inside the Peer's namespace, in a process
// group of its own.
type Proc struct {
	Cmd    *exec.Cmd
	Exited chan struct{} // closed when the process has exited
	out    *syncBuffer
}

// Output is what the process wrote to stdout and stderr so far.
func (pr *Proc) Output() string { return pr.out.String() }

// Start runs name with args inside the namespace (ip netns exec), its
// output collected, in a process group of its own that Close ends (SIGTERM,
// SIGKILL after 5 s).
func (p *Peer) Start(name string, args ...string) (*Proc, error) {
	cmd := exec.Command(p.ip, append([]string{"netns", "exec", p.Name, name}, args...)...)
	pr := &Proc{Cmd: cmd, Exited: make(chan struct{}), out: &syncBuffer{}}
	cmd.Stdout, cmd.Stderr = pr.out, pr.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("nettest: start %s in %s: %w", name, p.Name, err)
	}
	go func() { cmd.Wait(); close(pr.Exited) }()
	p.onClose(func() error { pr.Stop(); return nil })
	return pr, nil
}

// Stop ends the process group: SIGTERM, then SIGKILL for what remains
// after 5 s, and waits until none of it is left.
func (pr *Proc) Stop() {
	pgid := pr.Cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(-pgid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(-pgid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
	<-pr.Exited
}

// waitTCP waits until something accepts TCP connections on addr from the
// host, or the process exits, or timeout passes.
func waitTCP(addr netip.AddrPort, pr *Proc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr.String(), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-pr.Exited:
			return fmt.Errorf("exited (%v) before listening on %s: %s", pr.Cmd.ProcessState, addr, pr.Output())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s after %s: %v: %s", addr, timeout, err, pr.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePort returns a TCP port that is free on the Peer's address.
func (p *Peer) freePort() (uint16, error) {
	var port uint16
	err := p.Do(func() error {
		ln, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.AddrPortFrom(p.Addr, 0)))
		if err != nil {
			return err
		}
		port = uint16(ln.Addr().(*net.TCPAddr).Port)
		return ln.Close()
	})
	return port, err
}

// syncBuffer is a bytes.Buffer safe for concurrent writers and readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
