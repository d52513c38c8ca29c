package cli

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/guest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

func TestParsePortSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want portSpec
		ok   bool
	}{
		{"8080:80", portSpec{8080, 80}, true},
		{"5432", portSpec{5432, 5432}, true},
		{":9000", portSpec{0, 9000}, true},
		{"0:9000", portSpec{0, 9000}, true},
		{"0", portSpec{}, false},
		{"8080:0", portSpec{}, false},
		{"65536", portSpec{}, false},
		{"a:80", portSpec{}, false},
		{"80:", portSpec{}, false},
		{"-1:80", portSpec{}, false},
	} {
		got, err := parsePortSpec(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parsePortSpec(%q) = %v, %v", tc.in, got, err)
		}
	}
}

// lockedBuffer is a buffer written by kibo and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestPortForwardCommand: "workspace port-forward" against a ctrl whose
// node's guests serve the guest's PortService (dialing this test's
// loopback): two forwards (a free local port each), a connection echoed
// with its half-close, a port nothing listens on reported on stderr while
// kibo goes on, exit 0 when interrupted; refusals before it listens.
func TestPortForwardCommand(t *testing.T) {
	t.Parallel()
	rt := agenttest.New()
	path, h := guestv1connect.NewPortServiceHandler(guest.NewPortService())
	rt.GuestServices = map[string]http.Handler{path: h}
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt})
	c := conn(e)
	waitWorkspaceServed(t, c)
	id := strings.TrimSpace(kibo(t, args(c, "workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "-q", "--wait")...).want(t, ExitOK).stdout)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	echo := l.Addr().(*net.TCPAddr).Port
	free, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := free.Addr().(*net.TCPAddr).Port
	free.Close()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, testEnv(t), args(c, "workspace", "port-forward", id, ":"+strconv.Itoa(echo), ":"+strconv.Itoa(dead)), strings.NewReader(""), &stdout, &stderr)
	}()
	re := regexp.MustCompile(`(?m)^Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)$`)
	local := map[int]int{}
	deadline := time.Now().Add(20 * time.Second)
	for len(local) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no Forwarding lines: stdout %q, stderr %q", stdout.String(), stderr.String())
		}
		for _, m := range re.FindAllStringSubmatch(stdout.String(), -1) {
			lp, _ := strconv.Atoi(m[1])
			rp, _ := strconv.Atoi(m[2])
			local[rp] = lp
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Echo with the half-close, on two connections at once.
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(local[echo]))
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			msg := strings.Repeat("hello "+strconv.Itoa(i)+"\n", 10000)
			go func() {
				_, _ = io.WriteString(conn, msg)
				_ = conn.(*net.TCPConn).CloseWrite()
			}()
			got, err := io.ReadAll(bufio.NewReader(conn))
			if err != nil || string(got) != msg {
				t.Errorf("echoed %d of %d bytes: %v", len(got), len(msg), err)
			}
		}()
	}
	wg.Wait()

	// Nothing listens: the connection closes, an error on stderr.
	nc, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(local[dead]))
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := nc.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("a connection to a port nothing listens on read %d, %v", n, err)
	}
	nc.Close()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && !strings.Contains(stderr.String(), "nothing listens"); {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), "nothing listens on port "+strconv.Itoa(dead)) {
		t.Errorf("stderr %q does not say nothing listens", stderr.String())
	}

	cancel()
	select {
	case code := <-done:
		if code != ExitOK {
			t.Errorf("exit code %d after the interrupt; stderr %q", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kibo still runs 10s after the interrupt")
	}

	// Refusals before it listens.
	busy := strconv.Itoa(l.Addr().(*net.TCPAddr).Port) // the echo server's
	kibo(t, args(c, "workspace", "port-forward", id, busy+":80")...).want(t, ExitLocal)
	kibo(t, args(c, "workspace", "port-forward", id, "0")...).want(t, ExitUsage)
	kibo(t, args(c, "workspace", "port-forward", id)...).want(t, ExitUsage)
	bare := ctrltest.New(t, ctrltest.Options{})
	kibo(t, args(conn(bare), "workspace", "port-forward", id, "80")...).want(t, ExitUnavailable)
}
