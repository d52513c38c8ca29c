// Package seccomp builds and installs the system call filter of workspace
// processes, on top of the capabilities the init shim drops. The filter is
// an allow-list (policy.go), modelled on the default profile of Docker and
// containerd: the calls a program needs are allowed, a handful are allowed
// with some arguments only, and the rest is refused.
//
// Conditional calls: clone and unshare without namespace flags (a new user
// namespace would hand a workspace process capabilities of its own, and
// the others are the init shim's business); personality with the values
// that change only what uname reports; socket with AF_UNIX, AF_INET and
// AF_INET6 of the stream, datagram and seqpacket types (no raw IP), and
// AF_NETLINK with NETLINK_ROUTE only (what ip and getifaddrs read);
// socketpair with AF_UNIX.
//
// Refusals are EPERM, except where a C library or a program takes another
// answer for "this kernel does not have it" and carries on: a socket of a
// refused family fails with EAFNOSUPPORT (vsock, packet, alg…) and a
// netlink socket of another protocol with EPROTONOSUPPORT (libaudit users
// such as shadow's useradd and sudo give up on auditing on that answer and
// abort on EPERM). Calls the policy does not know fail with ENOSYS: numbers
// above the last one reviewed (calls newer kernels add, which C libraries
// then emulate or do without), clone3 (its flags are in memory, out of
// reach of a filter; glibc falls back to clone), and calls of another ABI
// than the binary's own (i386 through int 0x80 on amd64, x32, arm32 on
// arm64), so that no second system call table bypasses the list.
//
// The filter is assembled here from x/sys/unix constants rather than with a
// library: libseccomp needs cgo (our binaries are static), and the pure-Go
// assemblers we looked at let foreign-ABI calls through. The system call
// number is dispatched through a binary search over ranges of numbers with
// the same verdict, a few comparisons per call; a kernel that caches
// verdicts (5.11 and later) skips the filter for the calls allowed
// whatever their arguments.
package seccomp

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccomp_data offsets (linux/seccomp.h): nr, arch, instruction_pointer,
// args[6]; the low 32 bits of an argument on little-endian machines (amd64
// and arm64). Every argument the filter reads is a 32-bit value to the
// kernel (socket's int family, type and protocol, personality's unsigned
// int, clone's flags through lower_32_bits), or one whose upper bits make
// the call fail with EINVAL (unshare), so the low word decides.
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16
	offArg1 = 24
	offArg2 = 32
)

const (
	retAllow           = unix.SECCOMP_RET_ALLOW
	retEPERM           = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retNoSys           = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	retEAFNOSUPPORT    = unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)
	retEPROTONOSUPPORT = unix.SECCOMP_RET_ERRNO | uint32(unix.EPROTONOSUPPORT)
)

// Program returns the filter as BPF instructions.
func Program() []unix.SockFilter {
	var a asm
	a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArch)
	a.jump(unix.BPF_JEQ, nativeArch, "", "nosys")
	a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr)
	a.jump(unix.BPF_JGT, lastReviewed, "nosys", "")
	a.p = append(a.p, a.dispatch(ranges(policy()))...)

	// The conditional rules, entered from dispatch's leaves.
	a.label("clone")
	a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0)
	a.jump(unix.BPF_JSET, namespaceFlags, "eperm", "allow")

	a.label("unshare")
	a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0)
	a.jump(unix.BPF_JSET, namespaceFlags|unix.CLONE_NEWTIME, "eperm", "allow")

	a.label("personality")
	a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0)
	for _, v := range []uint32{perLinux, perLinux32, perUname26, perUname26 | perLinux32, personalityQuery} {
		a.jump(unix.BPF_JEQ, v, "allow", "")
	}
	a.ja("eperm")

	a.label("socket")
	a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0)
	a.jump(unix.BPF_JEQ, unix.AF_UNIX, "allow", "")
	a.jump(unix.BPF_JEQ, unix.AF_INET, "inet", "")
	a.jump(unix.BPF_JEQ, unix.AF_INET6, "inet", "")
	a.jump(unix.BPF_JEQ, unix.AF_NETLINK, "netlink", "eafnosupport")
	a.label("inet")
	a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg1)
	a.stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, sockTypeMask)
	a.jump(unix.BPF_JEQ, unix.SOCK_STREAM, "allow", "")
	a.jump(unix.BPF_JEQ, unix.SOCK_DGRAM, "allow", "")
	a.jump(unix.BPF_JEQ, unix.SOCK_SEQPACKET, "allow", "eperm")
	a.label("netlink")
	a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg2)
	a.jump(unix.BPF_JEQ, unix.NETLINK_ROUTE, "allow", "eprotonosupport")

	a.label("socketpair")
	a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0)
	a.jump(unix.BPF_JEQ, unix.AF_UNIX, "allow", "eafnosupport")

	for _, r := range []struct {
		label string
		ret   uint32
	}{
		{"allow", retAllow}, {"eperm", retEPERM}, {"nosys", retNoSys},
		{"eafnosupport", retEAFNOSUPPORT}, {"eprotonosupport", retEPROTONOSUPPORT},
	} {
		a.label(r.label)
		a.stmt(unix.BPF_RET|unix.BPF_K, r.ret)
	}
	return a.resolve()
}

// A span is a run of consecutive system call numbers with one rule.
type span struct {
	first uint32
	rule  rule
}

// ranges turns the policy's table into spans, in order; the last one ends
// at lastReviewed.
func ranges(t []rule) []span {
	var s []span
	for nr, r := range t {
		if len(s) == 0 || s[len(s)-1].rule != r {
			s = append(s, span{uint32(nr), r})
		}
	}
	return s
}

// ruleLabels are where the conditional rules' code starts.
var ruleLabels = map[rule]string{
	ruleClone: "clone", ruleUnshare: "unshare", rulePersonality: "personality",
	ruleSocket: "socket", ruleSocketpair: "socketpair",
}

// dispatch returns the binary search over spans, for a program in which it
// starts at len(a.p) with the number loaded: a node compares with the first
// number of the upper half of its spans, a leaf returns its verdict or
// jumps to a conditional rule (recorded in a's fixups).
func (a *asm) dispatch(spans []span) []unix.SockFilter {
	base := len(a.p)
	var out []unix.SockFilter
	var emit func(s []span)
	emit = func(s []span) {
		if len(s) == 1 {
			ret := func(k uint32) { out = append(out, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: k}) }
			switch r := s[0].rule; r {
			case ruleAllow:
				ret(retAllow)
			case ruleEPERM:
				ret(retEPERM)
			case ruleNoSys:
				ret(retNoSys)
			default:
				a.fixups = append(a.fixups, fixup{at: base + len(out), label: ruleLabels[r], ja: true})
				out = append(out, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JA})
			}
			return
		}
		mid := len(s) / 2
		jge := unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, K: s[mid].first}
		if lower := size(s[:mid]); lower <= 255 {
			jge.Jt = uint8(lower)
			out = append(out, jge)
		} else {
			// Too far for a conditional jump: through an unconditional one.
			jge.Jf = 1
			out = append(out, jge, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JA, K: uint32(lower)})
		}
		emit(s[:mid])
		emit(s[mid:])
	}
	emit(spans)
	return out
}

// size is the length of dispatch's code for spans.
func size(s []span) int {
	if len(s) == 1 {
		return 1
	}
	mid := len(s) / 2
	lower := size(s[:mid])
	node := 1
	if lower > 255 {
		node = 2
	}
	return node + lower + size(s[mid:])
}

// asm assembles a program with forward jumps to labels.
type asm struct {
	p      []unix.SockFilter
	labels map[string]int
	fixups []fixup
}

type fixup struct {
	at    int
	label string
	// onFalse: the label is the false branch of a conditional jump; ja:
	// the instruction is an unconditional jump.
	onFalse, ja bool
}

func (a *asm) stmt(code uint16, k uint32) {
	a.p = append(a.p, unix.SockFilter{Code: code, K: k})
}

// jump appends a conditional jump comparing A with k; an empty label is the
// next instruction.
func (a *asm) jump(op uint16, k uint32, ifTrue, ifFalse string) {
	if ifTrue != "" {
		a.fixups = append(a.fixups, fixup{at: len(a.p), label: ifTrue})
	}
	if ifFalse != "" {
		a.fixups = append(a.fixups, fixup{at: len(a.p), label: ifFalse, onFalse: true})
	}
	a.stmt(unix.BPF_JMP|op|unix.BPF_K, k)
}

func (a *asm) ja(label string) {
	a.fixups = append(a.fixups, fixup{at: len(a.p), label: label, ja: true})
	a.stmt(unix.BPF_JMP|unix.BPF_JA, 0)
}

func (a *asm) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	a.labels[name] = len(a.p)
}

// resolve fills in the jumps. It panics on a jump backwards, to a missing
// label, or too far for a conditional jump: all mistakes in Program.
func (a *asm) resolve() []unix.SockFilter {
	for _, f := range a.fixups {
		to, ok := a.labels[f.label]
		if !ok {
			panic("seccomp: no label " + f.label)
		}
		off := to - f.at - 1
		switch {
		case off < 0:
			panic(fmt.Sprintf("seccomp: jump backwards to %s", f.label))
		case f.ja:
			a.p[f.at].K = uint32(off)
		case off > 255:
			panic(fmt.Sprintf("seccomp: conditional jump of %d instructions to %s", off, f.label))
		case f.onFalse:
			a.p[f.at].Jf = uint8(off)
		default:
			a.p[f.at].Jt = uint8(off)
		}
	}
	return a.p
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
