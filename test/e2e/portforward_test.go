package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// startPortForward starts "kibo workspace port-forward ID SPEC..." and
// returns it with the local ports it printed, by remote port.
func startPortForward(t *testing.T, e *dpEnv, specs ...string) (*exec.Cmd, *syncBuffer, map[string]string) {
	t.Helper()
	cmd := e.kibo(append([]string{"workspace", "port-forward", e.id}, specs...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	re := regexp.MustCompile(`^Forwarding from (127\.0\.0\.1:\d+) -> (\d+)$`)
	ports := map[string]string{}
	lines := bufio.NewScanner(out)
	got := make(chan struct{})
	go func() {
		defer close(got)
		for len(ports) < len(specs) && lines.Scan() {
			if m := re.FindStringSubmatch(lines.Text()); m != nil {
				ports[m[2]] = m[1]
			} else {
				t.Errorf("unexpected line %q", lines.Text())
			}
		}
	}()
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		t.Fatalf("kibo printed no Forwarding lines in 30s; stderr %q", stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return cmd, stderr, ports
}

// echoThrough sends data to addr, closes its writing half and reads the
// answer to its end.
func echoThrough(addr string, data []byte) ([]byte, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(120 * time.Second))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		return got, err
	}
	return got, <-werr
}

// TestPortForwardThroughKibo: a real workspace runs busybox's nc as a
// persistent echo server (-ll -e cat) on port 8080 of its loopback; "kibo
// workspace port-forward" carries the test's connections to it: a line,
// then 10 MiB with the same SHA-256 (the throughput is logged), two
// connections at once; a port nothing listens on closes the connection
// and says so on stderr, also the port of a listener on the host's
// loopback (the workspace's loopback is its own); SIGINT ends kibo with 0.
func TestPortForwardThroughKibo(t *testing.T) {
	e := newDPEnv(t, "e2e-portforward")
	tok := e.token()
	ctx := t.Context()
	if _, err := e.proc.StartProcess(ctx, bearer(&ctrlv1.StartProcessRequest{WorkspaceId: e.id,
		Argv: []string{"nc", "-ll", "-p", "8080", "-e", "cat"}, Tag: "echo-server"}, tok)); err != nil {
		t.Fatal(err)
	}
	// A listener on the host's loopback: the workspace has a network
	// namespace of its own, so a forward must never reach it.
	hostL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostL.Close()
	go func() {
		for {
			c, err := hostL.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("host"))
			c.Close()
		}
	}()
	hostPort := strconv.Itoa(hostL.Addr().(*net.TCPAddr).Port)
	cmd, stderr, ports := startPortForward(t, e, ":8080", ":9", ":"+hostPort)
	addr := ports["8080"]

	// The server may not listen yet: a connection closed with nothing is
	// tried again.
	var got []byte
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, err = echoThrough(addr, []byte("hello\n"))
		if err == nil && string(got) == "hello\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("echo through the forward: %q, %v; kibo stderr %q", got, err, stderr.String())
		}
	}

	// A new connection each time: connect, one line there and back, close.
	var rtts []time.Duration
	for range 20 {
		start := time.Now()
		got, err := echoThrough(addr, []byte("ping\n"))
		if err != nil || string(got) != "ping\n" {
			t.Fatalf("ping: %q, %v", got, err)
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	t.Logf("a new forwarded connection with one line echoed: p50 %v, max %v (20 runs)", rtts[len(rtts)/2].Round(10*time.Microsecond), rtts[len(rtts)-1].Round(10*time.Microsecond))

	data := make([]byte, 10<<20)
	_, _ = rand.Read(data)
	start := time.Now()
	got, err = echoThrough(addr, data)
	took := time.Since(start)
	want := sha256.Sum256(data)
	gotSum := sha256.Sum256(got)
	if err != nil || len(got) != len(data) || gotSum != want {
		t.Fatalf("10 MiB echoed: %d bytes, same SHA-256 %v, %v; kibo stderr %q", len(got), gotSum == want, err, stderr.String())
	}
	t.Logf("10 MiB up and echoed back through kibo port-forward in %v (%.1f MiB/s each way)", took.Round(time.Millisecond), 10/took.Seconds())

	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			msg := bytes.Repeat([]byte{byte('a' + i)}, 256<<10)
			got, err := echoThrough(addr, msg)
			if err == nil && !bytes.Equal(got, msg) {
				err = errors.New("echoed other bytes")
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent connection: %v", err)
		}
	}

	// Port 9: nothing listens in the workspace.
	if got, err := echoThrough(ports["9"], []byte("x")); len(got) != 0 {
		t.Errorf("port 9 answered %q, %v", got, err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stderr.String(), "nothing listens on port 9"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("kibo stderr %q does not say nothing listens on port 9", stderr.String())
			break
		}
	}

	// The host's listener is not reached: inside the workspace nothing
	// listens on that port.
	if got, err := echoThrough(ports[hostPort], []byte("x")); len(got) != 0 {
		t.Errorf("a forward to port %s reached the host's loopback: %q, %v", hostPort, got, err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stderr.String(), "nothing listens on port "+hostPort); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("kibo stderr %q does not say nothing listens on port %s", stderr.String(), hostPort)
			break
		}
	}

	_ = cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("kibo port-forward after SIGINT: %v; stderr %q", err, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("kibo port-forward still runs 15s after SIGINT")
	}

}
