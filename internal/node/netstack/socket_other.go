//go:build !linux

package netstack

import (
	"net"
	"syscall"
)

// rawConn: only Linux reads upstream sockets directly.
func rawConn(net.Conn) syscall.RawConn { return nil }

func readSocket(syscall.RawConn, bufPool) (*[]byte, int, error) {
	panic("netstack: readSocket without rawConn")
}
