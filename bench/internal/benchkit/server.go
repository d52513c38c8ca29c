package benchkit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/pki"
)

// DevOptions start a DevServer.
type DevOptions struct {
	// Bin is the kibotos-ctrl binary (or a wrapper calling ctrl.Main).
	Bin string
	// DataDir is its --data-dir; LogPath receives its stdout and stderr.
	DataDir, LogPath string
	// Args are added after --dev --data-dir DIR --listen ADDR.
	Args []string
	// Env is added to this process's environment.
	Env []string
	// OwnGroup starts it in its own process group, so that a Ctrl-C of the
	// benchmark does not reach it.
	OwnGroup bool
	// Listen, when set, is the --listen address (a restart on the same
	// address); empty picks a free loopback port.
	Listen string
}

// DevServer is a running kibotos-ctrl --dev subprocess on a free loopback
// port.
type DevServer struct {
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	waitErr error

	URL     string
	PKI     pki.DevPaths
	DataDir string
	LogPath string
	// Revision is the source revision the server reports.
	Revision string
}

// StartDev starts the server and waits (up to a minute) until
// GetServerInfo answers over mutual TLS.
func StartDev(ctx context.Context, o DevOptions) (*DevServer, error) {
	addr := o.Listen
	if addr == "" {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	args := append([]string{"--dev", "--data-dir", o.DataDir, "--listen", addr}, o.Args...)
	logf, err := os.OpenFile(o.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child keeps its own descriptor
	cmd := exec.Command(o.Bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(o.Env) > 0 {
		cmd.Env = append(os.Environ(), o.Env...)
	}
	if o.OwnGroup {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start kibotos-ctrl: %w", err)
	}
	s := &DevServer{cmd: cmd, done: make(chan struct{}), URL: "https://" + addr,
		PKI: pki.DevPathsIn(o.DataDir), DataDir: o.DataDir, LogPath: o.LogPath}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()
	if err := s.waitReady(ctx, 60*time.Second); err != nil {
		_ = s.Stop()
		return nil, fmt.Errorf("%w\n--- server log %s (tail) ---\n%s", err, o.LogPath, Tail(o.LogPath, 3000))
	}
	return s, nil
}

// PID is the server's process ID.
func (s *DevServer) PID() int { return s.cmd.Process.Pid }

// Alive reports whether the process still runs.
func (s *DevServer) Alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func (s *DevServer) waitReady(ctx context.Context, timeout time.Duration) error {
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
		hc, tr, err := NewHTTPClient(s.PKI)
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

// Stop sends SIGTERM and waits for the process to exit (SIGKILL after
// 20s). Executions of an embedded node are not its children and outlive
// it: delete the workspaces first.
func (s *DevServer) Stop() error {
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

func (s *DevServer) exitErr() error {
	if s.waitErr != nil {
		return fmt.Errorf("kibotos-ctrl exited: %w (log: %s)", s.waitErr, s.LogPath)
	}
	return nil
}

// NewHTTPClient returns an HTTP/2-only client presenting the operator
// certificate of the development PKI p.
func NewHTTPClient(p pki.DevPaths) (*http.Client, *http2.Transport, error) {
	tlsc, err := pki.ClientConfig(p.CA, p.Operator, p.OperatorKey)
	if err != nil {
		return nil, nil, err
	}
	tr := &http2.Transport{TLSClientConfig: tlsc}
	return &http.Client{Transport: tr}, tr, nil
}

// FreePort returns a free TCP port on the loopback interface.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
