//go:build linux

package netattach

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/node/netstack"
)

var testOpts = Options{
	Address: netip.MustParsePrefix("169.254.77.2/30"),
	Gateway: netip.MustParseAddr("169.254.77.1"),
	MTU:     65520,
}

func TestOptionsChecked(t *testing.T) {
	for _, o := range []Options{
		{},
		{Address: testOpts.Address, Gateway: netip.MustParseAddr("169.254.78.1"), MTU: 1500},
		{Address: testOpts.Address, Gateway: testOpts.Address.Addr(), MTU: 1500},
		{Address: testOpts.Address, Gateway: testOpts.Gateway, MTU: 100},
		{Address: testOpts.Address, Gateway: netip.MustParseAddr("::ffff:169.254.77.1"), MTU: 1500},
	} {
		if err := o.check(); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if err := testOpts.check(); err != nil {
		t.Fatal(err)
	}
}

// cpuTime is the CPU time the test process has used.
func cpuTime() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestAttach: the TAP in a namespace is eth0 with the workspace's address,
// MTU, default route and no IPv6; a connection from inside goes through the
// node's stack. When the workspace deletes eth0 the endpoint's reader ends
// without spinning, and closing everything leaves no goroutine.
func TestAttach(t *testing.T) {
	requireRoot(t)
	ws := newNetns(t)
	h := handleIn(t, ws)
	echo := listenIn(t, nil, "tcp", "127.0.0.1:0")
	before := runtime.NumGoroutine()

	link, err := AttachNetns(ws, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	l, err := h.LinkByName(Name)
	if err != nil {
		t.Fatal(err)
	}
	if l.Type() != "tuntap" || l.Attrs().MTU != int(testOpts.MTU) || l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("eth0: type %s, MTU %d, flags %v", l.Type(), l.Attrs().MTU, l.Attrs().Flags)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != testOpts.Address.String() {
		t.Errorf("addresses of eth0: %v (IPv6 must be off)", addrs)
	}
	routes, err := h.RouteList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
		return (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == testOpts.Gateway.String()
	}) {
		t.Errorf("no default route via the gateway: %v", routes)
	}

	s, err := netstack.New(netstack.Config{Link: link.Endpoint, Address: testOpts.Address, Gateway: testOpts.Gateway, MTU: testOpts.MTU,
		Decide: func(context.Context, netip.AddrPort) (netstack.Decision, error) {
			return netstack.Decision{Dial: func(ctx context.Context) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", echo)
			}, Path: "direct"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := dialIn(t, ws, nil, "tcp", "198.51.100.7:80")
	if err != nil {
		t.Fatal(err)
	}
	echoes(t, c)
	open, err := dialIn(t, ws, nil, "tcp", "198.51.100.7:80")
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()

	// The workspace's root deletes eth0 (with a connection open): the
	// node's reader ends and nothing spins.
	if err := h.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	cpu0, t0 := cpuTime(), time.Now()
	time.Sleep(500 * time.Millisecond)
	if used, wall := cpuTime()-cpu0, time.Since(t0); used > wall/4 {
		t.Errorf("%v of CPU in %v after eth0 was deleted: something spins", used, wall)
	}
	s.Close()
	if err := link.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := link.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	waitFor(t, "goroutines back", func() bool { return runtime.NumGoroutine() <= before })
}

// TestCloseRemovesTAP: closing the link removes eth0 from the namespace;
// a later Attach makes a new one. A device called eth0 that the workspace
// made itself is replaced.
func TestCloseRemovesTAP(t *testing.T) {
	requireRoot(t)
	ws := newNetns(t)
	h := handleIn(t, ws)
	before := runtime.NumGoroutine()
	for range 2 {
		link, err := AttachNetns(ws, testOpts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.LinkByName(Name); err != nil {
			t.Fatal(err)
		}
		link.Close()
		if _, err := h.LinkByName(Name); !errors.As(err, new(netlink.LinkNotFoundError)) {
			t.Fatalf("eth0 after Close: %v", err)
		}
	}
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: Name}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	link, err := AttachNetns(ws, testOpts)
	if err != nil {
		t.Fatalf("attach over the workspace's own eth0: %v", err)
	}
	if l, err := h.LinkByName(Name); err != nil || l.Type() != "tuntap" {
		t.Fatalf("eth0: %v, %v", l, err)
	}
	link.Close()
	waitFor(t, "goroutines back", func() bool { return runtime.NumGoroutine() <= before })
}

// TestAttachByPid: Attach(pid) reaches the namespace of a process; when the
// node process holding the TAP is killed (SIGKILL), the TAP goes with it.
func TestAttachByPid(t *testing.T) {
	requireRoot(t)
	bb := busybox(t)
	wsProc := exec.Command(bb, "sleep", "1000")
	wsProc.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET}
	if err := wsProc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { wsProc.Process.Kill(); wsProc.Wait() }()
	ns, err := os.Open("/proc/" + strconv.Itoa(wsProc.Process.Pid) + "/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h := handleIn(t, ns)

	node := exec.Command(os.Args[0], "-test.run=^TestHelperNode$", "-test.count=1")
	node.Env = append(os.Environ(), "NETATTACH_HELPER_PID="+strconv.Itoa(wsProc.Process.Pid))
	out, err := node.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := node.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	node.Stderr = os.Stderr
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "attached\n" {
		node.Process.Kill()
		node.Wait()
		t.Fatalf("helper node: %q, %v", line, err)
	}
	if _, err := h.LinkByName(Name); err != nil {
		t.Fatalf("eth0 while the node runs: %v", err)
	}
	node.Process.Signal(unix.SIGKILL)
	node.Wait()
	waitFor(t, "eth0 gone after SIGKILL of the node", func() bool {
		_, err := h.LinkByName(Name)
		return errors.As(err, new(netlink.LinkNotFoundError))
	})
}

// TestHelperNode is the node process of TestAttachByPid.
func TestHelperNode(t *testing.T) {
	pid, err := strconv.Atoi(os.Getenv("NETATTACH_HELPER_PID"))
	if err != nil {
		t.Skip("helper of TestAttachByPid")
	}
	link, err := Attach(pid, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	os.Stdout.WriteString("attached\n")
	_, _ = os.Stdin.Read(make([]byte, 1)) // until killed
}
