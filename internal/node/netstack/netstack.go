// Package netstack is the node's user-space TCP/IP stack for one workspace: a gVisor
// netstack (gvisor.dev/gvisor/pkg/tcpip, nothing else of gVisor) on the link endpoint
// the workspace's only interface leads to, which terminates every TCP connection the
// workspace opens and splices it to a connection the node dials.
//
// Addressing: the workspace owns one address of a small subnet (Config.Address, for
// example 10.x.y.2/30) and the node's side of that subnet is the gateway
// (Config.Gateway, 10.x.y.1), the workspace's default route. The node's stack holds the
// gateway address (so that the workspace's kernel can resolve it by ARP on a TAP) and
// runs in promiscuous mode with spoofing, so a SYN to any destination reaches the
// forwarder and its answers leave with that destination as their source.
//
// Every SYN is decided before the handshake completes: Config.Decide refuses it (a RST
// at once) or returns how to dial it; the dial happens first, bounded by
// Config.DialTimeout, and a failure is a RST too. Only then is the handshake completed
// and the two connections spliced. So a workspace never sees a connection that seems to
// succeed and then goes nowhere. Each live connection is registered with the opaque
// path Decide gave it (direct, or an Egress and its revision): CloseWhere and Count are
// what draining and "no longer admitted ends at once" are built on.
//
// Services the node itself offers the workspace on the gateway's address (DNS) are
// bound with ListenTCP and ListenUDP: gVisor hands a packet to a bound endpoint before
// the forwarder, so a SYN to a bound port is never Decided. UDP is not forwarded: a
// datagram to any port not bound is dropped without an ICMP answer. Of ICMP, only echo
// requests to the gateway's own address are answered (by gVisor); a ping of any other
// destination stays unanswered.
//
// Splices copy through pooled buffers (Config.CopyBuffer) taken only while their source
// has data: one read takes all that is queued and one write hands it on; a download
// reads its upstream socket ahead in a second goroutine while the first writes to
// gVisor. The link's writes run in a goroutine of their own behind a FIFO queue, so a
// download's segmentation and its frames' writes overlap.
//
// Close waits for every goroutine of the stack, so Decide and Dial must return when
// their ctx ends. The link endpoint's resources beyond the stack (the TAP's descriptor)
// stay the caller's, to close after Close.
//
// In production the link endpoint is internal/node/netattach's, on the TAP device it
// makes in the workspace's netns, and internal/node/network runs the stack with a
// workspace's policy.
package netstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/qdisc/fifo"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Defaults of Config.
const (
	DefaultMTU         = 65520
	DefaultDialTimeout = 10 * time.Second
	DefaultMaxInFlight = 1024
	DefaultMaxConns    = 16384
	DefaultCopyBuffer  = 1 << 20
)

// heldCopyBuffer is the size of the buffer of a download whose upstream cannot be
// waited on without reading (TLS): it is held for the connection's life, so it stays
// small.
const heldCopyBuffer = 64 << 10

// TCP buffer sizes of the stack (gVisor's defaults are 1 MiB and 4 MiB; larger ones keep
// a large-MTU link busy).
const (
	tcpBufferDefault = 1 << 20
	tcpBufferMax     = 8 << 20
)

// linkQueueLen bounds the packets queued for the link and not written yet; a full queue
// drops, as a NIC's transmit queue does (TCP recovers them).
const linkQueueLen = 1000

const nicID tcpip.NICID = 1

// Dial opens the node's side of a connection the workspace asked for.
type Dial func(ctx context.Context) (net.Conn, error)

// Decision is what Config.Decide answers for a connection it admits.
type Decision struct {
	// Dial opens the upstream connection; required.
	Dial Dial
	// Path is an opaque key of the route the connection takes (direct, an Egress and its
	// revision, ...), given back to CloseWhere's predicate.
	Path any
}

// Config configures a Stack.
type Config struct {
	// Link is the endpoint the workspace's frames arrive on: internal/node/netattach's
	// on a TAP in production, channel or pipe endpoints in tests. The Stack attaches it
	// and detaches it at Close.
	Link stack.LinkEndpoint
	// Address is the workspace's own address and the prefix of its subnet.
	Address netip.Prefix
	// Gateway is the node's address inside that subnet, the workspace's default route.
	Gateway netip.Addr
	// MTU of the link; 0 means DefaultMTU.
	MTU uint32
	// Decide is called for every SYN from the workspace's address. An error refuses the
	// connection with a RST; ctx ends with DialTimeout or Close.
	Decide func(ctx context.Context, dst netip.AddrPort) (Decision, error)
	// DialTimeout bounds Decide and Dial together; 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// MaxInFlight bounds the SYNs being decided or dialed at once; more get a RST.
	// 0 means DefaultMaxInFlight.
	MaxInFlight int
	// MaxConns bounds the live connections; a SYN beyond it gets a RST. 0 means
	// DefaultMaxConns.
	MaxConns int
	// CopyBuffer is the size of the buffers a splice reads into; 0 means
	// DefaultCopyBuffer. Each is taken from a pool only once its source is readable and
	// given back after the write, so an idle connection holds none. An upstream that is
	// not a plain socket (TLS to an Egress) is read through a held buffer of 64 KiB.
	// At most MaxCopyBuffers of them are out at once per stack: beyond that, reads use
	// 64 KiB buffers, so that a workspace opening many busy connections (and reading
	// none of them) cannot make the node hold CopyBuffer × 3 per connection.
	CopyBuffer int
}

// MaxCopyBuffers bounds the CopyBuffer-sized buffers a Stack's splices hold at once
// (64 MiB at the default size); further reads take 64 KiB buffers.
const MaxCopyBuffers = 64

// copyBufs is the pool of a Stack's splice buffers: CopyBuffer-sized ones up to
// MaxCopyBuffers out at once, then heldCopyBuffer-sized ones from small. Put tells the
// two apart by capacity.
type copyBufs struct {
	size  int
	big   sync.Pool
	small *sync.Pool
	out   atomic.Int64
}

// Get returns a *[]byte of size bytes, or of heldCopyBuffer bytes once MaxCopyBuffers
// are out.
func (p *copyBufs) Get() any {
	if p.size <= heldCopyBuffer {
		return p.big.Get()
	}
	if p.out.Add(1) > MaxCopyBuffers {
		p.out.Add(-1)
		return p.small.Get()
	}
	return p.big.Get()
}

// Put gives back a buffer Get returned.
func (p *copyBufs) Put(x any) {
	b := x.(*[]byte)
	if p.size > heldCopyBuffer && cap(*b) != p.size {
		p.small.Put(b)
		return
	}
	if p.size > heldCopyBuffer {
		p.out.Add(-1)
	}
	p.big.Put(b)
}

// Stack is the node's TCP/IP stack of one workspace.
type Stack struct {
	s       *stack.Stack
	ws      tcpip.Address
	gw      tcpip.Address
	proto   tcpip.NetworkProtocolNumber
	decide  func(context.Context, netip.AddrPort) (Decision, error)
	timeout time.Duration
	bufs    copyBufs  // *[]byte of CopyBuffer (bounded, then 64 KiB), taken by a splice while its source has data
	held    sync.Pool // *[]byte of heldCopyBuffer
	maxConn int

	ctx    context.Context
	cancel context.CancelFunc

	inFlight chan struct{} // semaphore of SYNs being decided or dialed

	mu     sync.Mutex
	closed bool
	active int // handlers and splices running
	idle   *sync.Cond
	conns  map[*conn]struct{}
}

// conn is one live connection: registered once its upstream is dialed, spliced once
// the workspace's handshake completed.
type conn struct {
	path any
	up   net.Conn
	once sync.Once

	// Guarded by Stack.mu: nil until the handshake completed, then set once.
	ep tcpip.Endpoint
	wq *waiter.Queue // ep's
	ws *gonet.TCPConn
	// killed asks connect to end the connection as soon as it is established.
	killed bool
}

// New builds the stack on cfg.Link and starts forwarding.
func New(cfg Config) (*Stack, error) {
	if cfg.Link == nil {
		return nil, errors.New("netstack: no link endpoint")
	}
	if cfg.Decide == nil {
		return nil, errors.New("netstack: no Decide")
	}
	pfx := cfg.Address
	if !pfx.IsValid() || !cfg.Gateway.IsValid() {
		return nil, errors.New("netstack: address and gateway are required")
	}
	if pfx.Addr().Is4In6() || cfg.Gateway.Is4In6() {
		return nil, errors.New("netstack: IPv4-mapped addresses are not accepted")
	}
	if pfx.Addr().Is4() != cfg.Gateway.Is4() {
		return nil, errors.New("netstack: address and gateway of different families")
	}
	if !pfx.Contains(cfg.Gateway) || pfx.Addr() == cfg.Gateway {
		return nil, fmt.Errorf("netstack: gateway %s is not another address of %s", cfg.Gateway, pfx)
	}
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = DefaultMTU
	}
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	maxInFlight := cfg.MaxInFlight
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	maxConns := cfg.MaxConns
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	bufSize := cfg.CopyBuffer
	if bufSize <= 0 {
		bufSize = DefaultCopyBuffer
	}

	// Only the workspace's family: fewer protocols for a hostile peer to talk to.
	network := []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol}
	if pfx.Addr().Is6() {
		network = []stack.NetworkProtocolFactory{ipv6.NewProtocol}
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   network,
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	fail := func(what string, err tcpip.Error) (*Stack, error) {
		s.Close()
		s.Wait()
		return nil, fmt.Errorf("netstack: %s: %s", what, err)
	}
	sack := tcpip.TCPSACKEnabled(true)
	recovery := tcpip.TCPRecovery(0) // RACK off
	cc := tcpip.CongestionControlOption("reno")
	moderate := tcpip.TCPModerateReceiveBufferOption(true)
	// SYN-ACK retransmissions on a local link: a handshake the workspace never completes
	// holds its in-flight slot for seconds, not minutes.
	synRetries := tcpip.TCPSynRetriesOption(3)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: tcpBufferDefault, Max: tcpBufferMax}
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: tcpBufferDefault, Max: tcpBufferMax}
	for _, opt := range []tcpip.SettableTransportProtocolOption{&sack, &recovery, &cc, &moderate, &synRetries, &rcv, &snd} {
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, opt); err != nil {
			return fail(fmt.Sprintf("TCP option %T", opt), err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	st := &Stack{
		s:        s,
		ws:       tcpip.AddrFromSlice(pfx.Addr().AsSlice()),
		gw:       tcpip.AddrFromSlice(cfg.Gateway.AsSlice()),
		proto:    ipv4.ProtocolNumber,
		decide:   cfg.Decide,
		timeout:  timeout,
		maxConn:  maxConns,
		ctx:      ctx,
		cancel:   cancel,
		inFlight: make(chan struct{}, maxInFlight),
		conns:    make(map[*conn]struct{}),
	}
	if pfx.Addr().Is6() {
		st.proto = ipv6.ProtocolNumber
	}
	st.idle = sync.NewCond(&st.mu)
	st.bufs.size, st.bufs.small = bufSize, &st.held
	st.bufs.big.New = func() any { b := make([]byte, bufSize); return &b }
	st.held.New = func() any { b := make([]byte, heldCopyBuffer); return &b }
	fail = func(what string, err tcpip.Error) (*Stack, error) {
		cancel()
		s.Close()
		s.Wait()
		return nil, fmt.Errorf("netstack: %s: %s", what, err)
	}

	// The handlers are in place before the NIC exists: packets flow from its attachment.
	// gVisor ignores SYNs beyond its own bound silently; ours, below it, answers a RST.
	fwd := tcp.NewForwarder(s, 0, 2*maxInFlight+16, st.handle)
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, fwd.HandlePacket)
	// Datagrams to a port bound with ListenUDP reach it; every other one is handled by
	// dropping it (no ICMP port unreachable).
	s.SetTransportProtocolHandler(udp.ProtocolNumber, func(stack.TransportEndpointID, *stack.PacketBuffer) bool { return true })

	cfg.Link.SetMTU(mtu)
	// The link's writes (a syscall per frame on a TAP) run in a goroutine of their own,
	// behind a FIFO: a download's segmentation and its writes to the link overlap.
	qdisc := fifo.New(cfg.Link, 1, linkQueueLen)
	if err := s.CreateNICWithOptions(nicID, cfg.Link, stack.NICOptions{Name: "workspace", Disabled: true, QDisc: qdisc}); err != nil {
		qdisc.Close()
		return fail("NIC", err)
	}
	if err := s.SetPromiscuousMode(nicID, true); err != nil {
		return fail("promiscuous mode", err)
	}
	if err := s.SetSpoofing(nicID, true); err != nil {
		return fail("spoofing", err)
	}
	proto := st.proto
	gw := tcpip.ProtocolAddress{
		Protocol:          proto,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: st.gw, PrefixLen: pfx.Bits()},
	}
	if err := s.AddProtocolAddress(nicID, gw, stack.AddressProperties{}); err != nil {
		return fail("gateway address", err)
	}
	if proto == ipv4.ProtocolNumber {
		s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}})
	} else {
		s.SetRouteTable([]tcpip.Route{{Destination: header.IPv6EmptySubnet, NIC: nicID}})
	}
	if err := s.EnableNIC(nicID); err != nil {
		return fail("enabling the NIC", err)
	}
	return st, nil
}

// enter counts a running handler or splice; false once the stack is closed.
func (st *Stack) enter() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return false
	}
	st.active++
	return true
}

func (st *Stack) leave() {
	st.mu.Lock()
	st.active--
	if st.active == 0 {
		st.idle.Broadcast()
	}
	st.mu.Unlock()
}

// handle decides, dials and only then completes one SYN.
func (st *Stack) handle(r *tcp.ForwarderRequest) {
	if !st.enter() {
		r.Complete(true)
		return
	}
	defer st.leave()
	select {
	case st.inFlight <- struct{}{}:
	default:
		r.Complete(true)
		return
	}
	c, ok := st.connect(r)
	<-st.inFlight
	if !ok {
		return
	}
	st.splice(c)
}

// connect runs Decide and Dial, then completes the handshake; it completes r in every
// case and returns the registered connection when it was established.
func (st *Stack) connect(r *tcp.ForwarderRequest) (*conn, bool) {
	id := r.ID()
	// A workspace can put any source address in its packets: only its own is forwarded.
	if id.RemoteAddress != st.ws {
		r.Complete(true)
		return nil, false
	}
	dstAddr, ok := netip.AddrFromSlice(id.LocalAddress.AsSlice())
	if !ok {
		r.Complete(true)
		return nil, false
	}
	dst := netip.AddrPortFrom(dstAddr, id.LocalPort)
	if st.Count() >= st.maxConn {
		r.Complete(true)
		return nil, false
	}

	ctx, cancel := context.WithTimeout(st.ctx, st.timeout)
	defer cancel()
	d, err := st.decide(ctx, dst)
	if err != nil || d.Dial == nil {
		r.Complete(true)
		return nil, false
	}
	up, err := d.Dial(ctx)
	if err != nil {
		r.Complete(true)
		return nil, false
	}
	if up == nil {
		r.Complete(true)
		return nil, false
	}

	// Registered before the handshake, so a CloseWhere or Close racing with it still
	// sees the connection; it is ended as soon as it is established.
	c := &conn{path: d.Path, up: up}
	st.mu.Lock()
	if st.closed || len(st.conns) >= st.maxConn {
		st.mu.Unlock()
		r.Complete(true)
		up.Close()
		return nil, false
	}
	st.conns[c] = struct{}{}
	st.mu.Unlock()

	// A Close or CloseWhere while the upstream was dialed ends it here, before the
	// handshake: CreateEndpoint completes the handshake itself and, on a stack closed
	// meanwhile, would wait out the workspace's SYN-ACK retransmissions (~2 min).
	st.mu.Lock()
	killed := c.killed || st.closed
	st.mu.Unlock()
	if killed {
		r.Complete(true)
		up.Close()
		st.unregister(c)
		return nil, false
	}
	wq := new(waiter.Queue)
	ep, terr := r.CreateEndpoint(wq)
	if terr != nil {
		r.Complete(true)
		up.Close()
		st.unregister(c)
		return nil, false
	}
	r.Complete(false)
	st.mu.Lock()
	c.ep, c.wq, c.ws = ep, wq, gonet.NewTCPConn(wq, ep)
	killed = c.killed
	st.mu.Unlock()
	if killed {
		c.abort()
		st.unregister(c)
		return nil, false
	}
	return c, true
}

func (st *Stack) unregister(c *conn) {
	st.mu.Lock()
	delete(st.conns, c)
	st.mu.Unlock()
}

// splice copies both ways until both directions ended or one failed; it closes both
// connections and unregisters c.
func (st *Stack) splice(c *conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := st.copyFromWorkspace(c); err != nil {
			c.abort()
		}
	}()
	var err error
	if rc := rawConn(c.up); rc != nil {
		err = st.copyFromSocket(c, rc)
	} else {
		err = st.copyHalf(c.ws, c.up)
	}
	if err != nil {
		c.abort()
	}
	<-done
	c.close()
	st.unregister(c)
}

type closeWriter interface{ CloseWrite() error }

// bufPool is where reads of upstream sockets take their buffers (a *sync.Pool of
// *[]byte).
type bufPool interface {
	Get() any
	Put(any)
}

// copyHalf copies src to dst through a held buffer; at src's end it half-closes dst.
// A failure is returned, EOF is not; a dst that cannot be half-closed is a failure (the
// caller then ends the connection).
func (st *Stack) copyHalf(dst, src net.Conn) error {
	bp := st.held.Get().(*[]byte)
	defer st.held.Put(bp)
	// The wrappers keep io.CopyBuffer on our buffer (no ReaderFrom/WriterTo shortcuts).
	_, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *bp)
	if err != nil {
		return err
	}
	return halfClose(dst)
}

// copyFromWorkspace copies the workspace's side to the upstream as copyHalf does, each
// read into a pooled buffer of CopyBuffer taken only once the endpoint is readable: one
// read takes all gVisor has queued (up to the buffer), and one write hands it to the
// upstream.
func (st *Stack) copyFromWorkspace(c *conn) error {
	const events = waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr
	e, ready := waiter.NewChannelEntry(events)
	c.wq.EventRegister(&e)
	defer c.wq.EventUnregister(&e)
	for {
		// Registered first: a notification between the check and the wait is kept.
		for c.ep.Readiness(events) == 0 {
			<-ready
		}
		bp := st.bufs.Get().(*[]byte)
		n, err := c.ws.Read(*bp)
		if n > 0 {
			_, err := c.up.Write((*bp)[:n])
			st.bufs.Put(bp)
			if err != nil {
				return err
			}
			continue
		}
		st.bufs.Put(bp)
		if err != nil {
			return endOfSource(c.up, err)
		}
	}
}

// copyFromSocket copies the upstream socket rc to the workspace as copyHalf does, each
// read into a pooled buffer of CopyBuffer taken only once the socket is readable: one
// read takes all the socket has queued (up to the buffer), and one write hands it to
// gVisor. Once data flows, a goroutine of its own reads ahead (one buffer queued) while
// this one writes, so the socket's reads overlap gVisor's segmentation and the link's
// writes: at most three buffers per connection, while it downloads.
func (st *Stack) copyFromSocket(c *conn, rc syscall.RawConn) error {
	bp, n, err := readSocket(rc, &st.bufs)
	if n == 0 {
		return endOfSource(c.ws, err)
	}
	type read struct {
		bp  *[]byte
		n   int
		err error
	}
	reads := make(chan read, 1)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			bp, n, err := readSocket(rc, &st.bufs)
			select {
			case reads <- read{bp, n, err}:
			case <-stop:
				if bp != nil {
					st.bufs.Put(bp)
				}
				return
			}
			if n == 0 {
				return
			}
		}
	}()
	for {
		_, err := c.ws.Write((*bp)[:n])
		st.bufs.Put(bp)
		if err != nil {
			// The reader may wait on the socket: closing the upstream ends it.
			close(stop)
			c.abort()
			<-done
			select {
			case r := <-reads:
				if r.bp != nil {
					st.bufs.Put(r.bp)
				}
			default:
			}
			return err
		}
		r := <-reads
		if r.n == 0 {
			<-done
			return endOfSource(c.ws, r.err)
		}
		bp, n = r.bp, r.n
	}
}

// endOfSource ends a copy to dst whose source ended with err: io.EOF half-closes dst.
func endOfSource(dst net.Conn, err error) error {
	if err == io.EOF {
		return halfClose(dst)
	}
	return err
}

// halfClose half-closes dst after its source ended.
func halfClose(dst net.Conn) error {
	if cw, ok := dst.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil {
			return err
		}
		return nil
	}
	return errors.New("netstack: connection cannot be half-closed")
}

// abort ends both sides at once: a RST toward the workspace, the upstream closed.
func (c *conn) abort() {
	c.once.Do(func() {
		c.ep.Abort()
		c.ws.Close()
		c.up.Close()
	})
}

// close ends both sides normally after the splice finished.
func (c *conn) close() {
	c.once.Do(func() {
		c.ws.Close()
		c.up.Close()
	})
}

// ListenTCP listens on the gateway's address at port, for a service the node offers the
// workspace: SYNs to it reach the listener, not Decide. Close the listener before the
// Stack; Close ends it in any case.
func (st *Stack) ListenTCP(port uint16) (net.Listener, error) {
	if port == 0 {
		return nil, errors.New("netstack: ListenTCP needs a port")
	}
	l, err := gonet.ListenTCP(st.s, tcpip.FullAddress{NIC: nicID, Addr: st.gw, Port: port}, st.proto)
	if err != nil {
		return nil, fmt.Errorf("netstack: listening on the gateway's TCP port %d: %w", port, err)
	}
	return l, nil
}

// ListenUDP binds the gateway's address at port, for a service the node offers the
// workspace: datagrams to it reach the returned conn (ReadFrom, WriteTo to the sender),
// datagrams to other ports are still dropped. Close the conn before the Stack.
func (st *Stack) ListenUDP(port uint16) (net.PacketConn, error) {
	if port == 0 {
		return nil, errors.New("netstack: ListenUDP needs a port")
	}
	c, err := gonet.DialUDP(st.s, &tcpip.FullAddress{NIC: nicID, Addr: st.gw, Port: port}, nil, st.proto)
	if err != nil {
		return nil, fmt.Errorf("netstack: binding the gateway's UDP port %d: %w", port, err)
	}
	return c, nil
}

// CloseWhere ends at once (a RST toward the workspace) every live connection whose path
// matches, one whose handshake is still under way included, and returns how many.
func (st *Stack) CloseWhere(match func(path any) bool) int {
	st.mu.Lock()
	var hit []*conn
	var pending []net.Conn
	n := 0
	for c := range st.conns {
		if !match(c.path) {
			continue
		}
		n++
		if c.ws == nil {
			// Its upstream ends now, the workspace's side once its handshake is done.
			c.killed = true
			pending = append(pending, c.up)
		} else {
			hit = append(hit, c)
		}
	}
	st.mu.Unlock()
	for _, up := range pending {
		up.Close()
	}
	for _, c := range hit {
		c.abort()
	}
	return n
}

// Count is the number of live connections.
func (st *Stack) Count() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.conns)
}

// Close ends every connection and every SYN being decided, waits for all of the stack's
// goroutines, and closes the stack and its link endpoint.
func (st *Stack) Close() error {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil
	}
	st.closed = true
	conns := make([]*conn, 0, len(st.conns))
	var pending []net.Conn
	for c := range st.conns {
		if c.ws == nil {
			c.killed = true
			pending = append(pending, c.up)
		} else {
			conns = append(conns, c)
		}
	}
	st.mu.Unlock()
	for _, up := range pending {
		up.Close()
	}
	st.cancel()
	for _, c := range conns {
		c.abort()
	}
	// The NIC goes first (no new packets, the link's own goroutines stopped), then the
	// endpoints: aborting them also ends the handshakes the forwarder waits on.
	st.s.RemoveNIC(nicID)
	st.s.Close()
	// A handshake whose route was found before RemoveNIC registers its endpoint only
	// after s.Close aborted the others; left alone it would wait out its SYN-ACK
	// retransmissions (1 s doubling to 60 s: ~2 min) before the handler returns. Until
	// the handlers are gone, such endpoints are aborted as they appear.
	stop := make(chan struct{})
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				for _, e := range st.s.RegisteredEndpoints() {
					e.Abort()
				}
			}
		}
	}()
	st.mu.Lock()
	for st.active > 0 {
		st.idle.Wait()
	}
	st.mu.Unlock()
	close(stop)
	<-reaped
	st.s.Wait()
	return nil
}
