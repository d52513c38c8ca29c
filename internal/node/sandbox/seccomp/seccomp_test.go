package seccomp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// vm is the filter loaded in x/net/bpf's VM.
func vm(t *testing.T) *bpf.VM {
	t.Helper()
	var raw []bpf.RawInstruction
	for _, f := range Program() {
		raw = append(raw, bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K})
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("the program does not disassemble")
	}
	v, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatalf("NewVM: %v", err)
	}
	return v
}

// verdict evaluates the filter on one seccomp_data. The VM's verdict is
// the number of bytes to keep, capped at the packet's length: a packet
// larger than every SECCOMP_RET_ERRNO verdict returns those unchanged, and
// allow as the packet's length, which verdict turns back into retAllow.
func verdict(t *testing.T, v *bpf.VM, arch, nr uint32, args ...uint64) uint32 {
	t.Helper()
	const size = 1 << 20
	data := make([]byte, size)
	// The VM loads words big-endian (network order) where the kernel loads
	// seccomp_data in the machine's order: each 32-bit field is written so
	// that the VM reads the value the kernel would.
	binary.BigEndian.PutUint32(data[offNr:], nr)
	binary.BigEndian.PutUint32(data[offArch:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[offArg0+8*i:], uint32(a))
	}
	n, err := v.Run(data)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n == size {
		return retAllow
	}
	return uint32(n)
}

func verdictName(v uint32) string {
	switch v {
	case retAllow:
		return "allow"
	case retEPERM:
		return "EPERM"
	case retNoSys:
		return "ENOSYS"
	case retEAFNOSUPPORT:
		return "EAFNOSUPPORT"
	case retEPROTONOSUPPORT:
		return "EPROTONOSUPPORT"
	}
	return "0x" + strconv.FormatUint(uint64(v), 16)
}

type verdictCase struct {
	name string
	arch uint32
	nr   uint32
	args []uint64
	want uint32
}

// Constants the tables need that x/sys/unix lacks.
const (
	addrNoRandomize = 0x0040000 // personality(2)
	readImpliesExec = 0x0400000
	sockDCCP        = 6
	sockPacket      = 10
)

func TestVerdicts(t *testing.T) {
	ns := []struct {
		name string
		flag uint64
	}{
		{"user", unix.CLONE_NEWUSER}, {"mount", unix.CLONE_NEWNS}, {"pid", unix.CLONE_NEWPID},
		{"net", unix.CLONE_NEWNET}, {"uts", unix.CLONE_NEWUTS}, {"ipc", unix.CLONE_NEWIPC},
		{"cgroup", unix.CLONE_NEWCGROUP},
	}
	cases := []verdictCase{
		// Allowed whatever the arguments.
		{"read", nativeArch, unix.SYS_READ, nil, retAllow},
		{"getpid", nativeArch, unix.SYS_GETPID, nil, retAllow},
		{"openat", nativeArch, unix.SYS_OPENAT, nil, retAllow},
		{"execve", nativeArch, unix.SYS_EXECVE, nil, retAllow},
		{"futex", nativeArch, unix.SYS_FUTEX, nil, retAllow},
		{"pidfd_open", nativeArch, unix.SYS_PIDFD_OPEN, nil, retAllow},
		{"pidfd_send_signal", nativeArch, unix.SYS_PIDFD_SEND_SIGNAL, nil, retAllow},
		{"waitid", nativeArch, unix.SYS_WAITID, nil, retAllow},
		{"rseq", nativeArch, unix.SYS_RSEQ, nil, retAllow},
		{"mknodat", nativeArch, unix.SYS_MKNODAT, nil, retAllow},
		{"chroot", nativeArch, unix.SYS_CHROOT, nil, retAllow},
		{"syncfs", nativeArch, unix.SYS_SYNCFS, nil, retAllow},
		{"faccessat2", nativeArch, unix.SYS_FACCESSAT2, nil, retAllow},
		{"seccomp", nativeArch, unix.SYS_SECCOMP, nil, retAllow},
		{"rseq_slice_yield (lastReviewed)", nativeArch, unix.SYS_RSEQ_SLICE_YIELD, nil, retAllow},

		// Refused.
		{"ptrace", nativeArch, unix.SYS_PTRACE, nil, retEPERM},
		{"process_vm_readv", nativeArch, unix.SYS_PROCESS_VM_READV, nil, retEPERM},
		{"process_vm_writev", nativeArch, unix.SYS_PROCESS_VM_WRITEV, nil, retEPERM},
		{"kcmp", nativeArch, unix.SYS_KCMP, nil, retEPERM},
		{"pidfd_getfd", nativeArch, unix.SYS_PIDFD_GETFD, nil, retEPERM},
		{"process_madvise", nativeArch, unix.SYS_PROCESS_MADVISE, nil, retEPERM},
		{"bpf", nativeArch, unix.SYS_BPF, nil, retEPERM},
		{"perf_event_open", nativeArch, unix.SYS_PERF_EVENT_OPEN, nil, retEPERM},
		{"userfaultfd", nativeArch, unix.SYS_USERFAULTFD, nil, retEPERM},
		{"io_uring_setup", nativeArch, unix.SYS_IO_URING_SETUP, nil, retEPERM},
		{"io_uring_enter", nativeArch, unix.SYS_IO_URING_ENTER, nil, retEPERM},
		{"keyctl", nativeArch, unix.SYS_KEYCTL, nil, retEPERM},
		{"add_key", nativeArch, unix.SYS_ADD_KEY, nil, retEPERM},
		{"init_module", nativeArch, unix.SYS_INIT_MODULE, nil, retEPERM},
		{"finit_module", nativeArch, unix.SYS_FINIT_MODULE, nil, retEPERM},
		{"kexec_load", nativeArch, unix.SYS_KEXEC_LOAD, nil, retEPERM},
		{"kexec_file_load", nativeArch, unix.SYS_KEXEC_FILE_LOAD, nil, retEPERM},
		{"reboot", nativeArch, unix.SYS_REBOOT, nil, retEPERM},
		{"mount", nativeArch, unix.SYS_MOUNT, nil, retEPERM},
		{"umount2", nativeArch, unix.SYS_UMOUNT2, nil, retEPERM},
		{"pivot_root", nativeArch, unix.SYS_PIVOT_ROOT, nil, retEPERM},
		{"fsopen", nativeArch, unix.SYS_FSOPEN, nil, retEPERM},
		{"open_tree", nativeArch, unix.SYS_OPEN_TREE, nil, retEPERM},
		{"open_tree_attr", nativeArch, unix.SYS_OPEN_TREE_ATTR, nil, retEPERM},
		{"mount_setattr", nativeArch, unix.SYS_MOUNT_SETATTR, nil, retEPERM},
		{"setns", nativeArch, unix.SYS_SETNS, nil, retEPERM},
		{"listns", nativeArch, unix.SYS_LISTNS, nil, retEPERM},
		{"open_by_handle_at", nativeArch, unix.SYS_OPEN_BY_HANDLE_AT, nil, retEPERM},
		{"swapon", nativeArch, unix.SYS_SWAPON, nil, retEPERM},
		{"acct", nativeArch, unix.SYS_ACCT, nil, retEPERM},
		{"quotactl", nativeArch, unix.SYS_QUOTACTL, nil, retEPERM},
		{"syslog", nativeArch, unix.SYS_SYSLOG, nil, retEPERM},
		{"sethostname", nativeArch, unix.SYS_SETHOSTNAME, nil, retEPERM},
		{"settimeofday", nativeArch, unix.SYS_SETTIMEOFDAY, nil, retEPERM},
		{"clock_settime", nativeArch, unix.SYS_CLOCK_SETTIME, nil, retEPERM},
		{"clock_adjtime", nativeArch, unix.SYS_CLOCK_ADJTIME, nil, retEPERM},
		{"adjtimex", nativeArch, unix.SYS_ADJTIMEX, nil, retEPERM},
		{"vhangup", nativeArch, unix.SYS_VHANGUP, nil, retEPERM},
		{"mbind", nativeArch, unix.SYS_MBIND, nil, retEPERM},
		{"fanotify_init", nativeArch, unix.SYS_FANOTIFY_INIT, nil, retEPERM},

		// clone: threads and processes, no namespaces.
		{"clone of a thread", nativeArch, unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID}, retAllow},
		{"clone of fork", nativeArch, unix.SYS_CLONE, []uint64{unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | uint64(unix.SIGCHLD)}, retAllow},
		{"clone of Go's os/exec", nativeArch, unix.SYS_CLONE, []uint64{unix.CLONE_VFORK | unix.CLONE_VM | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)}, retAllow},
		{"clone with the exit signal's bit 0x80 (CLONE_NEWTIME to unshare)", nativeArch, unix.SYS_CLONE, []uint64{0x80 | uint64(unix.SIGCHLD)}, retAllow},
		{"clone3", nativeArch, unix.SYS_CLONE3, nil, retNoSys},

		// unshare: nothing but namespaces matter.
		{"unshare of nothing", nativeArch, unix.SYS_UNSHARE, []uint64{0}, retAllow},
		{"unshare of the file table", nativeArch, unix.SYS_UNSHARE, []uint64{unix.CLONE_FILES | unix.CLONE_FS | unix.CLONE_SYSVSEM}, retAllow},
		{"unshare of a time namespace", nativeArch, unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWTIME}, retEPERM},

		// personality.
		{"personality PER_LINUX", nativeArch, unix.SYS_PERSONALITY, []uint64{0}, retAllow},
		{"personality PER_LINUX32", nativeArch, unix.SYS_PERSONALITY, []uint64{perLinux32}, retAllow},
		{"personality UNAME26", nativeArch, unix.SYS_PERSONALITY, []uint64{perUname26}, retAllow},
		{"personality UNAME26|PER_LINUX32", nativeArch, unix.SYS_PERSONALITY, []uint64{perUname26 | perLinux32}, retAllow},
		{"personality query", nativeArch, unix.SYS_PERSONALITY, []uint64{0xffffffff}, retAllow},
		{"personality ADDR_NO_RANDOMIZE", nativeArch, unix.SYS_PERSONALITY, []uint64{addrNoRandomize}, retEPERM},
		{"personality READ_IMPLIES_EXEC", nativeArch, unix.SYS_PERSONALITY, []uint64{readImpliesExec}, retEPERM},
		{"personality PER_BSD", nativeArch, unix.SYS_PERSONALITY, []uint64{6}, retEPERM},

		// socket: families, types, netlink protocols.
		{"socket AF_UNIX stream", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM | unix.SOCK_CLOEXEC, 0}, retAllow},
		{"socket AF_UNIX dgram", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_DGRAM, 0}, retAllow},
		{"socket AF_INET stream", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM, 0}, retAllow},
		{"socket AF_INET stream nonblock cloexec", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM | unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC, unix.IPPROTO_TCP}, retAllow},
		{"socket AF_INET dgram", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_UDP}, retAllow},
		{"socket AF_INET ping (dgram icmp)", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP}, retAllow},
		{"socket AF_INET seqpacket (sctp)", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_SEQPACKET, unix.IPPROTO_SCTP}, retAllow},
		{"socket AF_INET6 stream", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_STREAM | unix.SOCK_CLOEXEC, 0}, retAllow},
		{"socket AF_INET6 dgram", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_DGRAM | unix.SOCK_NONBLOCK, 0}, retAllow},
		{"socket AF_INET raw", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP}, retEPERM},
		{"socket AF_INET raw nonblock cloexec", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_RAW | unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC, unix.IPPROTO_RAW}, retEPERM},
		{"socket AF_INET6 raw", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6}, retEPERM},
		{"socket AF_INET SOCK_PACKET", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, sockPacket, 0}, retEPERM},
		{"socket AF_INET dccp", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, sockDCCP, 0}, retEPERM},
		{"socket AF_NETLINK route", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW | unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE}, retAllow},
		{"socket AF_NETLINK route dgram", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_ROUTE}, retAllow},
		{"socket AF_NETLINK audit", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT}, retEPROTONOSUPPORT},
		{"socket AF_NETLINK uevent", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT}, retEPROTONOSUPPORT},
		{"socket AF_NETLINK sock_diag", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_SOCK_DIAG}, retEPROTONOSUPPORT},
		{"socket AF_NETLINK netfilter", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER}, retEPROTONOSUPPORT},
		{"socket AF_NETLINK generic", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC}, retEPROTONOSUPPORT},
		{"socket AF_VSOCK", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, retEAFNOSUPPORT},
		{"socket AF_PACKET", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_PACKET, unix.SOCK_RAW, 0x0300}, retEAFNOSUPPORT},
		{"socket AF_PACKET dgram", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_PACKET, unix.SOCK_DGRAM, 0}, retEAFNOSUPPORT},
		{"socket AF_ALG", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_ALG, unix.SOCK_SEQPACKET, 0}, retEAFNOSUPPORT},
		{"socket AF_KEY", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_KEY, unix.SOCK_RAW, 2}, retEAFNOSUPPORT},
		{"socket AF_TIPC", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_TIPC, unix.SOCK_RDM, 0}, retEAFNOSUPPORT},
		{"socket AF_RDS", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_RDS, unix.SOCK_SEQPACKET, 0}, retEAFNOSUPPORT},
		{"socket AF_BLUETOOTH", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_BLUETOOTH, unix.SOCK_RAW, 0}, retEAFNOSUPPORT},
		{"socket AF_UNSPEC", nativeArch, unix.SYS_SOCKET, []uint64{unix.AF_UNSPEC, unix.SOCK_STREAM, 0}, retEAFNOSUPPORT},
		{"socket family -1", nativeArch, unix.SYS_SOCKET, []uint64{0xffffffff, unix.SOCK_STREAM, 0}, retEAFNOSUPPORT},
		{"socketpair AF_UNIX", nativeArch, unix.SYS_SOCKETPAIR, []uint64{unix.AF_UNIX, unix.SOCK_STREAM | unix.SOCK_CLOEXEC, 0}, retAllow},
		{"socketpair AF_TIPC", nativeArch, unix.SYS_SOCKETPAIR, []uint64{unix.AF_TIPC, unix.SOCK_STREAM, 0}, retEAFNOSUPPORT},
		{"socketpair AF_VSOCK", nativeArch, unix.SYS_SOCKETPAIR, []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, retEAFNOSUPPORT},

		// Numbers the policy does not know, and other ABIs.
		{"the number after lastReviewed", nativeArch, lastReviewed + 1, nil, retNoSys},
		{"number 1000", nativeArch, 1000, nil, retNoSys},
		{"number -1", nativeArch, 0xffffffff, nil, retNoSys},
		{"i386 ABI (int 0x80) getpid", unix.AUDIT_ARCH_I386, 20, nil, retNoSys},
		{"i386 ABI read", unix.AUDIT_ARCH_I386, 3, nil, retNoSys},
		{"arm32 ABI", unix.AUDIT_ARCH_ARM, unix.SYS_GETPID, nil, retNoSys},
		{"x32 ABI", nativeArch, 0x40000000 | unix.SYS_GETPID, nil, retNoSys},
	}
	for _, n := range ns {
		cases = append(cases,
			verdictCase{"clone with a new " + n.name + " namespace", nativeArch, unix.SYS_CLONE, []uint64{n.flag | uint64(unix.SIGCHLD)}, retEPERM},
			verdictCase{"unshare of a " + n.name + " namespace", nativeArch, unix.SYS_UNSHARE, []uint64{n.flag}, retEPERM})
	}
	cases = append(cases, archCases...)
	v := vm(t)
	for _, tc := range cases {
		if got := verdict(t, v, tc.arch, tc.nr, tc.args...); got != tc.want {
			t.Errorf("%s: filter(nr %d, args %#x) = %s, want %s", tc.name, tc.nr, tc.args, verdictName(got), verdictName(tc.want))
		}
	}
}

// TestEveryNumber checks the dispatch over system call numbers against the
// policy's table, for every number.
func TestEveryNumber(t *testing.T) {
	v := vm(t)
	table := policy()
	for nr := uint32(0); nr <= lastReviewed+64; nr++ {
		want := retNoSys
		if nr <= lastReviewed {
			switch table[nr] {
			case ruleAllow:
				want = retAllow
			case ruleEPERM:
				want = retEPERM
			case ruleNoSys:
			default:
				continue // TestVerdicts
			}
		}
		if got := verdict(t, v, nativeArch, nr); got != want {
			t.Errorf("filter(nr %d) = %s, want %s", nr, verdictName(got), verdictName(want))
		}
	}
	t.Logf("%d instructions, %d system calls allowed, %d conditional, %d refused", len(Program()), len(allowed), len(conditional), len(refused))
}

// TestEveryCallClassified holds the policy to x/sys's table of system calls
// for this architecture: each call up to lastReviewed is in one of the
// policy's lists, and x/sys knows no call above it (a newer x/sys brings
// calls to classify before lastReviewed moves).
func TestEveryCallClassified(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "golang.org/x/sys").Output()
	if err != nil {
		t.Fatalf("go list golang.org/x/sys: %v", err)
	}
	file := filepath.Join(strings.TrimSpace(string(out)), "unix", "zsysnum_linux_"+runtime.GOARCH+".go")
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	classified := map[uint32]bool{}
	for _, l := range [][]uint32{allowed, refused, noSys} {
		for _, nr := range l {
			classified[nr] = true
		}
	}
	for nr := range conditional {
		classified[nr] = true
	}
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if name = strings.TrimSpace(name); !ok || !strings.HasPrefix(name, "SYS_") {
			continue
		}
		nr, err := strconv.ParseUint(strings.TrimSpace(val), 10, 32)
		if err != nil {
			t.Fatalf("%s: %q: %v", file, sc.Text(), err)
		}
		n++
		switch {
		case nr > lastReviewed:
			t.Errorf("x/sys knows %s (%d), above lastReviewed (%d): allow it, refuse it or leave it ENOSYS in policy.go, then raise lastReviewed", name, nr, lastReviewed)
		case !classified[uint32(nr)]:
			t.Errorf("%s (%d) is in none of the policy's lists", name, nr)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 300 {
		t.Fatalf("read %d system calls from %s; is the file's format still NAME = number?", n, file)
	}
}

const childEnv = "KIBOTOS_SECCOMP_TEST_CHILD"

// TestMain runs the child half of TestInstalled: install the filter, then
// try calls and report what they returned.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		child()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func child() {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		os.Stdout.WriteString("nnp: " + err.Error() + "\n")
		os.Exit(1)
	}
	if err := Install(); err != nil {
		os.Stdout.WriteString("install: " + err.Error() + "\n")
		os.Exit(1)
	}
	try := func(name string, err error) {
		s := "ok"
		if err != nil {
			s = err.Error()
		}
		os.Stdout.WriteString(name + ": " + s + "\n")
	}
	raw := func(name string, nr uintptr, args ...uintptr) {
		var a [6]uintptr
		copy(a[:], args)
		_, _, e := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
		try(name, errnoErr(e))
	}
	// socket creates a socket and closes it at once: refused families are
	// never bound or connected, even when the filter lets them through.
	socket := func(name string, family, typ, proto int) {
		fd, err := unix.Socket(family, typ, proto)
		if err == nil {
			unix.Close(fd)
		}
		try(name, err)
	}

	try("unshare-user", unix.Unshare(unix.CLONE_NEWUSER))
	try("unshare-mount", unix.Unshare(unix.CLONE_NEWNS))
	try("unshare-nothing", unix.Unshare(0))
	raw("keyctl", unix.SYS_KEYCTL)
	raw("bpf", unix.SYS_BPF)
	raw("clone3", unix.SYS_CLONE3)
	raw("unknown", lastReviewed+100)
	raw("kcmp", unix.SYS_KCMP, uintptr(os.Getpid()), uintptr(os.Getpid()), 0, 0, 0)
	// Without the filter: ESRCH (the parent is not traced by the child).
	var word [8]byte
	_, err := unix.PtracePeekData(os.Getppid(), 0, word[:])
	try("ptrace", err)
	// Without the filter, reading one's own memory succeeds.
	src, dst := []byte("kibotos"), make([]byte, 7)
	_, err = unix.ProcessVMReadv(os.Getpid(),
		[]unix.Iovec{{Base: &dst[0], Len: uint64(len(dst))}},
		[]unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: len(src)}}, 0)
	try("process_vm_readv", err)
	socket("socket-vsock", unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	socket("socket-packet", unix.AF_PACKET, unix.SOCK_RAW, 0)
	socket("socket-raw-inet", unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	socket("socket-raw-inet6", unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)
	socket("socket-netlink-audit", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT)
	socket("socket-netlink-route", unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	socket("socket-inet", unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	socket("socket-unix", unix.AF_UNIX, unix.SOCK_STREAM, 0)
	_, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	try("socketpair-unix", err)
	raw("personality-query", unix.SYS_PERSONALITY, 0xffffffff)
	raw("personality-no-randomize", unix.SYS_PERSONALITY, addrNoRandomize)
	try("getpid", func() error { unix.Getpid(); return nil }())
	// A dynamically linked glibc program and a few commands: exec, the
	// loader, fork and pipes.
	try("exec", exec.Command("/bin/sh", "-c", "ls / >/dev/null && cat /proc/self/status | grep -q Seccomp && dd if=/dev/zero of=/dev/null count=1 2>/dev/null").Run())
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// TestInstalled installs the filter in a child process and checks the
// kernel's answers.
func TestInstalled(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && strings.Contains(string(out), "install:") {
			t.Fatalf("could not install the filter: %s", out)
		}
		t.Fatalf("child: %v\n%s", err, out)
	}
	eperm, enosys := unix.EPERM.Error(), unix.ENOSYS.Error()
	want := map[string]string{
		"unshare-user": eperm, "unshare-mount": eperm, "unshare-nothing": "ok",
		"keyctl": eperm, "bpf": eperm, "clone3": enosys, "unknown": enosys, "kcmp": eperm,
		"ptrace": eperm, "process_vm_readv": eperm,
		"socket-vsock":         unix.EAFNOSUPPORT.Error(),
		"socket-packet":        unix.EAFNOSUPPORT.Error(),
		"socket-raw-inet":      eperm,
		"socket-raw-inet6":     eperm,
		"socket-netlink-audit": unix.EPROTONOSUPPORT.Error(),
		"socket-netlink-route": "ok", "socket-inet": "ok", "socket-unix": "ok", "socketpair-unix": "ok",
		"personality-query": "ok", "personality-no-randomize": eperm,
		"getpid": "ok", "exec": "ok",
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			got[k] = v
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q (child output:\n%s)", k, got[k], v, out)
		}
	}
}
