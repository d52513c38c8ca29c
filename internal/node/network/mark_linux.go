package network

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// markControl sets SO_MARK on a socket before it connects.
func markControl(mark uint32) func(network, address string, rc syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		}); err != nil {
			return err
		}
		if serr != nil {
			return &net.OpError{Op: "setsockopt SO_MARK", Err: serr}
		}
		return nil
	}
}
