// Package seccomp builds and installs the system call filter of workspace
// processes: a deny-list, on top of the capabilities the init shim drops,
// of the calls container runtimes refuse by default because they reach
// kernel surfaces no workspace needs (module and kexec loading, bpf,
// perf_event_open, userfaultfd, io_uring, the kernel keyring, the mount
// API, swap, accounting, clocks) and of new user namespaces (clone and
// unshare with CLONE_NEWUSER), which would hand a workspace process
// capabilities inside a namespace of its own.
//
// Denied calls fail with EPERM. Calls of another ABI than the binary's own
// (i386 through int 0x80 on amd64, and x32) fail with ENOSYS, so that no
// second syscall table bypasses the list; clone3 fails with ENOSYS too (its
// flags are out of reach of a filter), which C libraries answer by falling
// back to clone.
//
// The filter is assembled here from x/sys/unix constants rather than with a
// library: libseccomp needs cgo (our binaries are static), and the pure-Go
// assemblers we looked at let foreign-ABI calls through a deny-list.
package seccomp

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccomp_data offsets (linux/seccomp.h): nr, arch, instruction_pointer,
// args[6]; args[0]'s low 32 bits on little-endian machines.
const (
	offNr    = 0
	offArch  = 4
	offArg0  = 16
	retAllow = unix.SECCOMP_RET_ALLOW
	retEPERM = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retNoSys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// denied are refused with EPERM (see deniedArch for the calls only some
// architectures have).
var denied = append([]uint32{
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_OPEN_BY_HANDLE_AT,
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT,
	unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK,
	unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE, unix.SYS_MOUNT_SETATTR,
	unix.SYS_SETNS,
	unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_SYSLOG, unix.SYS_ACCT,
	unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD, unix.SYS_LOOKUP_DCOOKIE,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_CLOCK_ADJTIME, unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME,
	unix.SYS_VHANGUP, unix.SYS_NFSSERVCTL,
}, deniedArch...)

// Program returns the filter as BPF instructions.
func Program() []unix.SockFilter {
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	var p []unix.SockFilter
	// Jumps are relative and forward; the three verdicts at the end are
	// reached through these placeholders, resolved below.
	type fix struct {
		at     int
		target string
		onTrue bool
	}
	var fixes []fix
	jeq := func(k uint32, target string) {
		fixes = append(fixes, fix{len(p), target, true})
		p = append(p, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: k})
	}

	p = append(p, stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArch))
	fixes = append(fixes, fix{len(p), "nosys", false})
	p = append(p, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: nativeArch})
	p = append(p, stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr))
	if x32Mask != 0 {
		fixes = append(fixes, fix{len(p), "nosys", true})
		p = append(p, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, K: x32Mask})
	}
	for _, nr := range denied {
		jeq(nr, "eperm")
	}
	jeq(unix.SYS_CLONE3, "nosys")
	jeq(unix.SYS_CLONE, "flags")
	jeq(unix.SYS_UNSHARE, "flags")
	p = append(p, stmt(unix.BPF_RET|unix.BPF_K, retAllow))
	labels := map[string]int{"flags": len(p)}
	p = append(p, stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0))
	fixes = append(fixes, fix{len(p), "eperm", true})
	p = append(p, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, K: unix.CLONE_NEWUSER})
	p = append(p, stmt(unix.BPF_RET|unix.BPF_K, retAllow))
	labels["eperm"] = len(p)
	p = append(p, stmt(unix.BPF_RET|unix.BPF_K, retEPERM))
	labels["nosys"] = len(p)
	p = append(p, stmt(unix.BPF_RET|unix.BPF_K, retNoSys))

	for _, f := range fixes {
		off := labels[f.target] - f.at - 1
		if off < 0 || off > 255 {
			panic(fmt.Sprintf("seccomp: jump of %d instructions", off))
		}
		if f.onTrue {
			p[f.at].Jt = uint8(off)
		} else {
			p[f.at].Jf = uint8(off)
		}
	}
	return p
}

// Install loads the filter into every thread of the calling process
// (SECCOMP_FILTER_FLAG_TSYNC); it stays across execve and is inherited by
// every child. The caller needs CAP_SYS_ADMIN or no_new_privs.
func Install() error {
	prog := Program()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("seccomp: install filter: %w", errno)
	}
	return nil
}
