package seccomp

import "golang.org/x/sys/unix"

const (
	nativeArch = unix.AUDIT_ARCH_AARCH64
	x32Mask    = 0
)

var deniedArch []uint32
