package seccomp

import "golang.org/x/sys/unix"

const (
	nativeArch = unix.AUDIT_ARCH_X86_64
	// x32Mask: x32 system call numbers have this bit set, with the
	// x86_64 arch value; they are refused as a foreign ABI.
	x32Mask = 0x40000000
)

var deniedArch = []uint32{
	unix.SYS_USELIB, unix.SYS_USTAT, unix.SYS_SYSFS, unix.SYS__SYSCTL,
	unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_MODIFY_LDT,
	unix.SYS_CREATE_MODULE, unix.SYS_GET_KERNEL_SYMS, unix.SYS_QUERY_MODULE,
}
