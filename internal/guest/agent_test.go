package guest

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/guest/protocol"
)

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
	if r := execIn(t, sock, 0, "head", "-c", "17000000", "/dev/zero"); len(r.Stdout) != protocol.MaxExecOutput || !r.Truncated {
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
	b, err := os.ReadFile(filepath.Join(filepath.Dir(sock), protocol.PoweroffMarker))
	if err != nil || !bytes.Contains(b, []byte("shutdown")) {
		t.Errorf("marker: %q %v", b, err)
	}
}

func TestProtocolFraming(t *testing.T) {
	var buf bytes.Buffer
	in := protocol.Response{OK: true, Exec: &protocol.ExecResult{Stdout: []byte("a\nb\n\x00"), ExitCode: 2}}
	if err := protocol.WriteMessage(&buf, in); err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(buf.Bytes(), []byte("\n")); n != 1 {
		t.Fatalf("%d newlines in one message", n)
	}
	var out protocol.Response
	if err := protocol.ReadMessage(bufio.NewReader(&buf), &out); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Exec.Stdout, in.Exec.Stdout) || out.Exec.ExitCode != 2 {
		t.Errorf("round trip: %+v", out.Exec)
	}
	// Unknown fields are refused: both sides ship together.
	if err := protocol.ReadMessage(bufio.NewReader(strings.NewReader(`{"op":"ping","x":1}`+"\n")), &protocol.Request{}); err == nil {
		t.Error("unknown field accepted")
	}
	// A truncated line is an error, EOF alone is io.EOF.
	if err := protocol.ReadMessage(bufio.NewReader(strings.NewReader(`{"op":"pi`)), &protocol.Request{}); err == nil {
		t.Error("truncated message accepted")
	}
	if err := protocol.ReadMessage(bufio.NewReader(strings.NewReader("")), &protocol.Request{}); err != io.EOF {
		t.Errorf("empty stream: %v", err)
	}
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

// TestReadySignal: the agent writes protocol.ReadyByte to its ready
// descriptor and closes it once it listens; ReadyFromEnv takes the
// descriptor from the environment and removes the variable.
func TestReadySignal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fd, err := syscall.Dup(int(w.Fd())) // owned by ReadyFromEnv from now on
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(protocol.ReadyFDEnv, strconv.Itoa(fd))
	ready := ReadyFromEnv()
	if ready == nil {
		t.Fatal("ReadyFromEnv: nil")
	}
	if _, ok := os.LookupEnv(protocol.ReadyFDEnv); ok {
		t.Fatalf("%s is still set", protocol.ReadyFDEnv)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "guest.sock")
	a := New(Config{
		SocketPath: sock,
		CgroupRoot: filepath.Join(dir, "no-cgroup"),
		DiskPath:   dir,
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		Ready:      ready,
	})
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() { _ = a.Run(ctx); close(finished) }()
	defer func() { cancel(); <-finished }()
	_ = r.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(r) // EOF: the agent closed it (w was its only copy)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != string(rune(protocol.ReadyByte)) {
		t.Fatalf("ready pipe: %q", b)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("signalled ready before listening: %v", err)
	}
	if resp := do(t, sock, protocol.Request{Op: protocol.OpPing}); !resp.OK {
		t.Fatalf("ping: %+v", resp)
	}
	t.Setenv(protocol.ReadyFDEnv, "x")
	if ReadyFromEnv() != nil {
		t.Fatal("ReadyFromEnv accepted a bad descriptor")
	}
}
