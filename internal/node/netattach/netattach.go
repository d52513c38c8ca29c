//go:build linux

// Package netattach attaches a workspace's network namespace to the node: a
// TAP device "eth0" created inside the namespace, configured as the
// workspace's only interface (address, MTU, default route via the node's
// gateway address), whose descriptor becomes a gVisor link endpoint for the
// node's user-space stack (package internal/node/netstack; tap.go: frames
// with a virtio-net header, TCP checksums left to each side's trust, reads
// in Go's network poller). It also
// holds the kernel backstop (backstop.go), one per node, derived from its
// state directory: the mark the node puts on every socket it opens for a
// workspace, and the nftables table that rejects packets with that mark to
// host-local and special-purpose addresses.
//
// Namespaces: the TAP is opened by an OS thread that has joined the
// workspace's namespace (setns) and goes back right after; a thread that
// cannot go back is never returned to the Go scheduler (it stays locked and
// ends with its goroutine). The netlink socket that configures the device is
// opened on that thread too, so it talks to the workspace's namespace for
// good, wherever it is used later.
//
// The workspace's root owns its namespace: it may reconfigure, take down or
// delete eth0. Nothing of that reaches the host: reads of a deleted device
// fail, and the endpoint's reader then ends quietly (it returns on any read
// error other than EAGAIN, and waits in the poller otherwise). Closing the
// Link closes the descriptor, which removes the TAP (it is not persistent),
// and with it every connection of the workspace.
package netattach

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Name is the workspace-side name of the TAP device.
const Name = "eth0"

// NodeMAC is the link address of the node's side of the TAP (a locally
// administered unicast address; every workspace's link is its own segment).
const NodeMAC = tcpip.LinkAddress("\x02\x6b\x62\x00\x00\x01")

// netlinkTimeout bounds each netlink request of the configuration.
const netlinkTimeout = 5 * time.Second

// Options describe the workspace's side of the link.
type Options struct {
	// Address is the workspace's address and the prefix of its link (for
	// example 169.254.77.2/30).
	Address netip.Prefix
	// Gateway is the node's address on the link, the workspace's default
	// route.
	Gateway netip.Addr
	// MTU of the TAP and of the endpoint.
	MTU uint32
}

func (o Options) check() error {
	a := o.Address.Addr()
	if !o.Address.IsValid() || !o.Gateway.IsValid() || a.Is4In6() || o.Gateway.Is4In6() || a.Is4() != o.Gateway.Is4() {
		return errors.New("netattach: address and gateway must be valid and of one family")
	}
	if !o.Address.Contains(o.Gateway) || a == o.Gateway {
		return fmt.Errorf("netattach: gateway %s is not another address of %s", o.Gateway, o.Address)
	}
	if o.MTU < 1280 || o.MTU > 65521 {
		return fmt.Errorf("netattach: MTU %d outside 1280..65521", o.MTU)
	}
	return nil
}

// Link is an attached TAP.
type Link struct {
	// Endpoint is the node's side: a gVisor link endpoint on the TAP's
	// descriptor, for one stack. After Close it neither reads nor writes.
	Endpoint stack.LinkEndpoint

	ep   *guarded
	tap  *tapEndpoint
	once sync.Once
}

// Attach creates and configures the TAP in the network namespace of the
// process pid. The caller must know that pid is still the process it means
// (it holds it as its child, or checks a pidfd after Attach); AttachNetns
// takes an opened namespace instead.
func Attach(pid int, o Options) (*Link, error) {
	ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return nil, fmt.Errorf("netattach: network namespace of %d: %w", pid, err)
	}
	defer ns.Close()
	return AttachNetns(ns, o)
}

// AttachNetns creates and configures the TAP in the network namespace ns
// (an open /proc/<pid>/ns/net or a bind mount of one).
func AttachNetns(ns *os.File, o Options) (*Link, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	var (
		fd  int
		h   *netlink.Handle
		err error
	)
	if err := inNetns(ns, func() error {
		fd, h, err = openTAP()
		return err
	}); err != nil {
		return nil, err
	}
	l, err := setup(fd, h, o)
	h.Close()
	if err != nil {
		return nil, err
	}
	return l, nil
}

// inNetns runs fn on a locked OS thread inside ns and moves the thread back
// afterwards. A thread that cannot move back stays locked, so the runtime
// ends it with the goroutine instead of reusing it.
func inNetns(ns *os.File, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netattach: own network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netattach: join the workspace's network namespace: %w", err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the thread dies with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("netattach: return to the node's network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// openTAP runs inside the workspace's namespace: it opens the TAP (removing
// an interface of that name the workspace made itself), a netlink handle
// bound to the namespace, and turns IPv6 off on the device (the node's stack
// speaks only the workspace's IPv4). On error nothing stays open.
func openTAP() (int, *netlink.Handle, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return -1, nil, fmt.Errorf("netattach: netlink: %w", err)
	}
	_ = h.SetSocketTimeout(netlinkTimeout)
	fd, err := tunSetIFF(Name)
	if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) || errors.Is(err, unix.EINVAL) {
		// Our TAP of an earlier node process is gone with its descriptor:
		// an eth0 is the workspace's own. It goes.
		if l, lerr := h.LinkByName(Name); lerr == nil {
			_ = h.LinkDel(l)
		}
		fd, err = tunSetIFF(Name)
	}
	if err != nil {
		h.Close()
		return -1, nil, fmt.Errorf("netattach: TAP %s: %w", Name, err)
	}
	// Per-namespace sysctl: the thread's namespace is the workspace's.
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+Name+"/disable_ipv6", []byte("1"), 0)
	return fd, h, nil
}

// tunSetIFF opens /dev/net/tun and makes it a new TAP named name
// (IFF_TUN_EXCL: never an existing device).
func tunSetIFF(name string) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var ifr struct {
		name  [unix.IFNAMSIZ]byte
		flags uint16
		_     [22]byte
	}
	copy(ifr.name[:], name)
	ifr.flags = openTAPFlags
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		unix.Close(fd)
		return -1, errno
	}
	if err := setVnetHdr(fd); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// setup configures the TAP through h (bound to its namespace) and makes the
// endpoint on fd, which it owns from then on (closed on failure).
func setup(fd int, h *netlink.Handle, o Options) (*Link, error) {
	tap, err := newTAPEndpoint(fd, o.MTU, NodeMAC)
	if err != nil {
		return nil, fmt.Errorf("netattach: endpoint: %w", err)
	}
	if err := configure(h, o); err != nil {
		tap.close()
		return nil, err
	}
	g := &guarded{LinkEndpoint: tap, gso: tap}
	return &Link{Endpoint: g, ep: g, tap: tap}, nil
}

// configure sets eth0 up through h: MTU, address, up, default route.
func configure(h *netlink.Handle, o Options) error {
	link, err := h.LinkByName(Name)
	if err != nil {
		return fmt.Errorf("netattach: %s: %w", Name, err)
	}
	if err := h.LinkSetMTU(link, int(o.MTU)); err != nil {
		return fmt.Errorf("netattach: MTU of %s: %w", Name, err)
	}
	addr := &netlink.Addr{IPNet: prefixNet(o.Address)}
	if err := h.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("netattach: address of %s: %w", Name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("netattach: %s up: %w", Name, err)
	}
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: o.Gateway.AsSlice()}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("netattach: default route via %s: %w", o.Gateway, err)
	}
	return nil
}

// Close stops the endpoint (its reader has ended when Close returns, and it
// writes nothing more) and closes the TAP's descriptor, which removes the
// device from the workspace. Close the stack on Endpoint first; a second
// Close does nothing.
func (l *Link) Close() error {
	var err error
	l.once.Do(func() {
		l.ep.shut()
		err = l.tap.close()
	})
	return err
}

// guarded is the TAP's endpoint with a lock around writes and attaching, so
// that nothing uses the descriptor once Link.Close has begun.
type guarded struct {
	stack.LinkEndpoint
	gso    stack.GSOEndpoint
	mu     sync.RWMutex
	closed bool
}

// WritePackets writes unless the link is closed.
func (g *guarded) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return 0, &tcpip.ErrClosedForSend{}
	}
	return g.LinkEndpoint.WritePackets(pkts)
}

// GSOMaxSize implements stack.GSOEndpoint.
func (g *guarded) GSOMaxSize() uint32 { return g.gso.GSOMaxSize() }

// SupportedGSO implements stack.GSOEndpoint.
func (g *guarded) SupportedGSO() stack.SupportedGSO { return g.gso.SupportedGSO() }

// Attach starts the reader, or stops it (nil); once the link is closed it
// starts nothing.
func (g *guarded) Attach(d stack.NetworkDispatcher) {
	if d == nil {
		// Stopping only tells the reader to stop (Wait waits for it).
		g.LinkEndpoint.Attach(nil)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.LinkEndpoint.Attach(d)
	}
}

// shut refuses every later write and attach, waits for writes in flight,
// and stops the reader and waits for it.
func (g *guarded) shut() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.LinkEndpoint.Attach(nil)
	g.LinkEndpoint.Wait()
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
