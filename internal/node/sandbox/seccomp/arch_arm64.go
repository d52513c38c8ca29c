package seccomp

import "golang.org/x/sys/unix"

// nativeArch is the only AUDIT_ARCH the filter lets through: 32-bit ARM
// calls come with AUDIT_ARCH_ARM and get ENOSYS.
const nativeArch = unix.AUDIT_ARCH_AARCH64

// arm64 has only the generic table.
var allowedArch []uint32

// refusedArch: 244 is where the architecture-specific calls would start;
// arm64 has none.
var refusedArch = []uint32{unix.SYS_ARCH_SPECIFIC_SYSCALL}
