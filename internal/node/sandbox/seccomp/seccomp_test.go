package seccomp

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// run evaluates the filter on one seccomp_data in x/net/bpf's VM.
func run(t *testing.T, arch, nr uint32, arg0 uint64) uint32 {
	t.Helper()
	var raw []bpf.RawInstruction
	for _, f := range Program() {
		raw = append(raw, bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K})
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("the program does not disassemble")
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatalf("NewVM: %v", err)
	}
	// The VM loads words big-endian (network order) where the kernel loads
	// seccomp_data in the machine's order: each 32-bit field is written so
	// that the VM reads the value the kernel would.
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[offNr:], nr)
	binary.BigEndian.PutUint32(data[offArch:], arch)
	binary.BigEndian.PutUint32(data[offArg0:], uint32(arg0))
	// The VM's verdict is the number of bytes to keep, capped at the
	// packet's length; a large enough packet returns the constant.
	big := make([]byte, 1<<20)
	copy(big, data)
	n, err := vm.Run(big)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return uint32(n)
}

func TestVerdicts(t *testing.T) {
	if os.Getenv("GOARCH") != "" && os.Getenv("GOARCH") != "amd64" {
		t.Skip("table written for amd64")
	}
	// The VM caps a verdict at the buffer's length (1 MiB), so compare the
	// action class: allow is larger than the buffer.
	const max = 1 << 20
	for _, tc := range []struct {
		name string
		arch uint32
		nr   uint32
		arg0 uint64
		want uint32
	}{
		{"getpid", nativeArch, unix.SYS_GETPID, 0, max},
		{"read", nativeArch, unix.SYS_READ, 0, max},
		{"clone of a thread", nativeArch, unix.SYS_CLONE, unix.CLONE_VM | unix.CLONE_THREAD, max},
		{"clone with a new user namespace", nativeArch, unix.SYS_CLONE, unix.CLONE_NEWUSER | uint64(unix.SIGCHLD), retEPERM},
		{"unshare of a mount namespace", nativeArch, unix.SYS_UNSHARE, unix.CLONE_NEWNS, max},
		{"unshare of a user namespace", nativeArch, unix.SYS_UNSHARE, unix.CLONE_NEWUSER, retEPERM},
		{"clone3", nativeArch, unix.SYS_CLONE3, 0, retNoSys},
		{"bpf", nativeArch, unix.SYS_BPF, 0, retEPERM},
		{"init_module", nativeArch, unix.SYS_INIT_MODULE, 0, retEPERM},
		{"keyctl", nativeArch, unix.SYS_KEYCTL, 0, retEPERM},
		{"io_uring_setup", nativeArch, unix.SYS_IO_URING_SETUP, 0, retEPERM},
		{"mount", nativeArch, unix.SYS_MOUNT, 0, retEPERM},
		{"modify_ldt", nativeArch, unix.SYS_MODIFY_LDT, 0, retEPERM},
		{"i386 ABI (int 0x80)", unix.AUDIT_ARCH_I386, 20 /* getpid */, 0, retNoSys},
		{"x32 ABI", nativeArch, 0x40000000 | unix.SYS_GETPID, 0, retNoSys},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, tc.arch, tc.nr, tc.arg0)
			if tc.want == max {
				if got != max && got != retAllow {
					t.Errorf("verdict %#x, want allow", got)
				}
				return
			}
			if got != tc.want {
				t.Errorf("verdict %#x, want %#x", got, tc.want)
			}
		})
	}
}

const childEnv = "KIBOTOS_SECCOMP_TEST_CHILD"

// TestMain runs the child half of TestInstalled: install the filter, then
// try calls and report what they returned.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
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
		try("unshare-user", unix.Unshare(unix.CLONE_NEWUSER))
		_, _, e := unix.Syscall(unix.SYS_KEYCTL, 0, 0, 0)
		try("keyctl", errnoErr(e))
		_, _, e = unix.Syscall(unix.SYS_BPF, 0, 0, 0)
		try("bpf", errnoErr(e))
		_, _, e = unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
		try("clone3", errnoErr(e))
		try("getpid", func() error { unix.Getpid(); return nil }())
		try("exec", exec.Command("/bin/sh", "-c", "exit 0").Run())
		os.Exit(0)
	}
	os.Exit(m.Run())
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
	want := map[string]string{
		"unshare-user": unix.EPERM.Error(), "keyctl": unix.EPERM.Error(), "bpf": unix.EPERM.Error(),
		"clone3": unix.ENOSYS.Error(), "getpid": "ok", "exec": "ok",
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
