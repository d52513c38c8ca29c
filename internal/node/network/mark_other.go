//go:build !linux

package network

import (
	"errors"
	"syscall"
)

// markControl refuses: SO_MARK is Linux's.
func markControl(uint32) func(network, address string, rc syscall.RawConn) error {
	return func(string, string, syscall.RawConn) error {
		return errors.New("network: SO_MARK needs Linux")
	}
}
