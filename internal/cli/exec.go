package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
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

// execInputChunk is the largest SendInput kibo sends (the input buffer of
// a process is 64 KiB).
const execInputChunk = 32 << 10

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
it, 255 when its event stream was lost before its exit was seen.
--status-file F also writes the outcome as JSON: {"exit_code":N},
{"signal":N} or {"error":"..."}. The session is renewed when it expires while
the process runs; --timeout bounds the start only.`,
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
		case code == ExitStreamLost && x.lost != nil:
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
		if x.lost != nil {
			fmt.Fprintln(a.stderr, "error: the process's event stream was lost: "+describe(x.lost))
		}
		if code != 0 {
			return &remoteExit{code: code}
		}
		return nil
	})
	return procedure(cmd, ctrlv1connect.ProcessServiceStartProcessProcedure)
}

// execRun is one run of "workspace exec".
type execRun struct {
	a    *app
	cmd  *cobra.Command
	ws   string
	argv []string
	ttl  time.Duration
	// pty, when set, runs the process on a terminal of this size.
	pty *ctrlv1.ProcessPty
	// onStart, when set, is called once the process started, before its
	// input and output are copied.
	onStart func(ctx context.Context, id string)

	sess   *session
	proc   ctrlv1connect.ProcessServiceClient
	mu     sync.Mutex
	token  string
	expiry time.Time

	signal int32 // the killing signal, when one killed it
	lost   error // why the event stream was lost
}

// newToken creates a session (a write, with its own command ID).
func (x *execRun) newToken(ctx context.Context) error {
	req := &ctrlv1.CreateDataPlaneSessionRequest{Metadata: &ctrlv1.CommandMetadata{CommandId: kibotos.NewCommandID()},
		WorkspaceId: x.ws, Scopes: []ctrlv1.DataPlaneScope{ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC}, Ttl: durationpb.New(x.ttl)}
	res, err := x.sess.client.SessionService.CreateDataPlaneSession(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	x.mu.Lock()
	x.token, x.expiry = res.Msg.GetSession().GetToken(), res.Msg.GetSession().GetExpireTime().AsTime()
	x.mu.Unlock()
	return nil
}

func (x *execRun) auth(r interface{ Header() http.Header }) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r.Header().Set("Authorization", "Bearer "+x.token)
}

// expired: the token's expiry passed (then a SESSION_EXPIRED is renewed).
func (x *execRun) expired() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return !time.Now().Before(x.expiry)
}

// run starts the process (under setup, bounded by --timeout) and follows
// it (under life); it returns the exit code, or an error before the start.
func (x *execRun) run(setup, life context.Context) (int, error) {
	s, err := x.a.connect(setup, x.cmd, nil, ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure)
	if err != nil {
		return 0, err
	}
	x.sess = s
	// The data plane is served on ctrl's listener: kibo reaches it through
	// its own endpoint and trust (a certificate is not needed there).
	x.proc = s.client.ProcessService
	if err := x.newToken(setup); err != nil {
		return 0, err
	}
	sr := connect.NewRequest(&ctrlv1.StartProcessRequest{WorkspaceId: x.ws, Argv: x.argv, Pty: x.pty})
	x.auth(sr)
	st, err := x.proc.StartProcess(setup, sr)
	if err != nil {
		return 0, err
	}
	id := st.Msg.GetProcessId()
	life, stop := context.WithCancel(life)
	defer stop()
	if x.onStart != nil {
		x.onStart(life, id)
	}
	go x.pumpInput(life, id)
	return x.follow(life, id), nil
}

// pumpInput copies kibo's stdin to the process, then closes its input.
func (x *execRun) pumpInput(ctx context.Context, id string) {
	var off uint64
	buf := make([]byte, execInputChunk)
	for ctx.Err() == nil {
		n, rerr := x.a.stdin.Read(buf)
		data := buf[:n]
		for len(data) > 0 && ctx.Err() == nil {
			r := connect.NewRequest(&ctrlv1.SendInputRequest{WorkspaceId: x.ws, ProcessId: id, Offset: off, Data: data})
			x.auth(r)
			res, err := x.proc.SendInput(ctx, r)
			var took uint64
			switch {
			case err == nil:
				took = res.Msg.GetAcceptedBytes()
			case connect.CodeOf(err) == connect.CodeResourceExhausted:
				if d, ok := kibotos.Detail(err); ok {
					took = d.GetAcceptedBytes()
				}
				time.Sleep(20 * time.Millisecond)
			case kibotos.Reason(err) == ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED && x.expired():
				if x.newToken(ctx) != nil {
					return
				}
				continue
			default:
				return // the process ended or cannot be reached: its events say which
			}
			off += took
			data = data[took:]
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				r := connect.NewRequest(&ctrlv1.CloseInputRequest{WorkspaceId: x.ws, ProcessId: id})
				x.auth(r)
				_, _ = x.proc.CloseInput(ctx, r)
			}
			return
		}
	}
}

// follow copies the process's output until its exit and returns its exit
// code (255 when the stream is lost).
func (x *execRun) follow(ctx context.Context, id string) int {
	var off uint64
	for {
		r := connect.NewRequest(&ctrlv1.ProcessEventsRequest{WorkspaceId: x.ws, ProcessId: id, FromOffset: off})
		x.auth(r)
		s, err := x.proc.ProcessEvents(ctx, r)
		if err == nil {
			for s.Receive() {
				ev := s.Msg()
				if o := ev.GetOutput(); o != nil {
					w := x.a.stdout
					if o.GetStream() == ctrlv1.ProcessStream_PROCESS_STREAM_STDERR {
						w = x.a.stderr
					}
					_, _ = w.Write(o.GetData())
					off = o.GetOffset() + uint64(len(o.GetData()))
				}
				if d := ev.GetDropped(); d != nil {
					off = d.GetOffset() + d.GetBytes()
				}
				if e := ev.GetExited(); e != nil {
					s.Close()
					if e.GetSignal() != 0 {
						x.signal = e.GetSignal()
						return ExitSignalBase + int(e.GetSignal())
					}
					return int(e.GetExitCode())
				}
			}
			err = s.Err()
			s.Close()
			if err == nil {
				err = errors.New("the stream ended before the process's exit")
			}
		}
		if kibotos.Reason(err) == ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED && x.expired() && x.newToken(ctx) == nil {
			continue // resume from off with a new session
		}
		x.lost = err
		return ExitStreamLost
	}
}
