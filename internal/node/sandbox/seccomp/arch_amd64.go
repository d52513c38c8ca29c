package seccomp

import "golang.org/x/sys/unix"

// nativeArch is the only AUDIT_ARCH the filter lets through: i386 calls
// (int 0x80) come with AUDIT_ARCH_I386 and get ENOSYS; x32 calls come with
// this value but numbers with bit 30 set, above lastReviewed, and get
// ENOSYS too.
const nativeArch = unix.AUDIT_ARCH_X86_64

// allowedArch are the x86-64 calls that arm64 has only in their *at or
// generic form, and arch_prctl, which Go and glibc use to set up thread
// storage.
var allowedArch = []uint32{
	unix.SYS_OPEN, unix.SYS_CREAT, unix.SYS_STAT, unix.SYS_LSTAT, unix.SYS_ACCESS,
	unix.SYS_READLINK, unix.SYS_GETDENTS, unix.SYS_MKDIR, unix.SYS_RMDIR,
	unix.SYS_MKNOD, unix.SYS_LINK, unix.SYS_UNLINK, unix.SYS_SYMLINK,
	unix.SYS_RENAME, unix.SYS_CHMOD, unix.SYS_CHOWN, unix.SYS_LCHOWN,
	unix.SYS_UTIME, unix.SYS_UTIMES, unix.SYS_FUTIMESAT, unix.SYS_DUP2,
	unix.SYS_PIPE, unix.SYS_POLL, unix.SYS_SELECT, unix.SYS_EPOLL_CREATE,
	unix.SYS_EPOLL_WAIT, unix.SYS_EVENTFD, unix.SYS_SIGNALFD,
	unix.SYS_INOTIFY_INIT, unix.SYS_FORK, unix.SYS_VFORK, unix.SYS_PAUSE,
	unix.SYS_ALARM, unix.SYS_TIME, unix.SYS_GETPGRP,
	unix.SYS_ARCH_PRCTL, unix.SYS_GET_THREAD_AREA, unix.SYS_SET_THREAD_AREA,
	// Entered only from the trampolines of uprobes the host places.
	unix.SYS_URETPROBE, unix.SYS_UPROBE,
}

// refusedArch are x86-64 calls refused with EPERM: direct I/O port access,
// the local descriptor table (16-bit code), obsolete interfaces, and
// numbers Linux reserves without implementing them.
var refusedArch = []uint32{
	unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_MODIFY_LDT,
	unix.SYS_USELIB, unix.SYS_USTAT, unix.SYS_SYSFS, unix.SYS__SYSCTL,
	unix.SYS_CREATE_MODULE, unix.SYS_GET_KERNEL_SYMS, unix.SYS_QUERY_MODULE,
	unix.SYS_AFS_SYSCALL, unix.SYS_TUXCALL, unix.SYS_SECURITY, unix.SYS_GETPMSG,
	unix.SYS_PUTPMSG, unix.SYS_VSERVER, unix.SYS_EPOLL_CTL_OLD,
	unix.SYS_EPOLL_WAIT_OLD,
}
