// Package e2e runs the real binaries.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/netattach"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/pki"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kibotos-e2e-bin")
	if err != nil {
		panic(err)
	}
	binDir = dir
	cmd := exec.Command("go", "build", "-buildvcs=true", "-o", dir+"/", "../../cmd/kibotos-ctrl", "../../cmd/kibotos-guest")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		panic("build: " + err.Error())
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type ctrlProc struct {
	cmd    *exec.Cmd
	url    string
	stderr *lockedBuffer
}

// ctrlWatchdog is how long a test may run after it started a kibotos-ctrl
// (startCtrl) before that ctrl is made to print every goroutine's stack
// (SIGQUIT, which also ends it) and the tail of its stderr is printed: a
// test that waits on it for ever then fails, with the ctrl's side of the
// wait in the log, instead of hanging until go test's timeout, whose dump
// shows only the test's side. The longest of these tests takes about 40 s.
const ctrlWatchdog = 8 * time.Minute

// watchdog arms ctrlWatchdog for p, started by t.
func (p *ctrlProc) watchdog(t *testing.T) {
	printed := make(chan struct{})
	timer := time.AfterFunc(ctrlWatchdog, func() {
		defer close(printed)
		fmt.Fprintf(os.Stderr, "e2e watchdog: %s still runs %v after it started kibotos-ctrl (pid %d); SIGQUIT to it\n",
			t.Name(), ctrlWatchdog, p.cmd.Process.Pid)
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		time.Sleep(3 * time.Second) // the dump is written
		out := p.stderr.String()
		if len(out) > 256<<10 {
			out = out[len(out)-256<<10:]
		}
		fmt.Fprintf(os.Stderr, "e2e watchdog: the end of kibotos-ctrl's stderr (pid %d, %s):\n%s\n", p.cmd.Process.Pid, t.Name(), out)
	})
	t.Cleanup(func() {
		if !timer.Stop() {
			<-printed // fired: the test ends after the dump is out
		}
	})
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// removeBackstop removes, when t ends (after the cleanups registered later,
// such as the kill of the node), the kernel backstop table of the node
// with state directory stateDir: a node leaves its table installed when it
// ends, and every test node has a state directory, and so a table, of its
// own.
func removeBackstop(t *testing.T, stateDir string) {
	t.Cleanup(func() {
		if err := netattach.BackstopOf(stateDir).Remove(); err != nil {
			t.Logf("remove the node's backstop: %v", err)
		}
	})
}

// startCtrl starts kibotos-ctrl --dev and waits for its "serving" line.
func startCtrl(t *testing.T, dataDir string, extra ...string) *ctrlProc {
	t.Helper()
	if !slices.Contains(extra, "--dev-no-node") {
		nodeRoot := filepath.Join(dataDir, "node")
		removeBackstop(t, nodeRoot)
		// After ctrl is killed (cleanups run last first): a workspace
		// outlives its node by design, and a test that leaves one running
		// must not leave its guest on the host.
		t.Cleanup(func() {
			if err := sandbox.Cleanup(nodeRoot); err != nil {
				t.Logf("sandbox.Cleanup: %v", err)
			}
		})
	}
	args := append([]string{"--dev", "--data-dir", dataDir, "--listen", "127.0.0.1:0"}, extra...)
	cmd := exec.Command(filepath.Join(binDir, "kibotos-ctrl"), args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &ctrlProc{cmd: cmd, stderr: &lockedBuffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p.watchdog(t)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "kibotos-ctrl is serving on "); ok {
				found <- rest
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case p.url = <-found:
	case <-time.After(30 * time.Second):
		t.Fatalf("kibotos-ctrl did not start; stderr:\n%s", p.stderr)
	}
	return p
}

func (p *ctrlProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("kibotos-ctrl exited with %v after SIGTERM; stderr:\n%s", err, p.stderr)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("kibotos-ctrl did not stop within 15s of SIGTERM")
	}
}

func operatorClient(t *testing.T, dataDir string) *http.Client {
	t.Helper()
	p := pki.DevPathsIn(dataDir)
	tlsc, err := pki.ClientConfig(p.CA, p.Operator, p.OperatorKey)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}, Timeout: 10 * time.Second}
}

// TestDevModeRestart starts the real binary in --dev mode, uses it, stops it
// with SIGTERM, starts it again on the same data directory and checks that
// the PKI was reused and the data kept.
func TestDevModeRestart(t *testing.T) {
	dataDir := t.TempDir()
	metrics := freePort(t)
	p := startCtrl(t, dataDir, "--metrics-listen", metrics, "--allow-endpoint-ranges", "127.0.0.0/8", "--dev-no-node")
	paths := pki.DevPathsIn(dataDir)
	for _, f := range []string{paths.CA, paths.Operator, paths.OperatorKey, paths.Server, paths.ServerKey} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("dev PKI file missing: %v", err)
		}
	}
	if want := filepath.Join(dataDir, "pki", "ca.pem"); paths.CA != want {
		t.Fatalf("CA path = %s, want %s", paths.CA, want)
	}
	before := readAll(t, paths)

	hc := operatorClient(t, dataDir)
	info, err := ctrlv1connect.NewServerInfoServiceClient(hc, p.url).GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if rev := info.Msg.GetSourceRevision(); rev == "" || rev == "unknown" {
		if head, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil && len(head) > 0 {
			t.Fatalf("source_revision = %q in a git checkout at %s", rev, head)
		}
	}
	eg := ctrlv1connect.NewEgressServiceClient(hc, p.url)
	cr, err := eg.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: "e2e-1"},
		Spec:     &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "127.0.0.1:11080"}}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), `kibotos_ctrl_requests_total{code="ok",procedure="/kibotos.ctrl.v1.EgressService/CreateEgress"} 1`) {
		t.Fatalf("metrics do not count the call:\n%.2000s", body)
	}
	p.stop(t)
	if !strings.Contains(p.stderr.String(), `"msg":"kibotos-ctrl stopped"`) {
		t.Fatalf("no clean-stop log line:\n%s", p.stderr)
	}

	p = startCtrl(t, dataDir, "--dev-no-node")
	if after := readAll(t, paths); !bytes.Equal(before, after) {
		t.Fatal("the second start changed the development PKI")
	}
	hc = operatorClient(t, dataDir)
	eg = ctrlv1connect.NewEgressServiceClient(hc, p.url)
	got, err := eg.GetEgress(t.Context(), connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: cr.Msg.GetEgress().GetEgressId()}))
	if err != nil || got.Msg.GetEgress().GetRevision() != 1 {
		t.Fatalf("egress after restart = %v, %v", got, err)
	}
	// The replay survives the restart too.
	again, err := eg.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: "e2e-1"},
		Spec:     &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "127.0.0.1:11080"}}},
	}))
	if err != nil || again.Msg.GetEgress().GetEgressId() != cr.Msg.GetEgress().GetEgressId() {
		t.Fatalf("replay after restart = %v, %v", again, err)
	}
	p.stop(t)
}

func readAll(t *testing.T, p pki.DevPaths) []byte {
	t.Helper()
	var b []byte
	for _, f := range []string{p.CA, p.CAKey, p.Operator, p.OperatorKey, p.Server, p.ServerKey} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, data...)
	}
	return b
}

// runAgent runs the in-process node agent a until t ends. Its end is
// waited for 30 s at most; then t fails with every goroutine's stack: an
// agent that does not end when told to is a bug to see, not a reason for
// the tests to hang until go test's timeout.
func runAgent(t *testing.T, a *agent.Agent) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			buf := make([]byte, 8<<20)
			t.Errorf("the node agent did not end within 30 s of its cancellation; goroutines:\n%s", buf[:runtime.Stack(buf, true)])
		}
	})
}
