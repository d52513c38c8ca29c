package seccomp

import "golang.org/x/sys/unix"

var archCases = []verdictCase{
	{"arch_prctl", nativeArch, unix.SYS_ARCH_PRCTL, nil, retAllow},
	{"open", nativeArch, unix.SYS_OPEN, nil, retAllow},
	{"vfork", nativeArch, unix.SYS_VFORK, nil, retAllow},
	{"uretprobe", nativeArch, unix.SYS_URETPROBE, nil, retAllow},
	{"modify_ldt", nativeArch, unix.SYS_MODIFY_LDT, nil, retEPERM},
	{"iopl", nativeArch, unix.SYS_IOPL, nil, retEPERM},
	{"ioperm", nativeArch, unix.SYS_IOPERM, nil, retEPERM},
	{"uselib", nativeArch, unix.SYS_USELIB, nil, retEPERM},
	{"_sysctl", nativeArch, unix.SYS__SYSCTL, nil, retEPERM},
	{"unassigned 400", nativeArch, 400, nil, retNoSys},
	{"x32-only 512 without the x32 bit", nativeArch, 512, nil, retNoSys},
	{"x32 ABI read", nativeArch, 0x40000000 | unix.SYS_READ, nil, retNoSys},
}
