//go:build linux

package netattach

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// The TAP's frames carry a virtio-net header (IFF_VNET_HDR), by which the node and the
// workspace's kernel leave TCP checksums and segmentation to each other instead of doing
// them: the node's stack writes TCP segments with only the pseudo-header's sum and
// "needs checksum" (CHECKSUM_PARTIAL to the kernel, which delivers them locally without
// computing it), up to 64 KiB whatever the workspace's MSS (the kernel segments them
// when its MTU is smaller); the TAP offers the workspace checksum offload and TSO
// (TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6), whose segments then arrive in the same state
// and up to 64 KiB whatever its MTU. The stack verifies no checksum of what arrives (a
// TAP is memory to memory, and the workspace's kernel, its only writer, could as well
// send any payload with a valid checksum), and the header of an arriving frame is only
// skipped: none of its fields is acted on.

// virtioNetHdrSize is the size of struct virtio_net_hdr (linux/virtio_net.h), in
// front of every frame either way.
const virtioNetHdrSize = 10

// Fields of struct virtio_net_hdr.
const (
	virtioNetHdrFNeedsCsum = 1
	virtioNetHdrGSOTCPv4   = 1
	virtioNetHdrGSOTCPv6   = 4
)

// gsoMaxSize is the largest TCP packet the stack hands the TAP: the kernel segments
// one larger than the workspace's MSS (its MTU may be smaller than the link's).
const gsoMaxSize = 1 << 16

// frameBufSizes are the buffers one read of a frame goes into, the first ones first:
// a small frame (an ACK) takes only the first; their sum holds the largest frame
// (an Ethernet header and a 65535-byte MTU).
var frameBufSizes = []int{128, 256, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768}

// tapEndpoint is the node's side of a workspace's TAP: a gVisor link endpoint for
// Ethernet frames on the TAP's descriptor. Reads wait in Go's network poller (no thread
// blocks in the kernel for them) and hand each frame to the stack in the reading
// goroutine; each write is one writev.
type tapEndpoint struct {
	f  *os.File
	rc syscall.RawConn

	mu         sync.Mutex
	mtu        uint32
	addr       tcpip.LinkAddress
	dispatcher stack.NetworkDispatcher
	stopping   bool
	reading    sync.WaitGroup
}

var (
	_ stack.LinkEndpoint = (*tapEndpoint)(nil)
	_ stack.GSOEndpoint  = (*tapEndpoint)(nil)
)

// newTAPEndpoint takes fd, a TAP opened with IFF_VNET_HDR: the endpoint owns it from
// then on, even when it fails.
func newTAPEndpoint(fd int, mtu uint32, addr tcpip.LinkAddress) (*tapEndpoint, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// Non-blocking: the file is registered with Go's network poller.
	f := os.NewFile(uintptr(fd), "tap")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &tapEndpoint{f: f, rc: rc, mtu: mtu, addr: addr}, nil
}

// close closes the TAP's descriptor (which removes the device); call it once reading
// and writing have stopped.
func (e *tapEndpoint) close() error { return e.f.Close() }

// MTU implements stack.LinkEndpoint.
func (e *tapEndpoint) MTU() uint32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mtu
}

// SetMTU implements stack.LinkEndpoint.
func (e *tapEndpoint) SetMTU(mtu uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mtu = mtu
}

// MaxHeaderLength implements stack.LinkEndpoint: the Ethernet header (the virtio-net
// header is written apart).
func (e *tapEndpoint) MaxHeaderLength() uint16 { return header.EthernetMinimumSize }

// LinkAddress implements stack.LinkEndpoint.
func (e *tapEndpoint) LinkAddress() tcpip.LinkAddress {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addr
}

// SetLinkAddress implements stack.LinkEndpoint.
func (e *tapEndpoint) SetLinkAddress(addr tcpip.LinkAddress) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.addr = addr
}

// Capabilities implements stack.LinkEndpoint.
func (e *tapEndpoint) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityResolutionRequired | stack.CapabilityRXChecksumOffload
}

// GSOMaxSize implements stack.GSOEndpoint.
func (e *tapEndpoint) GSOMaxSize() uint32 { return gsoMaxSize }

// SupportedGSO implements stack.GSOEndpoint: the kernel takes the stack's TCP packets
// with their checksums to complete (and segments those above the MSS).
func (e *tapEndpoint) SupportedGSO() stack.SupportedGSO { return stack.HostGSOSupported }

// ARPHardwareType implements stack.LinkEndpoint.
func (e *tapEndpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareEther }

// AddHeader implements stack.LinkEndpoint.
func (e *tapEndpoint) AddHeader(pkt *stack.PacketBuffer) {
	eth := header.Ethernet(pkt.LinkHeader().Push(header.EthernetMinimumSize))
	eth.Encode(&header.EthernetFields{
		SrcAddr: pkt.EgressRoute.LocalLinkAddress,
		DstAddr: pkt.EgressRoute.RemoteLinkAddress,
		Type:    pkt.NetworkProtocolNumber,
	})
}

// ParseHeader implements stack.LinkEndpoint.
func (e *tapEndpoint) ParseHeader(pkt *stack.PacketBuffer) bool {
	hdr, ok := pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	if !ok {
		return false
	}
	pkt.NetworkProtocolNumber = header.Ethernet(hdr).Type()
	return true
}

// Close implements stack.LinkEndpoint; the descriptor is closed by Link.Close.
func (e *tapEndpoint) Close() {}

// SetOnCloseAction implements stack.LinkEndpoint.
func (e *tapEndpoint) SetOnCloseAction(func()) {}

// Attach implements stack.LinkEndpoint: it starts the reader, or (nil) tells it to
// stop without waiting for it: gVisor detaches a NIC holding the stack's lock, which
// the reader may need to deliver its last frame (a reply to it is routed), so the
// wait is Wait's, which gVisor and Link.Close call without that lock.
func (e *tapEndpoint) Attach(d stack.NetworkDispatcher) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if d == nil {
		if e.dispatcher != nil && !e.stopping {
			e.stopping = true
			// A read waiting in the poller returns at once.
			_ = e.f.SetReadDeadline(time.Unix(1, 0))
		}
		return
	}
	if e.dispatcher != nil || e.stopping {
		return
	}
	e.dispatcher = d
	e.reading.Add(1)
	go e.read(d)
}

// IsAttached implements stack.LinkEndpoint.
func (e *tapEndpoint) IsAttached() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.dispatcher != nil && !e.stopping
}

// Wait implements stack.LinkEndpoint: it returns once the reader has ended.
func (e *tapEndpoint) Wait() { e.reading.Wait() }

// read hands the TAP's frames to d until the reader is stopped or the TAP fails (the
// workspace deleted it): any error but EAGAIN ends it, and the endpoint is detached.
func (e *tapEndpoint) read(d stack.NetworkDispatcher) {
	defer e.reading.Done()
	defer e.detached()
	var b frameBuffer
	b.init()
	defer b.release()
	for {
		var (
			n     int
			errno syscall.Errno
		)
		iov := b.iovecs()
		err := e.rc.Read(func(fd uintptr) bool {
			for {
				r, _, en := unix.RawSyscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
				if en == unix.EINTR {
					continue
				}
				n, errno = int(r), en
				return en != unix.EAGAIN
			}
		})
		if err != nil || errno != 0 || n <= virtioNetHdrSize {
			if err == nil && errno == 0 && n > 0 {
				continue // a frame shorter than its header
			}
			return
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: b.pull(n - virtioNetHdrSize)})
		if e.accept(pkt) {
			d.DeliverNetworkPacket(pkt.NetworkProtocolNumber, pkt)
		}
		pkt.DecRef()
	}
}

// detached records that the reader has ended: nothing is attached, and a stop's read
// deadline is lifted for the next reader.
func (e *tapEndpoint) detached() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopping {
		_ = e.f.SetReadDeadline(time.Time{})
	}
	e.dispatcher, e.stopping = nil, false
}

// accept parses pkt's Ethernet header: a frame to the node's address or to a group
// (broadcast: ARP) is taken.
func (e *tapEndpoint) accept(pkt *stack.PacketBuffer) bool {
	hdr, ok := pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	if !ok {
		return false
	}
	eth := header.Ethernet(hdr)
	pkt.NetworkProtocolNumber = eth.Type()
	dst := eth.DestinationAddress()
	return dst == e.LinkAddress() || dst[0]&1 == 1
}

// WritePackets implements stack.LinkWriter: each packet is one writev of its
// virtio-net header and its frame. A failure drops the packet and those after it.
func (e *tapEndpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	for i, pkt := range pkts.AsSlice() {
		if err := e.write(pkt); err != nil {
			return i, err
		}
	}
	return pkts.Len(), nil
}

func (e *tapEndpoint) write(pkt *stack.PacketBuffer) tcpip.Error {
	var vh [virtioNetHdrSize]byte
	if gso := pkt.GSOOptions; gso.Type != stack.GSONone {
		hdrLen := uint16(pkt.HeaderSize())
		var flags, gsoType uint8
		var gsoSize, csumStart, csumOffset uint16
		if gso.NeedsCsum {
			flags = virtioNetHdrFNeedsCsum
			csumStart = header.EthernetMinimumSize + gso.L3HdrLen
			csumOffset = gso.CsumOffset
		}
		if uint16(pkt.Data().Size()) > gso.MSS {
			switch gso.Type {
			case stack.GSOTCPv4:
				gsoType = virtioNetHdrGSOTCPv4
			case stack.GSOTCPv6:
				gsoType = virtioNetHdrGSOTCPv6
			default:
				return &tcpip.ErrNotSupported{}
			}
			gsoSize = gso.MSS
		}
		// Little-endian (the TAP's, on the architectures the node runs on).
		vh = [virtioNetHdrSize]byte{flags, gsoType, byte(hdrLen), byte(hdrLen >> 8), byte(gsoSize), byte(gsoSize >> 8),
			byte(csumStart), byte(csumStart >> 8), byte(csumOffset), byte(csumOffset >> 8)}
	}
	views := pkt.AsSlices()
	var arr [8]unix.Iovec
	iov := arr[:0]
	if len(views)+1 > len(arr) {
		iov = make([]unix.Iovec, 0, len(views)+1)
	}
	iov = appendIovec(iov, vh[:])
	for _, v := range views {
		iov = appendIovec(iov, v)
	}
	var errno syscall.Errno
	if err := e.rc.Write(func(fd uintptr) bool {
		_, _, errno = unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		return true
	}); err != nil {
		return &tcpip.ErrClosedForSend{}
	}
	if errno != 0 {
		return tcpip.TranslateErrno(errno)
	}
	return nil
}

func appendIovec(iov []unix.Iovec, b []byte) []unix.Iovec {
	if len(b) == 0 {
		return iov
	}
	v := unix.Iovec{Base: &b[0]}
	v.SetLen(len(b))
	return append(iov, v)
}

// frameBuffer is where the reader reads frames: the virtio-net header apart, then
// pooled views of frameBufSizes; the views a frame fills are handed to its packet and
// replaced before the next read.
type frameBuffer struct {
	hdr   [virtioNetHdrSize]byte
	views []*buffer.View
	iov   []unix.Iovec
}

func (b *frameBuffer) init() {
	b.views = make([]*buffer.View, len(frameBufSizes))
	b.iov = make([]unix.Iovec, len(frameBufSizes)+1)
	b.iov[0] = unix.Iovec{Base: &b.hdr[0]}
	b.iov[0].SetLen(virtioNetHdrSize)
}

// iovecs are the buffers of the next read, views replaced where taken.
func (b *frameBuffer) iovecs() []unix.Iovec {
	for i, v := range b.views {
		if v != nil {
			// The views are taken from the front.
			break
		}
		v = buffer.NewViewSize(frameBufSizes[i])
		b.views[i] = v
		b.iov[i+1] = unix.Iovec{Base: v.BasePtr()}
		b.iov[i+1].SetLen(v.Size())
	}
	return b.iov
}

// pull takes the views holding the n bytes of a frame read.
func (b *frameBuffer) pull(n int) buffer.Buffer {
	var out buffer.Buffer
	for i, v := range b.views {
		if n <= 0 {
			break
		}
		if v.Size() > n {
			v.CapLength(n)
		}
		n -= v.Size()
		out.Append(v)
		b.views[i] = nil
	}
	return out
}

func (b *frameBuffer) release() {
	for i, v := range b.views {
		if v != nil {
			v.Release()
			b.views[i] = nil
		}
	}
}

// openTAPFlags are the flags of the workspace's TAP.
const openTAPFlags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_TUN_EXCL

// setVnetHdr sets up the TAP's virtio-net header: its size, and the offloads offered to
// the workspace's kernel (checksums, TCP segmentation). Its errors do not wrap the errno (the caller takes some
// errnos of TUNSETIFF to mean an eth0 of the workspace's own).
func setVnetHdr(fd int) error {
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, virtioNetHdrSize); err != nil {
		return fmt.Errorf("TUNSETVNETHDRSZ: %v", err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6); err != nil {
		return fmt.Errorf("TUNSETOFFLOAD: %v", err)
	}
	return nil
}
