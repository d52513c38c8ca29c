package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kibotos/kibotos"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// shellDefault is the command of "workspace shell" without CMD: a login
// shell, which every Workspace image has.
var shellDefault = []string{"/bin/sh", "-l"}

func (a *app) workspaceShell() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "shell WORKSPACE_ID [flags] [-- CMD [ARGS...]]",
		Short: "Open an interactive terminal in a Workspace",
		Long: `Open an interactive terminal in an AVAILABLE Workspace: like "workspace
exec", through a data-plane session with the exec scope (--ttl, renewed while
the process runs), but the process (CMD with ARGS, default /bin/sh -l) runs
on a terminal of the local terminal's size. kibo puts its terminal in raw
mode (restored when kibo ends, also on SIGINT, SIGTERM and SIGHUP), sends
every key to the process (Ctrl-C too, as a byte: the remote terminal makes it
a signal), writes the terminal's output to stdout and follows the local
terminal's resizes (SIGWINCH).

Standard input must be a terminal: otherwise kibo exits 2 without sending
anything; use "kibo workspace exec" to run a command with redirected input.

Exit codes: those of "workspace exec" (before the start, kibo's own, 14 when
the server does not offer workspace.exec; then the process's exit code,
128+N when signal N killed it, 255 when its event stream was lost); 128+N
when kibo itself got signal N (SIGTERM, SIGHUP), after sending SIGHUP to the
remote process group. --timeout bounds the start only.`,
		Example: `  kibo workspace shell ws-0123456789abcdefghij
  kibo workspace shell ws-0123456789abcdefghij -- bash`,
		Annotations: map[string]string{annotationNoName: "shell is interactive, it prints no objects"},
	})
	cmd.Args = cobra.MinimumNArgs(1)
	var ttl time.Duration
	cmd.Flags().DurationVar(&ttl, "ttl", time.Minute, "lifetime of the session kibo creates, 10s to 24h (renewed while the process runs)")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		argv := shellDefault
		switch dash := cmd.ArgsLenAtDash(); {
		case dash == -1 && len(args) == 1:
		case dash == 1 && len(args) > 1:
			argv = args[1:]
		default:
			return usagef("want WORKSPACE_ID [-- CMD [ARGS...]]")
		}
		in, ok := a.stdin.(*os.File)
		if !ok || !term.IsTerminal(int(in.Fd())) {
			return usagef("standard input is not a terminal: use 'kibo workspace exec %s -- CMD [ARGS...]' to run a command without one", args[0])
		}
		fd := int(in.Fd())
		cols, rows, err := term.GetSize(fd)
		if err != nil || rows <= 0 || cols <= 0 {
			rows, cols = 24, 80
		}
		sh := &shellTerm{fd: fd}
		defer sh.restore()
		// Signals that would end kibo restore the terminal first.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		defer signal.Stop(sigs)
		ctx, cancelSetup := context.WithCancel(ctx)
		defer cancelSetup()
		life, cancel := context.WithCancel(cmd.Context())
		defer cancel()

		x := &execRun{a: a, cmd: cmd, ws: args[0], argv: argv, ttl: ttl,
			terminal: &kibotos.TerminalSize{Rows: uint16(min(rows, 1<<15)), Cols: uint16(min(cols, 1<<15))}}
		var (
			mu  sync.Mutex
			c   *kibotos.Cmd   // the process, once started
			got syscall.Signal // the signal that ends kibo
		)
		x.onStart = func(ctx context.Context, started *kibotos.Cmd) {
			mu.Lock()
			c = started
			mu.Unlock()
			if err := sh.raw(); err != nil {
				fmt.Fprintf(a.stderr, "warning: raw mode: %v\n", err)
			}
			go followResize(ctx, started, fd)
		}
		done := make(chan struct{})
		defer close(done)
		go func() {
			var s os.Signal
			select {
			case s = <-sigs:
			case <-done:
				return
			}
			sh.restore()
			mu.Lock()
			got = s.(syscall.Signal)
			started := c
			mu.Unlock()
			if started != nil {
				// As a terminal's hangup would.
				sctx, scancel := context.WithTimeout(context.WithoutCancel(life), 2*time.Second)
				_ = started.Signal(sctx, syscall.SIGHUP, true)
				scancel()
			}
			cancelSetup()
			cancel()
		}()
		code, err := x.run(ctx, life)
		sh.restore()
		mu.Lock()
		sig := got
		mu.Unlock()
		if sig != 0 {
			return &remoteExit{code: ExitSignalBase + int(sig)}
		}
		if err != nil {
			return err
		}
		x.report()
		if code != 0 {
			return &remoteExit{code: code}
		}
		return nil
	})
	return procedure(cmd, ctrlv1connect.ProcessServiceStartProcessProcedure)
}

// shellTerm is the local terminal of "workspace shell": raw while the
// process runs, restored once.
type shellTerm struct {
	fd    int
	mu    sync.Mutex
	state *term.State
}

func (t *shellTerm) raw() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, err := term.MakeRaw(t.fd)
	if err != nil {
		return err
	}
	t.state = st
	return nil
}

func (t *shellTerm) restore() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state != nil {
		_ = term.Restore(t.fd, t.state)
		t.state = nil
	}
}

// followResize sends the local terminal's size to the process at every
// SIGWINCH, until ctx ends.
func followResize(ctx context.Context, c *kibotos.Cmd, fd int) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-winch:
		}
		cols, rows, err := term.GetSize(fd)
		if err != nil || rows <= 0 || cols <= 0 {
			continue
		}
		_ = c.Resize(ctx, kibotos.TerminalSize{Rows: uint16(min(rows, 1<<15)), Cols: uint16(min(cols, 1<<15))})
	}
}
