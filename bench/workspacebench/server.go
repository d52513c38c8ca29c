//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/pki"
)

// buildBinaries builds cmd/kibotos-ctrl and cmd/kibotos-guest of the module
// in modRoot into dir, statically (the guest must run in any template; ctrl
// is built the same way as the brief's reference command).
func buildBinaries(ctx context.Context, modRoot, dir string) (ctrlBin, guestBin string, err error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "./cmd/kibotos-ctrl", "./cmd/kibotos-guest")
	cmd.Dir = modRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("go build ./cmd/kibotos-ctrl ./cmd/kibotos-guest: %w\n%s", err, out.String())
	}
	return filepath.Join(dir, "kibotos-ctrl"), filepath.Join(dir, "kibotos-guest"), nil
}

// server is a running kibotos-ctrl --dev subprocess (with its embedded node
// agent).
type server struct {
	cmd        *exec.Cmd
	done       chan struct{} // closed when the process has exited
	waitErr    error
	URL        string
	MetricsURL string
	PKI        pki.DevPaths
	DataDir    string
	logPath    string
}

// startServer starts bin --dev --data-dir dataDir on a free loopback port,
// with a Prometheus listener on another, and waits until GetServerInfo
// answers over mutual TLS.
func startServer(ctx context.Context, bin, guest, dataDir, logPath string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	mport, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	maddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
	args := []string{"--dev", "--data-dir", dataDir, "--listen", addr, "--metrics-listen", maddr, "--guest-binary", guest}
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer lf.Close() // the child keeps its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// Its own process group: a Ctrl-C of the benchmark must not reach it,
	// the benchmark deletes its workspaces through the API first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start kibotos-ctrl: %w", err)
	}
	s := &server{cmd: cmd, done: make(chan struct{}), URL: "https://" + addr, MetricsURL: "http://" + maddr + "/metrics",
		PKI: pki.DevPathsIn(dataDir), DataDir: dataDir, logPath: logPath}
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

func (s *server) pid() int { return s.cmd.Process.Pid }

func (s *server) alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
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
		_, err = ctrlv1connect.NewServerInfoServiceClient(hc, s.URL).GetServerInfo(c, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		cancel()
		tr.CloseIdleConnections()
		if err != nil {
			lastErr = err
			continue
		}
		return nil
	}
	return fmt.Errorf("kibotos-ctrl not ready after %v: %v", timeout, lastErr)
}

// stop sends SIGTERM and waits for the process to exit (SIGKILL after 20s).
// Executions are not children of the server and outlive it: delete the
// workspaces first (or sandbox.Cleanup the node's state directory after).
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

// metrics scrapes the server's Prometheus endpoint and returns the samples
// without labels (name → value).
func (s *server) metrics(ctx context.Context) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.MetricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || l[0] == '#' || strings.ContainsRune(l, '{') {
			continue
		}
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			out[f[0]] = v
		}
	}
	return out, nil
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
