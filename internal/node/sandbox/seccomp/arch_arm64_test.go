package seccomp

import "golang.org/x/sys/unix"

var archCases = []verdictCase{
	{"renameat", nativeArch, unix.SYS_RENAMEAT, nil, retAllow},
	{"244 (no arch-specific calls)", nativeArch, unix.SYS_ARCH_SPECIFIC_SYSCALL, nil, retEPERM},
	{"unassigned 300", nativeArch, 300, nil, retNoSys},
}
