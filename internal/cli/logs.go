package cli

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func (a *app) workspaceLogs() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "logs WORKSPACE_ID [-f] [--tail BYTES] [flags]",
		Short: "Print a Workspace's guest and PID 1 output",
		Long: `Print the log of a Workspace (WorkspaceLogService): what its guest agent and
its PID 1 wrote to their stdout and stderr, as the Workspace's node captured
it. The node keeps at most 2 MiB (the current file, rotated at 1 MiB, and
the previous one) and at most 256 KiB a second; the processes started with
"kibo workspace exec" have their own output, which is not in it. A stopped
Workspace's last log is printed while its node keeps it (until the
Workspace is deleted).

--tail N starts N bytes before the end (0: everything kept). -f (--follow)
then prints what is written next, until kibo is interrupted (exit 0); kibo
renews its data-plane session (exec scope, --ttl) when it expires, and may
then miss what was written while it reconnected.

It needs the capability workspace.exec (14 without it).`,
		Example: `  kibo workspace logs ws-0123456789abcdefghij
  kibo workspace logs ws-0123456789abcdefghij --tail 4096`,
		Annotations: map[string]string{annotationNoName: "logs prints the Workspace's output, not objects"},
	})
	var (
		follow bool
		tail   uint64
		ttl    time.Duration
	)
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "print what is written next, until interrupted")
	cmd.Flags().Uint64Var(&tail, "tail", 0, "start this many bytes before the end (0: everything kept)")
	cmd.Flags().DurationVar(&ttl, "ttl", 10*time.Minute, "lifetime of the session kibo creates, 10s to 24h (renewed while following)")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		s, err := a.connect(ctx, cmd, nil, ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure)
		if err != nil {
			return err
		}
		if follow {
			// --timeout bounds the connecting only; a follower runs until
			// it is interrupted.
			ctx = cmd.Context()
		}
		return s.client.Workspaces().Handle(args[0]).ReadLog(ctx, a.stdout, kibotos.LogOptions{TailBytes: tail, Follow: follow, SessionTTL: ttl})
	})
	return procedure(cmd, ctrlv1connect.WorkspaceLogServiceReadWorkspaceLogProcedure)
}
