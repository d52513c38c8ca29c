package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// portDialTimeout bounds the opening of one forwarded connection.
const portDialTimeout = 30 * time.Second

// portSpec is one LOCAL:REMOTE of "workspace port-forward".
type portSpec struct {
	local  int // 0: a free port
	remote int
}

// parsePortSpec parses LOCAL:REMOTE, REMOTE (the same local port) or
// :REMOTE (a free local port).
func parsePortSpec(s string) (portSpec, error) {
	port := func(v string, zero bool) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 65535 || (n == 0 && !zero) {
			return 0, usagef("%q: a port is a number from 1 to 65535", s)
		}
		return n, nil
	}
	l, r, found := strings.Cut(s, ":")
	if !found {
		n, err := port(s, false)
		return portSpec{local: n, remote: n}, err
	}
	rp, err := port(r, false)
	if err != nil {
		return portSpec{}, err
	}
	if l == "" {
		return portSpec{remote: rp}, nil
	}
	lp, err := port(l, true)
	return portSpec{local: lp, remote: rp}, err
}

func (a *app) workspacePortForward() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "port-forward WORKSPACE_ID LOCAL:REMOTE [LOCAL:REMOTE...] [flags]",
		Short: "Forward local ports to ports inside a Workspace",
		Long: `Forward local TCP ports to ports of an AVAILABLE Workspace's loopback through
the public data plane (PortForwardService), as "kubectl port-forward" does:
kibo listens on --address (127.0.0.1), and every connection it accepts on
LOCAL is carried to REMOTE inside the Workspace (127.0.0.1, else [::1]) over
one stream of its own, both ways, half-close included. REMOTE alone forwards
the same local port; :REMOTE picks a free local port. kibo prints
"Forwarding from ADDRESS:LOCAL -> REMOTE" for each, then runs until it is
interrupted (exit 0).

kibo creates a data-plane session with the exec scope (--ttl) before it
listens, and a new one once less than half of it is left; a connection ends
when the session it was opened with expires, so --ttl bounds the life of
one connection (at least half of it). A connection to a port nothing listens
on is closed at once, with an error on stderr; kibo goes on.

It needs HTTP/2 to ctrl, and the capability workspace.exec (14 without it).`,
		Example: `  kibo workspace port-forward ws-0123456789abcdefghij 8080:80
  kibo workspace port-forward ws-0123456789abcdefghij 5432 :9000`,
		Annotations: map[string]string{annotationNoName: "port-forward prints the forwarded ports, not objects"},
	})
	cmd.Args = cobra.MinimumNArgs(2)
	var (
		ttl     time.Duration
		address string
	)
	cmd.Flags().DurationVar(&ttl, "ttl", time.Hour, "lifetime of the sessions kibo creates, 10s to 24h (a connection lasts at most that long)")
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "the local address to listen on")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		var specs []portSpec
		for _, s := range args[1:] {
			p, err := parsePortSpec(s)
			if err != nil {
				return err
			}
			specs = append(specs, p)
		}
		s, err := a.connect(ctx, cmd, nil, ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure)
		if err != nil {
			return err
		}
		d := s.client.Workspaces().Handle(args[0]).PortDialer()
		d.SessionTTL = ttl
		if err := d.Prepare(ctx); err != nil {
			return err
		}
		var ls []net.Listener
		defer func() {
			for _, l := range ls {
				l.Close()
			}
		}()
		for _, p := range specs {
			l, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(p.local)))
			if err != nil {
				// %v: a local failure (exit 1), not a network one.
				return fmt.Errorf("listen for port %d: %v", p.remote, err)
			}
			ls = append(ls, l)
		}
		life := cmd.Context()
		var wg sync.WaitGroup
		for i, l := range ls {
			fmt.Fprintf(a.stdout, "Forwarding from %s -> %d\n", l.Addr(), specs[i].remote)
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.acceptPort(life, d, l, specs[i].remote)
			}()
		}
		<-life.Done()
		for _, l := range ls {
			l.Close()
		}
		wg.Wait()
		return nil
	})
	return procedure(cmd, ctrlv1connect.PortForwardServiceForwardPortProcedure)
}

// acceptPort serves l until it is closed or ctx ends: each connection is
// carried to remote over a stream of its own.
func (a *app) acceptPort(ctx context.Context, d *kibotos.PortDialer, l net.Listener, remote int) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := relayPort(ctx, d, c, remote); err != nil {
				portErrMu.Lock()
				fmt.Fprintf(a.stderr, "error: port %d: %s\n", remote, describe(err))
				portErrMu.Unlock()
			}
		}()
	}
}

// portErrMu orders the error lines of concurrent connections.
var portErrMu sync.Mutex

// closeWriter is a connection whose writing half closes alone.
type closeWriter interface{ CloseWrite() error }

// relayPort carries c to remote until both sides closed their halves,
// either fails, or ctx ends.
func relayPort(ctx context.Context, d *kibotos.PortDialer, c net.Conn, remote int) error {
	defer c.Close()
	dctx, cancel := context.WithTimeout(ctx, portDialTimeout)
	rc, err := d.DialPort(dctx, remote)
	cancel()
	if err != nil {
		return err
	}
	defer rc.Close()
	stop := context.AfterFunc(ctx, func() {
		c.Close()
		rc.Close()
	})
	defer stop()
	errc := make(chan error, 2)
	half := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if err == nil {
			if cw, ok := dst.(closeWriter); ok {
				err = cw.CloseWrite()
			}
		}
		errc <- err
	}
	go half(rc, c)
	go half(c, rc)
	for i := range 2 {
		if err := <-errc; err != nil {
			// One side failed: both end.
			c.Close()
			rc.Close()
			if i == 0 {
				<-errc
			}
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
	}
	return nil
}
