package guest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

func TestMain(m *testing.M) {
	// As a command of TestReaperDetachesTracee: make the parent (the
	// agent) this process's tracer, then exec.
	if argv := os.Getenv("KIBOTOS_TEST_TRACEME"); argv != "" {
		runtime.LockOSThread()
		if _, _, errno := syscall.RawSyscall(syscall.SYS_PTRACE, syscall.PTRACE_TRACEME, 0, 0); errno != 0 {
			fmt.Fprintln(os.Stderr, "PTRACE_TRACEME:", errno)
			os.Exit(100)
		}
		args := strings.Split(argv, "|")
		err := syscall.Exec(args[0], args, []string{"PATH=/usr/bin:/bin"})
		fmt.Fprintln(os.Stderr, err)
		os.Exit(101)
	}
	os.Exit(m.Run())
}

// TestReaperDetachesTracee: a command that makes the agent its tracer
// (PTRACE_TRACEME) stops at its exec; the reaper detaches it instead of
// taking the stop for its end, and the command's exit is its own.
func TestReaperDetachesTracee(t *testing.T) {
	_, sock, _ := startAgent(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	shell, err := exec.LookPath("sh")
	if err != nil {
		t.Skip(err)
	}
	resp := do(t, sock, protocol.Request{Op: protocol.OpExec, TimeoutMillis: 10000, Exec: &protocol.ExecRequest{
		Argv: []string{self}, Env: []string{"KIBOTOS_TEST_TRACEME=" + shell + "|-c|exit 7"},
	}})
	if resp.Exec == nil || resp.Exec.ExitCode != 7 || resp.Exec.TimedOut {
		t.Fatalf("a command that traces itself: %+v", resp.Exec)
	}
}

// startAgent runs an agent (not PID 1: it execs directly and only reaps
// its own children) on a socket in a temporary directory.
func startAgent(t *testing.T) (*Agent, string, <-chan error) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "guest.sock")
	a := New(Config{
		SocketPath: sock,
		CgroupRoot: filepath.Join(dir, "no-cgroup"),
		DiskPath:   dir,
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() { done <- a.Run(ctx); close(finished) }()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("agent did not listen")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return a, sock, done
}

func do(t *testing.T, sock string, req protocol.Request) protocol.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := protocol.Do(ctx, sock, req)
	if err != nil {
		t.Fatalf("%s: %v", req.Op, err)
	}
	return resp
}

func execIn(t *testing.T, sock string, timeoutMs int64, argv ...string) *protocol.ExecResult {
	t.Helper()
	resp := do(t, sock, protocol.Request{Op: protocol.OpExec, TimeoutMillis: timeoutMs, Exec: &protocol.ExecRequest{Argv: argv}})
	if resp.Exec == nil {
		t.Fatal("no exec result")
	}
	return resp.Exec
}

func TestAgentPingExecWriteback(t *testing.T) {
	_, sock, _ := startAgent(t)
	if resp := do(t, sock, protocol.Request{Op: protocol.OpPing}); resp.Condition != protocol.ConditionReady {
		t.Errorf("ping: %+v", resp)
	}
	if r := execIn(t, sock, 0, "echo", "hi"); string(r.Stdout) != "hi\n" || r.ExitCode != 0 {
		t.Errorf("echo: %+v", r)
	}
	if r := execIn(t, sock, 0, "sh", "-c", "echo err >&2; exit 3"); string(r.Stderr) != "err\n" || r.ExitCode != 3 {
		t.Errorf("exit 3: %+v", r)
	}
	if r := execIn(t, sock, 0, "sh", "-c", "kill -9 $$"); r.ExitCode != 137 || r.Signal != "SIGKILL" {
		t.Errorf("killed: %+v", r)
	}
	if r := execIn(t, sock, 0, "no-such-command-kibotos"); r.ExitCode != 127 {
		t.Errorf("missing command: %+v", r)
	}
	t0 := time.Now()
	if r := execIn(t, sock, 200, "sleep", "10"); !r.TimedOut || r.ExitCode != 128+9 {
		t.Errorf("timeout: %+v", r)
	}
	// A background process that keeps stdout open does not hold the answer.
	if r := execIn(t, sock, 0, "sh", "-c", "sleep 3 & echo started"); string(r.Stdout) != "started\n" {
		t.Errorf("background: %+v", r)
	}
	if d := time.Since(t0); d > 2500*time.Millisecond {
		t.Errorf("timeout and background took %v", d)
	}
	// Stdin, environment and directory.
	dir := t.TempDir()
	resp := do(t, sock, protocol.Request{Op: protocol.OpExec, Exec: &protocol.ExecRequest{
		Argv: []string{"sh", "-c", "cat; echo $FOO; pwd"}, Stdin: []byte("line\n"),
		Env: []string{"PATH=/usr/bin:/bin", "FOO=bar"}, Dir: dir,
	}})
	if got := string(resp.Exec.Stdout); got != "line\nbar\n"+dir+"\n" {
		t.Errorf("stdin/env/dir: %q", got)
	}
	// Output is bounded.
	if r := execIn(t, sock, 0, "head", "-c", strconv.Itoa(protocol.MaxExecOutput+1000), "/dev/zero"); len(r.Stdout) != protocol.MaxExecOutput || !r.Truncated {
		t.Errorf("big output: %d bytes, truncated=%v", len(r.Stdout), r.Truncated)
	}
	wb := do(t, sock, protocol.Request{Op: protocol.OpWriteback})
	if !wb.OK || len(wb.Synced) == 0 {
		t.Errorf("writeback: %+v", wb)
	}
	// Unknown requests and garbage are answered, not fatal.
	if _, err := protocol.Do(context.Background(), sock, protocol.Request{Op: "bogus"}); err == nil || !strings.Contains(err.Error(), "unknown op") {
		t.Errorf("bogus op: %v", err)
	}
	conn, err := protocol.Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("{not json\n"))
	line, _ := bufio.NewReader(conn).ReadString('\n')
	conn.Close()
	if !strings.Contains(line, "error") {
		t.Errorf("garbage answered %q", line)
	}
	// Several requests on one connection.
	conn, err = protocol.Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := 0; i < 3; i++ {
		resp, err := protocol.Call(context.Background(), conn, protocol.Request{Op: protocol.OpPing})
		if err != nil || !resp.OK {
			t.Fatalf("ping %d on one connection: %+v %v", i, resp, err)
		}
	}
}

func TestAgentShutdown(t *testing.T) {
	_, sock, done := startAgent(t)
	if resp := do(t, sock, protocol.Request{Op: protocol.OpShutdown}); !resp.OK {
		t.Fatalf("shutdown: %+v", resp)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not power off")
	}
}

func TestProtocolFraming(t *testing.T) {
	var buf bytes.Buffer
	in := protocol.Response{OK: true, Exec: &protocol.ExecResult{Stdout: []byte("a\nb\n\x00"), ExitCode: 2}}
	if err := protocol.WriteMessage(&buf, in, protocol.MaxResponse); err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(buf.Bytes(), []byte("\n")); n != 1 {
		t.Fatalf("%d newlines in one message", n)
	}
	var out protocol.Response
	if err := protocol.ReadMessage(bufio.NewReader(&buf), &out, protocol.MaxResponse); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Exec.Stdout, in.Exec.Stdout) || out.Exec.ExitCode != 2 {
		t.Errorf("round trip: %+v", out.Exec)
	}
	// Unknown fields are refused: both sides ship together.
	if err := protocol.ReadMessage(bufio.NewReader(strings.NewReader(`{"op":"ping","x":1}`+"\n")), &protocol.Request{}, protocol.MaxRequest); err == nil {
		t.Error("unknown field accepted")
	}
	// A truncated line is an error, EOF alone is io.EOF.
	if err := protocol.ReadMessage(bufio.NewReader(strings.NewReader(`{"op":"pi`)), &protocol.Request{}, protocol.MaxRequest); err == nil {
		t.Error("truncated message accepted")
	}
	if err := protocol.ReadMessage(bufio.NewReader(strings.NewReader("")), &protocol.Request{}, protocol.MaxRequest); err != io.EOF {
		t.Errorf("empty stream: %v", err)
	}
	// A line past its bound is refused once the bound is read, whether it
	// ends or not.
	for _, tail := range []string{"\n", ""} {
		long := `{"message":"` + strings.Repeat("x", protocol.MaxResponse) + `"}` + tail
		r := &countingReader{r: strings.NewReader(long + strings.Repeat("y", 10<<20))}
		err := protocol.ReadMessage(bufio.NewReaderSize(r, 4096), &protocol.Response{}, protocol.MaxResponse)
		if !errors.Is(err, protocol.ErrTooLong) {
			t.Errorf("long line: %v", err)
		}
		if r.n > protocol.MaxResponse+8192 {
			t.Errorf("read %d bytes of a line bounded at %d", r.n, protocol.MaxResponse)
		}
	}
	// Both sides clip free text on a UTF-8 boundary.
	if got := protocol.Clip(strings.Repeat("é", 1000), 11); got != "éééé…" {
		t.Errorf("Clip = %q", got)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestDialLongPath(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The agent listens through a short alias of the directory (as in a
	// workspace); the client dials the long host path.
	if err := os.Symlink(dir, filepath.Join(base, "l")); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "guest.sock")
	a := New(Config{SocketPath: filepath.Join(base, "l", "guest.sock"), DiskPath: dir, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(3 * time.Second)
	for {
		resp, err := protocol.Do(ctx, sock, protocol.Request{Op: protocol.OpPing})
		if err == nil && resp.OK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ping over a %d-byte path: %v", len(sock), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMemoryPressure(t *testing.T) {
	const mb = 1 << 20
	cases := []struct {
		name     string
		files    map[string]string
		pressure bool
		ok       bool
	}{
		{"v2 pressure", map[string]string{"memory.max": "104857600\n", "memory.current": "99614720\n", "memory.stat": "anon 1\ninactive_file 1048576\n"}, true, true},
		{"v2 cache only", map[string]string{"memory.max": "104857600\n", "memory.current": "99614720\n", "memory.stat": "inactive_file 52428800\n"}, false, true},
		{"v2 unlimited", map[string]string{"memory.max": "max\n", "memory.current": "1\n"}, false, false},
		{"v1 pressure", map[string]string{"memory/memory.limit_in_bytes": "67108864\n", "memory/memory.usage_in_bytes": "66060288\n", "memory/memory.stat": "total_inactive_file 0\n"}, true, true},
		{"v1 fine", map[string]string{"memory/memory.limit_in_bytes": "67108864\n", "memory/memory.usage_in_bytes": "10485760\n"}, false, true},
		{"v1 unlimited", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "1\n"}, false, false},
		{"nothing", map[string]string{}, false, false},
	}
	for _, c := range cases {
		dir := t.TempDir()
		writeFiles(t, dir, c.files)
		p, msg, ok := memoryPressure(dir)
		if p != c.pressure || ok != c.ok {
			t.Errorf("%s: pressure=%v ok=%v (%s), want %v %v", c.name, p, ok, msg, c.pressure, c.ok)
		}
		if p && !strings.Contains(msg, "MiB") {
			t.Errorf("%s: message %q", c.name, msg)
		}
	}
	_ = mb
	// The agent folds it into its condition.
	dir := t.TempDir()
	writeFiles(t, dir, cases[0].files)
	a := New(Config{SocketPath: filepath.Join(dir, "s"), CgroupRoot: dir, DiskPath: dir})
	if c, msg := a.Condition(); c != protocol.ConditionMemoryPressure || msg == "" {
		t.Errorf("condition: %s %q", c, msg)
	}
}

func TestDiskPressureMeasurable(t *testing.T) {
	p, _, ok := diskPressure(t.TempDir())
	if !ok {
		t.Fatal("statfs of a temporary directory not measurable")
	}
	_ = p // depends on the host; the sandbox tests fill a real layer
	if _, _, ok := diskPressure("/nonexistent/path"); ok {
		t.Error("a missing path measured")
	}
}

// TestChannel: the agent serves the connections the node sends over its
// channel, and a power-off is a notice on it; the agent keeps serving
// (with a channel it waits for the node to end it).
func TestChannel(t *testing.T) {
	node, guestEnd, err := protocol.NewChannel()
	if err != nil {
		t.Fatal(err)
	}
	nc := protocol.NewNodeChannel(node)
	defer nc.Close()
	fd, err := syscall.Dup(int(guestEnd.Fd())) // owned by the listener from now on
	guestEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(protocol.ChannelFDEnv, strconv.Itoa(fd))
	ln, err := ChannelFromEnv()
	if err != nil || ln == nil {
		t.Fatalf("ChannelFromEnv: %v %v", ln, err)
	}
	if _, ok := os.LookupEnv(protocol.ChannelFDEnv); ok {
		t.Fatalf("%s is still set", protocol.ChannelFDEnv)
	}
	dir := t.TempDir()
	a := New(Config{Channel: ln, CgroupRoot: filepath.Join(dir, "no-cgroup"), DiskPath: dir,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan error, 1)
	go func() { finished <- a.Run(ctx) }()
	defer func() { cancel(); <-finished }()

	call := func(req protocol.Request) protocol.Response {
		t.Helper()
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		conn, err := nc.Dial(cctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		resp, err := protocol.Call(cctx, conn, req)
		if err != nil {
			t.Fatalf("%s: %v", req.Op, err)
		}
		return resp
	}
	if resp := call(protocol.Request{Op: protocol.OpPing}); !resp.OK || resp.Condition != protocol.ConditionReady {
		t.Fatalf("ping: %+v", resp)
	}
	if resp := call(protocol.Request{Op: protocol.OpExec, Exec: &protocol.ExecRequest{Argv: []string{"echo", "hi"}}}); resp.Exec == nil || string(resp.Exec.Stdout) != "hi\n" {
		t.Fatalf("exec: %+v", resp)
	}
	// No notice before the power-off.
	if kind, _, err := nc.ReadNotice(false); kind != 0 || err != nil {
		t.Fatalf("notice before power-off: %q %v", kind, err)
	}
	if resp := call(protocol.Request{Op: protocol.OpShutdown}); !resp.OK {
		t.Fatalf("shutdown: %+v", resp)
	}
	got := make(chan string, 1)
	go func() {
		kind, payload, err := nc.ReadNotice(true)
		got <- fmt.Sprintf("%c %s %v", kind, payload, err)
	}()
	select {
	case n := <-got:
		if n != "P requested by shutdown <nil>" {
			t.Fatalf("notice: %q", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no power-off notice")
	}
	select {
	case err := <-finished:
		t.Fatalf("Run returned after the power-off notice: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if resp := call(protocol.Request{Op: protocol.OpPing}); !resp.OK {
		t.Fatalf("ping after power-off: %+v", resp)
	}
}
