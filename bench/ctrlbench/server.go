package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/pki"
)

// buildServer builds cmd/kibotos-ctrl of the module in modRoot into dir, or
// with profiling its wrapper bench/ctrlprof.
func buildServer(ctx context.Context, modRoot, dir string, profiling bool) (string, error) {
	bin := filepath.Join(dir, "kibotos-ctrl")
	pkg := "./cmd/kibotos-ctrl"
	if profiling {
		pkg = "./bench/ctrlprof"
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = modRoot
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out.String())
	}
	return bin, nil
}

// server is a running kibotos-ctrl subprocess.
type server struct {
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	waitErr error
	URL     string
	PKI     pki.DevPaths
	logPath string
	// Revision is the source revision the server reports.
	Revision string
}

// startServer starts bin --dev --data-dir dataDir on a free loopback port
// (with --store storeSpec when not empty) and waits until GetServerInfo
// answers over mutual TLS. A non-empty profile is passed to the bench/ctrlprof
// wrapper as the file of its CPU profile.
func startServer(ctx context.Context, bin, dataDir, storeSpec, logPath, profile string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := []string{"--dev", "--data-dir", dataDir, "--listen", addr}
	if storeSpec != "" {
		args = append(args, "--store", storeSpec)
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child keeps its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if profile != "" {
		cmd.Env = append(os.Environ(), "CTRLBENCH_CPUPROFILE="+profile)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start kibotos-ctrl: %w", err)
	}
	s := &server{cmd: cmd, done: make(chan struct{}), URL: "https://" + addr, PKI: pki.DevPathsIn(dataDir), logPath: logPath}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()
	if err := s.waitReady(ctx, 60*time.Second); err != nil {
		s.stop()
		return nil, fmt.Errorf("%w\n--- server log %s (tail) ---\n%s", err, logPath, tail(logPath, 3000))
	}
	return s, nil
}

func (s *server) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("kibotos-ctrl exited during start-up: %v", s.waitErr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if _, err := os.Stat(s.PKI.OperatorKey); err != nil {
			lastErr = err
			continue
		}
		hc, tr, err := newHTTPClient(s.PKI)
		if err != nil {
			lastErr = err
			continue
		}
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := ctrlv1connect.NewServerInfoServiceClient(hc, s.URL).GetServerInfo(c, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		cancel()
		tr.CloseIdleConnections()
		if err != nil {
			lastErr = err
			continue
		}
		s.Revision = resp.Msg.GetSourceRevision()
		return nil
	}
	return fmt.Errorf("kibotos-ctrl not ready after %v: %v", timeout, lastErr)
}

// stop sends SIGTERM and waits for the process to exit (SIGKILL after 20s).
func (s *server) stop() error {
	select {
	case <-s.done:
		return s.exitErr()
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		return s.exitErr()
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		return errors.New("kibotos-ctrl did not stop within 20s of SIGTERM; killed")
	}
}

func (s *server) exitErr() error {
	if s.waitErr != nil {
		return fmt.Errorf("kibotos-ctrl exited: %w (log: %s)", s.waitErr, s.logPath)
	}
	return nil
}

// newHTTPClient returns an HTTP/2-only client presenting the operator
// certificate of the development PKI p.
func newHTTPClient(p pki.DevPaths) (*http.Client, *http2.Transport, error) {
	tlsc, err := pki.ClientConfig(p.CA, p.Operator, p.OperatorKey)
	if err != nil {
		return nil, nil, err
	}
	tr := &http2.Transport{TLSClientConfig: tlsc}
	return &http.Client{Transport: tr}, tr, nil
}

// egressClients hands out EgressService clients to workers: either one
// shared client (one HTTP/2 connection, multiplexed), or one client with its
// own connection per worker.
type egressClients struct {
	shared     ctrlv1connect.EgressServiceClient
	perWorker  []ctrlv1connect.EgressServiceClient
	transports []*http2.Transport
}

func newEgressClients(s *server, workers int, perWorker bool) (*egressClients, error) {
	ec := &egressClients{}
	n := 1
	if perWorker {
		n = workers
	}
	for range n {
		hc, tr, err := newHTTPClient(s.PKI)
		if err != nil {
			ec.close()
			return nil, err
		}
		ec.transports = append(ec.transports, tr)
		c := ctrlv1connect.NewEgressServiceClient(hc, s.URL)
		if perWorker {
			ec.perWorker = append(ec.perWorker, c)
		} else {
			ec.shared = c
		}
	}
	return ec, nil
}

func (ec *egressClients) get(w int) ctrlv1connect.EgressServiceClient {
	if ec.perWorker != nil {
		return ec.perWorker[w]
	}
	return ec.shared
}

func (ec *egressClients) close() {
	for _, t := range ec.transports {
		t.CloseIdleConnections()
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the last n bytes of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
