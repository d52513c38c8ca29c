package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testPty is a terminal the test holds the master of.
type testPty struct {
	master, slave *os.File
	mu            sync.Mutex
	out           bytes.Buffer // everything the terminal printed
	done          chan struct{}
}

func openTestPty(t *testing.T, rows, cols uint16) *testPty {
	t.Helper()
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(mfd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	sfd, err := unix.Open("/dev/pts/"+strconv.Itoa(n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
	p := &testPty{master: os.NewFile(uintptr(mfd), "ptmx"), slave: os.NewFile(uintptr(sfd), "pts"), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		buf := make([]byte, 4096)
		for {
			n, err := p.master.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { p.slave.Close(); p.master.Close() })
	return p
}

func (p *testPty) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// wait waits until the output after offset from contains s; it returns
// the offset after s.
func (p *testPty) wait(t *testing.T, from int, s string, d time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		out := p.output()
		if i := strings.Index(out[from:], s); i >= 0 {
			return from + i + len(s)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q on the terminal within %v; after offset %d it shows %q", s, d, from, out[from:])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *testPty) typeIn(t *testing.T, s string) {
	t.Helper()
	if _, err := p.master.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// TestShellThroughTerminal drives `kibo workspace shell` through a real
// terminal: a command's output, a window resize seen by `stty size`
// inside, Ctrl-C that interrupts the foreground command and not the shell,
// and the shell's exit status as kibo's, with the local terminal restored.
func TestShellThroughTerminal(t *testing.T) {
	e := newDPEnv(t, "e2e-pty-ws")
	p := openTestPty(t, 24, 80)
	before, err := unix.IoctlGetTermios(int(p.slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	cmd := e.kibo("workspace", "shell", e.id)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.slave, p.slave, p.slave
	// kibo leads a session whose controlling terminal is the pty, as in a
	// terminal emulator: resizes and Ctrl-C reach it as they would.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		p.slave.Close()
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
		}
	})

	off := p.wait(t, 0, "# ", 20*time.Second)
	p.typeIn(t, "echo $((6*7))\r")
	off = p.wait(t, off, "42\r\n", 5*time.Second)
	off = p.wait(t, off, "# ", 5*time.Second)

	// A resize: the terminal's new size, then SIGWINCH to kibo (the kernel
	// sends one to the foreground group too).
	if err := unix.IoctlSetWinsize(int(p.master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 33, Col: 101}); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGWINCH)
	for deadline := time.Now().Add(5 * time.Second); ; {
		p.typeIn(t, "stty size\r")
		next := p.wait(t, off, "# ", 5*time.Second)
		if strings.Contains(p.output()[off:next], "33 101\r\n") {
			off = next
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stty size inside never showed 33 101: %q", p.output()[off:next])
		}
		off = next
		time.Sleep(100 * time.Millisecond)
	}

	// Ctrl-C interrupts sleep; the shell stays.
	p.typeIn(t, "sleep 100\r")
	off = p.wait(t, off, "sleep 100\r\n", 5*time.Second)
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	p.typeIn(t, "\x03")
	off = p.wait(t, off, "# ", 5*time.Second)
	t.Logf("Ctrl-C → prompt in %v", time.Since(start))
	p.typeIn(t, "echo alive$((1+1))\r")
	off = p.wait(t, off, "alive2\r\n", 5*time.Second)
	p.wait(t, off, "# ", 5*time.Second)

	// exit 3 is kibo's exit status.
	p.typeIn(t, "exit 3\r")
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Fatalf("kibo after exit 3: %v, want exit status 3; terminal:\n%q", err, p.output())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("kibo still runs 10s after exit 3; terminal:\n%q", p.output())
	}
	after, err := unix.IoctlGetTermios(int(p.slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if *after != *before {
		t.Errorf("the terminal was not restored: %+v, was %+v", after, before)
	}
}
