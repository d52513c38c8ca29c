package seccomp

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// The policy, modelled on the default profile of Docker and containerd
// (moby/profiles seccomp/default.json) for a process without
// CAP_SYS_ADMIN, CAP_SYS_PTRACE and the other capabilities the init shim
// drops, and tighter than it where a workspace has no use for a surface:
// ptrace and the other calls that reach into another process, the NUMA
// policy calls, adjtimex, modify_ldt, listns, and sockets other than
// unix, IP (not raw) and routing netlink.
//
// Every system call number up to lastReviewed that golang.org/x/sys knows
// is in exactly one of allowed, refused, conditional or noSys (a test
// checks this against x/sys's table); a number in none of them is not a
// system call of this kernel ABI as far as the policy knows, and gets
// ENOSYS, as does every number above lastReviewed.

// lastReviewed is the highest system call number whose call the policy has
// decided on (the same number on amd64 and arm64, whose tables share the
// numbers from 424 on). Calls that newer kernels add above it get ENOSYS,
// which C libraries take for "not in this kernel" and answer with their
// fallback, until someone classifies them here and raises lastReviewed.
const lastReviewed = unix.SYS_RSEQ_SLICE_YIELD

// allowed are allowed whatever their arguments (see allowedArch for the
// calls only some architectures have).
var allowed = append([]uint32{
	// Files, directories, descriptors.
	unix.SYS_READ, unix.SYS_WRITE, unix.SYS_READV, unix.SYS_WRITEV,
	unix.SYS_PREAD64, unix.SYS_PWRITE64, unix.SYS_PREADV, unix.SYS_PWRITEV,
	unix.SYS_PREADV2, unix.SYS_PWRITEV2, unix.SYS_LSEEK,
	unix.SYS_OPENAT, unix.SYS_OPENAT2, unix.SYS_CLOSE, unix.SYS_CLOSE_RANGE,
	unix.SYS_DUP, unix.SYS_DUP3, unix.SYS_FCNTL, unix.SYS_IOCTL, unix.SYS_FLOCK,
	unix.SYS_FSYNC, unix.SYS_FDATASYNC, unix.SYS_SYNC, unix.SYS_SYNCFS,
	unix.SYS_SYNC_FILE_RANGE, unix.SYS_FALLOCATE, unix.SYS_FTRUNCATE,
	unix.SYS_TRUNCATE, unix.SYS_FADVISE64, unix.SYS_READAHEAD,
	unix.SYS_COPY_FILE_RANGE, unix.SYS_SENDFILE, unix.SYS_SPLICE, unix.SYS_TEE,
	unix.SYS_VMSPLICE, unix.SYS_CACHESTAT,
	unix.SYS_FSTAT, unix.SYS_NEWFSTATAT, unix.SYS_STATX, unix.SYS_STATFS,
	unix.SYS_FSTATFS, unix.SYS_FACCESSAT, unix.SYS_FACCESSAT2,
	unix.SYS_READLINKAT, unix.SYS_GETDENTS64, unix.SYS_GETCWD, unix.SYS_CHDIR,
	unix.SYS_FCHDIR, unix.SYS_CHROOT, // CAP_SYS_CHROOT is kept
	unix.SYS_MKDIRAT, unix.SYS_MKNODAT, // fifos and sockets; devices need the dropped CAP_MKNOD
	unix.SYS_UNLINKAT, unix.SYS_RENAMEAT, unix.SYS_RENAMEAT2, unix.SYS_LINKAT,
	unix.SYS_SYMLINKAT, unix.SYS_FCHMOD, unix.SYS_FCHMODAT, unix.SYS_FCHMODAT2,
	unix.SYS_FCHOWN, unix.SYS_FCHOWNAT, unix.SYS_UTIMENSAT, unix.SYS_UMASK,
	unix.SYS_NAME_TO_HANDLE_AT, // the handle's way back, open_by_handle_at, is refused
	unix.SYS_GETXATTR, unix.SYS_LGETXATTR, unix.SYS_FGETXATTR,
	unix.SYS_LISTXATTR, unix.SYS_LLISTXATTR, unix.SYS_FLISTXATTR,
	unix.SYS_SETXATTR, unix.SYS_LSETXATTR, unix.SYS_FSETXATTR,
	unix.SYS_REMOVEXATTR, unix.SYS_LREMOVEXATTR, unix.SYS_FREMOVEXATTR,
	unix.SYS_GETXATTRAT, unix.SYS_SETXATTRAT, unix.SYS_LISTXATTRAT,
	unix.SYS_REMOVEXATTRAT, unix.SYS_FILE_GETATTR, unix.SYS_FILE_SETATTR,
	unix.SYS_STATMOUNT, unix.SYS_LISTMOUNT, // read-only, of its own mount namespace
	unix.SYS_INOTIFY_INIT1, unix.SYS_INOTIFY_ADD_WATCH, unix.SYS_INOTIFY_RM_WATCH,
	unix.SYS_FANOTIFY_MARK, // useless without fanotify_init
	unix.SYS_EPOLL_CREATE1, unix.SYS_EPOLL_CTL, unix.SYS_EPOLL_PWAIT,
	unix.SYS_EPOLL_PWAIT2, unix.SYS_PPOLL, unix.SYS_PSELECT6, unix.SYS_EVENTFD2,
	unix.SYS_SIGNALFD4, unix.SYS_TIMERFD_CREATE, unix.SYS_TIMERFD_SETTIME,
	unix.SYS_TIMERFD_GETTIME, unix.SYS_PIPE2,
	unix.SYS_IO_SETUP, unix.SYS_IO_DESTROY, unix.SYS_IO_SUBMIT, unix.SYS_IO_CANCEL,
	unix.SYS_IO_GETEVENTS, unix.SYS_IO_PGETEVENTS,

	// Memory.
	unix.SYS_BRK, unix.SYS_MMAP, unix.SYS_MUNMAP, unix.SYS_MREMAP,
	unix.SYS_MPROTECT, unix.SYS_MADVISE, unix.SYS_MINCORE, unix.SYS_MSYNC,
	unix.SYS_MLOCK, unix.SYS_MLOCK2, unix.SYS_MLOCKALL, unix.SYS_MUNLOCK,
	unix.SYS_MUNLOCKALL, unix.SYS_REMAP_FILE_PAGES, unix.SYS_MEMFD_CREATE,
	unix.SYS_MEMFD_SECRET, unix.SYS_MEMBARRIER, unix.SYS_PKEY_ALLOC,
	unix.SYS_PKEY_FREE, unix.SYS_PKEY_MPROTECT, unix.SYS_MSEAL,
	unix.SYS_MAP_SHADOW_STACK,

	// Processes, threads, scheduling, limits.
	unix.SYS_EXECVE, unix.SYS_EXECVEAT, unix.SYS_EXIT, unix.SYS_EXIT_GROUP,
	unix.SYS_WAIT4, unix.SYS_WAITID, unix.SYS_KILL, unix.SYS_TKILL, unix.SYS_TGKILL,
	unix.SYS_GETPID, unix.SYS_GETPPID, unix.SYS_GETTID, unix.SYS_GETPGID,
	unix.SYS_SETPGID, unix.SYS_GETSID, unix.SYS_SETSID,
	unix.SYS_SET_TID_ADDRESS, unix.SYS_SET_ROBUST_LIST, unix.SYS_GET_ROBUST_LIST,
	unix.SYS_RSEQ, unix.SYS_RSEQ_SLICE_YIELD, unix.SYS_RESTART_SYSCALL,
	unix.SYS_PRCTL, unix.SYS_SECCOMP, // a process may only add filters
	unix.SYS_LANDLOCK_CREATE_RULESET, unix.SYS_LANDLOCK_ADD_RULE,
	unix.SYS_LANDLOCK_RESTRICT_SELF,
	unix.SYS_PIDFD_OPEN, unix.SYS_PIDFD_SEND_SIGNAL, // Go's os/exec uses them
	unix.SYS_PROCESS_MRELEASE, // frees the memory of a process already killed
	unix.SYS_GETRUSAGE, unix.SYS_GETRLIMIT, unix.SYS_SETRLIMIT, unix.SYS_PRLIMIT64,
	unix.SYS_GETPRIORITY, unix.SYS_SETPRIORITY, unix.SYS_IOPRIO_GET,
	unix.SYS_IOPRIO_SET, unix.SYS_SCHED_YIELD, unix.SYS_SCHED_GETAFFINITY,
	unix.SYS_SCHED_SETAFFINITY, unix.SYS_SCHED_GETPARAM, unix.SYS_SCHED_SETPARAM,
	unix.SYS_SCHED_GETSCHEDULER, unix.SYS_SCHED_SETSCHEDULER,
	unix.SYS_SCHED_GET_PRIORITY_MAX, unix.SYS_SCHED_GET_PRIORITY_MIN,
	unix.SYS_SCHED_RR_GET_INTERVAL, unix.SYS_SCHED_GETATTR, unix.SYS_SCHED_SETATTR,
	unix.SYS_GETCPU, unix.SYS_TIMES, unix.SYS_SYSINFO, unix.SYS_UNAME,
	unix.SYS_GETRANDOM,
	unix.SYS_CAPGET, unix.SYS_CAPSET, // within the bounding set only
	unix.SYS_GETUID, unix.SYS_GETEUID, unix.SYS_GETGID, unix.SYS_GETEGID,
	unix.SYS_GETRESUID, unix.SYS_GETRESGID, unix.SYS_GETGROUPS,
	unix.SYS_SETUID, unix.SYS_SETGID, unix.SYS_SETREUID, unix.SYS_SETREGID,
	unix.SYS_SETRESUID, unix.SYS_SETRESGID, unix.SYS_SETFSUID, unix.SYS_SETFSGID,
	unix.SYS_SETGROUPS,

	// Signals, time, futexes.
	unix.SYS_RT_SIGACTION, unix.SYS_RT_SIGPROCMASK, unix.SYS_RT_SIGRETURN,
	unix.SYS_RT_SIGPENDING, unix.SYS_RT_SIGSUSPEND, unix.SYS_RT_SIGTIMEDWAIT,
	unix.SYS_RT_SIGQUEUEINFO, unix.SYS_RT_TGSIGQUEUEINFO, unix.SYS_SIGALTSTACK,
	unix.SYS_NANOSLEEP, unix.SYS_CLOCK_NANOSLEEP, unix.SYS_CLOCK_GETTIME,
	unix.SYS_CLOCK_GETRES, unix.SYS_GETTIMEOFDAY, unix.SYS_GETITIMER,
	unix.SYS_SETITIMER, unix.SYS_TIMER_CREATE, unix.SYS_TIMER_SETTIME,
	unix.SYS_TIMER_GETTIME, unix.SYS_TIMER_GETOVERRUN, unix.SYS_TIMER_DELETE,
	unix.SYS_FUTEX, unix.SYS_FUTEX_WAITV, unix.SYS_FUTEX_WAKE, unix.SYS_FUTEX_WAIT,
	unix.SYS_FUTEX_REQUEUE,

	// System V and POSIX IPC (the workspace has its own IPC namespace).
	unix.SYS_MSGGET, unix.SYS_MSGSND, unix.SYS_MSGRCV, unix.SYS_MSGCTL,
	unix.SYS_SEMGET, unix.SYS_SEMOP, unix.SYS_SEMTIMEDOP, unix.SYS_SEMCTL,
	unix.SYS_SHMGET, unix.SYS_SHMAT, unix.SYS_SHMDT, unix.SYS_SHMCTL,
	unix.SYS_MQ_OPEN, unix.SYS_MQ_UNLINK, unix.SYS_MQ_TIMEDSEND,
	unix.SYS_MQ_TIMEDRECEIVE, unix.SYS_MQ_NOTIFY, unix.SYS_MQ_GETSETATTR,

	// Sockets already open (socket and socketpair are conditional).
	unix.SYS_BIND, unix.SYS_CONNECT, unix.SYS_LISTEN, unix.SYS_ACCEPT,
	unix.SYS_ACCEPT4, unix.SYS_GETSOCKNAME, unix.SYS_GETPEERNAME,
	unix.SYS_SENDTO, unix.SYS_RECVFROM, unix.SYS_SENDMSG, unix.SYS_RECVMSG,
	unix.SYS_SENDMMSG, unix.SYS_RECVMMSG, unix.SYS_SHUTDOWN,
	unix.SYS_SETSOCKOPT, unix.SYS_GETSOCKOPT,
}, allowedArch...)

// refused fail with EPERM (see refusedArch for the calls only some
// architectures have).
var refused = append([]uint32{
	// The kernel itself: modules, kexec, reboot.
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD, unix.SYS_REBOOT,
	// Large kernel surfaces no workspace needs, each with a history of
	// privilege escalations.
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_KEYCTL, // not namespaced
	unix.SYS_FANOTIFY_INIT,
	unix.SYS_LSM_GET_SELF_ATTR, unix.SYS_LSM_SET_SELF_ATTR, unix.SYS_LSM_LIST_MODULES,
	// Mounts and namespaces: the init shim has set them up for good.
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT,
	unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK,
	unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE, unix.SYS_OPEN_TREE_ATTR,
	unix.SYS_MOUNT_SETATTR, unix.SYS_SETNS, unix.SYS_LISTNS,
	unix.SYS_OPEN_BY_HANDLE_AT, // opens any file of a filesystem by its handle
	// Other processes' memory and descriptors.
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV,
	unix.SYS_KCMP, unix.SYS_PIDFD_GETFD, unix.SYS_PROCESS_MADVISE,
	// Host-wide state: swap, accounting, quotas, the kernel log, names,
	// terminals, clocks.
	unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_ACCT, unix.SYS_QUOTACTL,
	unix.SYS_QUOTACTL_FD, unix.SYS_SYSLOG, unix.SYS_SETHOSTNAME,
	unix.SYS_SETDOMAINNAME, unix.SYS_VHANGUP,
	unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME,
	unix.SYS_ADJTIMEX,
	// NUMA placement: the host's memory layout.
	unix.SYS_MBIND, unix.SYS_SET_MEMPOLICY, unix.SYS_GET_MEMPOLICY,
	unix.SYS_SET_MEMPOLICY_HOME_NODE, unix.SYS_MIGRATE_PAGES, unix.SYS_MOVE_PAGES,
	// Gone from Linux.
	unix.SYS_NFSSERVCTL, unix.SYS_LOOKUP_DCOOKIE,
}, refusedArch...)

// noSys fail with ENOSYS, as if the kernel did not have them. clone3
// passes its flags in memory, out of reach of a filter; C libraries answer
// ENOSYS by falling back to clone, whose flags are checked.
var noSys = []uint32{unix.SYS_CLONE3}

// A rule is the verdict on one system call number.
type rule uint8

const (
	ruleNoSys rule = iota // not a call the policy knows: ENOSYS
	ruleAllow
	ruleEPERM
	// The conditional rules look at the arguments.
	ruleClone
	ruleUnshare
	rulePersonality
	ruleSocket
	ruleSocketpair
)

// conditional are allowed with some arguments only (see Program).
var conditional = map[uint32]rule{
	unix.SYS_CLONE:       ruleClone,
	unix.SYS_UNSHARE:     ruleUnshare,
	unix.SYS_PERSONALITY: rulePersonality,
	unix.SYS_SOCKET:      ruleSocket,
	unix.SYS_SOCKETPAIR:  ruleSocketpair,
}

// Arguments of the conditional rules.
const (
	// namespaceFlags create namespaces in clone and unshare. CLONE_NEWTIME
	// is a namespace flag of unshare only: in clone's first argument the
	// same bit belongs to the exit signal.
	namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
		unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

	// Personalities (linux/personality.h) that change nothing but what
	// uname reports: PER_LINUX, PER_LINUX32, UNAME26 and their union, and
	// 0xffffffff, which only reads the current one. Others, such as
	// ADDR_NO_RANDOMIZE or READ_IMPLIES_EXEC, weaken the process's own
	// defences and are refused.
	perLinux         = 0x0000
	perLinux32       = 0x0008
	perUname26       = 0x20000
	personalityQuery = 0xffffffff

	// sockTypeMask keeps the type of socket(2)'s second argument, as the
	// kernel does: the bits above are SOCK_NONBLOCK and SOCK_CLOEXEC, or
	// make the call fail with EINVAL.
	sockTypeMask = 0xf
)

// policy returns the rule of every number from 0 to lastReviewed. It
// panics if a number is in two lists.
func policy() []rule {
	t := make([]rule, lastReviewed+1)
	seen := make([]bool, lastReviewed+1)
	set := func(nr uint32, r rule) {
		if seen[nr] {
			panic(fmt.Sprintf("seccomp: system call %d is in two lists", nr))
		}
		seen[nr] = true
		t[nr] = r
	}
	for _, nr := range allowed {
		set(nr, ruleAllow)
	}
	for _, nr := range refused {
		set(nr, ruleEPERM)
	}
	for _, nr := range noSys {
		set(nr, ruleNoSys)
	}
	for nr, r := range conditional {
		set(nr, r)
	}
	return t
}
