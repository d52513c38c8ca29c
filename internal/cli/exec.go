package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// Exit codes of "workspace exec" once the process started.
const (
	// ExitSignalBase plus N: the process was killed by signal N.
	ExitSignalBase = 128
	// ExitStreamLost: the process started, then its event stream was lost
	// before its exit was seen.
	ExitStreamLost = 255
)

// remoteExit ends kibo with a process's status, without printing an error.
type remoteExit struct{ code int }

func (e *remoteExit) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// execStatus is what --status-file holds: one of its fields.
type execStatus struct {
	ExitCode *int32 `json:"exit_code,omitempty"`
	Signal   *int32 `json:"signal,omitempty"`
	Error    string `json:"error,omitempty"`
}

func (a *app) workspaceExec() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "exec WORKSPACE_ID [flags] -- CMD [ARGS...]",
		Short: "Run a command in a Workspace",
		Long: `Run a command in an AVAILABLE Workspace through the public data plane
(ProcessService): kibo creates a data-plane session with the exec scope
(CreateDataPlaneSession, --ttl), starts CMD with ARGS, copies its stdin to the
process (then closes the process's input at end of file) and the process's
stdout and stderr to its own, and exits with the process's status.

Exit codes: before the process started, kibo's own (14 when the server does
not offer workspace.exec, 9 for a Workspace that is not AVAILABLE, 5 for an
unknown one, ...); once it started, its exit code, 128+N when signal N killed
it, 255 when its event stream was lost before its exit was seen, 130 when
kibo was interrupted (SIGINT, SIGTERM): the process is then killed.
--status-file F also writes the outcome as JSON: {"exit_code":N},
{"signal":N} or {"error":"..."}. The session is renewed when it expires while
the process runs; --timeout bounds the start only. Standard input is
streamed with flow control: a process that does not read holds kibo back.`,
		Example:     "  kibo workspace exec ws-0123456789abcdefghij -- sh -c 'echo hello from $(hostname)'",
		Annotations: map[string]string{annotationNoName: "exec prints the process's output, not objects"},
	})
	cmd.Args = cobra.MinimumNArgs(2)
	var (
		ttl        time.Duration
		statusFile string
	)
	cmd.Flags().DurationVar(&ttl, "ttl", time.Minute, "lifetime of the session kibo creates, 10s to 24h (renewed while the process runs)")
	cmd.Flags().StringVar(&statusFile, "status-file", "", "write the outcome as JSON to this file")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		if dash := cmd.ArgsLenAtDash(); dash != 1 {
			return usagef("want WORKSPACE_ID -- CMD [ARGS...]")
		}
		x := &execRun{a: a, cmd: cmd, ws: args[0], argv: args[1:], ttl: ttl}
		code, err := x.run(ctx, cmd.Context())
		st := execStatus{}
		switch {
		case err != nil:
			st.Error = describe(err)
		case code >= ExitSignalBase && code < ExitStreamLost && x.signal != 0:
			st.Signal = &x.signal
		case x.lost != nil:
			st.Error = describe(x.lost)
		default:
			c := int32(code)
			st.ExitCode = &c
		}
		if statusFile != "" {
			b, _ := json.Marshal(st)
			if werr := os.WriteFile(statusFile, append(b, '\n'), 0o644); werr != nil && err == nil {
				fmt.Fprintf(a.stderr, "error: --status-file: %v\n", werr)
			}
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

// execRun is one run of "workspace exec" (and "workspace shell"), on the
// SDK's Cmd.
type execRun struct {
	a    *app
	cmd  *cobra.Command
	ws   string
	argv []string
	ttl  time.Duration
	// terminal, when set, runs the process on a terminal of this size.
	terminal *kibotos.TerminalSize
	// onStart, when set, is called once the process started (ctx ends
	// with the run).
	onStart func(ctx context.Context, c *kibotos.Cmd)

	signal int32 // the killing signal, when one killed it
	lost   error // why the event stream was lost
}

// report prints why the run ended without the process's exit.
func (x *execRun) report() {
	switch {
	case x.lost == nil:
	case x.signal == 0 && errors.Is(x.lost, errInterrupted):
		fmt.Fprintln(x.a.stderr, "error: "+x.lost.Error())
	default:
		fmt.Fprintln(x.a.stderr, "error: the process's event stream was lost: "+describe(x.lost))
	}
}

// errInterrupted: kibo was interrupted while the process ran.
var errInterrupted = errors.New("kibo was interrupted: the process was killed")

// ExitInterrupted: kibo was interrupted (SIGINT, SIGTERM) while the
// process ran; the process was killed.
const ExitInterrupted = 130

// run starts the process (bounded by setup's deadline, --timeout) and
// follows it until its exit or life's end (then the process is killed);
// it returns the exit code, or an error before the start.
func (x *execRun) run(setup, life context.Context) (int, error) {
	s, err := x.a.connect(setup, x.cmd, nil, ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure)
	if err != nil {
		return 0, err
	}
	// The data plane is served on ctrl's listener: kibo reaches it through
	// its own endpoint and trust (a certificate is not needed there).
	c := s.client.Workspaces().Handle(x.ws).ExecCommand(life, x.argv[0], x.argv[1:]...)
	c.Stdin, c.Stdout, c.Stderr = x.a.stdin, x.a.stdout, x.a.stderr
	c.SessionTTL, c.Terminal = x.ttl, x.terminal
	if dl, ok := setup.Deadline(); ok {
		c.StartTimeout = max(time.Until(dl), time.Millisecond)
	}
	if err := c.Start(); err != nil {
		if cause := context.Cause(setup); cause != nil && setup.Err() != nil {
			return 0, fmt.Errorf("%w: %w", cause, err)
		}
		return 0, err
	}
	if x.onStart != nil {
		x.onStart(life, c)
	}
	err = c.Wait()
	var (
		exit    *kibotos.ExitError
		lost    *kibotos.StreamLostError
		dropped *kibotos.OutputDroppedError
	)
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit):
		if sig := exit.Exited.GetSignal(); sig != 0 {
			x.signal = sig
			return ExitSignalBase + int(sig), nil
		}
		return exit.ExitCode(), nil
	case errors.As(err, &dropped):
		fmt.Fprintf(x.a.stderr, "warning: %d bytes of the process's output were lost before kibo read them\n", dropped.Bytes)
		return 0, nil
	case errors.As(err, &lost):
		x.lost = lost.Err
		return ExitStreamLost, nil
	case life.Err() != nil:
		x.lost = errInterrupted
		return ExitInterrupted, nil
	default:
		x.lost = err
		return ExitStreamLost, nil
	}
}
