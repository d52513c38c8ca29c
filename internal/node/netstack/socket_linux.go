package netstack

import (
	"io"
	"net"
	"os"
	"syscall"
)

// rawConn is the socket of an upstream that is a plain one (a direct connection, a
// SOCKS5 Egress without TLS), whose readability can be waited on without reading; nil
// for any other (TLS keeps decrypted data of its own).
func rawConn(c net.Conn) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// readSocket waits until the socket rc is readable, then reads what it holds into a
// buffer of pool, which the caller gives back. It returns a buffer only with n > 0; the
// socket's end is io.EOF.
func readSocket(rc syscall.RawConn, pool bufPool) (*[]byte, int, error) {
	var (
		bp   *[]byte
		n    int
		rerr error
	)
	err := rc.Read(func(fd uintptr) bool {
		// No buffer is held while waiting: an idle connection holds none.
		b := pool.Get().(*[]byte)
		for {
			n, rerr = syscall.Read(int(fd), *b)
			if rerr != syscall.EINTR {
				break
			}
		}
		if rerr == syscall.EAGAIN {
			pool.Put(b)
			return false
		}
		bp = b
		return true
	})
	switch {
	case err != nil:
		if bp != nil {
			pool.Put(bp)
		}
		return nil, 0, err
	case rerr != nil:
		pool.Put(bp)
		return nil, 0, os.NewSyscallError("read", rerr)
	case n == 0:
		pool.Put(bp)
		return nil, 0, io.EOF
	}
	return bp, n, nil
}
